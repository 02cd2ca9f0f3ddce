# Flower for a sciencebench cluster (built by compose/build.yml, run by
# compose/control-plane.yml).
#
# Like workers/Dockerfile it builds with no network: BASE_IMAGE is the
# Debian rootfs with python3 >= 3.12 and `inputs` the named build context
# with the wheelhouse (see that file and docs/deployment.md). It installs
# sciencebench with its `monitor` extra from uv.lock's pins, so Flower speaks
# the same Celery and kombu versions as the workers and can load
# `sciencebench.worker.app`.

ARG BASE_IMAGE

FROM ${BASE_IMAGE} AS build
COPY --from=inputs wheelhouse/ /wheelhouse/
RUN python3 -c 'import sys; assert sys.version_info >= (3, 12), "sciencebench needs Python >= 3.12, base has " + sys.version' \
    && python3 -m venv --without-pip /opt/sciencebench \
    && set -- /wheelhouse/pip-*.whl \
    && /opt/sciencebench/bin/python "$1/pip" install --quiet --no-cache-dir \
       --no-index --find-links /wheelhouse --only-binary :all: --require-hashes \
       -r /wheelhouse/monitor.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sciencebench ./sciencebench
RUN set -- /wheelhouse/pip-*.whl \
    && /opt/sciencebench/bin/python "$1/pip" install --quiet --no-cache-dir \
       --no-index --find-links /wheelhouse --no-deps /src

FROM ${BASE_IMAGE}
COPY --from=build /opt/sciencebench /opt/sciencebench
# A system user without a login; Flower's state (when persistent) lives in /data.
RUN echo 'flower:x:10001:10001:Flower:/data:/usr/sbin/nologin' >>/etc/passwd \
    && echo 'flower:x:10001:' >>/etc/group \
    && mkdir -p /data && chown 10001:10001 /data \
    && /opt/sciencebench/bin/celery --version

ENV PATH=/opt/sciencebench/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /data
EXPOSE 5555
CMD ["celery", "--app=sciencebench.worker.app", "flower", "--address=0.0.0.0", "--port=5555"]
