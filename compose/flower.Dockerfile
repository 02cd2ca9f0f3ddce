# Flower for a sciencebench cluster (built by compose/control-plane.yml).
#
# Build context: the repository root. Installs sciencebench with its
# `monitor` extra from uv.lock, so Flower speaks the same Celery and kombu
# versions as the workers and can load `sciencebench.worker.app`.
#
#   docker build -f compose/flower.Dockerfile -t sciencebench-flower:local .

ARG PYTHON_IMAGE=python:3.12-slim
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13

FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE}

COPY --from=uv /uv /usr/local/bin/uv

# The image's own Python 3.12 (uv must never download one); a venv outside
# the source tree; no uv cache left in the image.
ENV UV_PYTHON=/usr/local/bin/python3.12 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/sciencebench \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1

WORKDIR /src
# Dependencies first: this layer is reused while only sciencebench/ changes.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-install-project --no-editable --extra monitor
COPY sciencebench ./sciencebench
RUN uv sync --frozen --no-editable --extra monitor

WORKDIR /
RUN rm -rf /src \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin flower \
    && mkdir -p /data && chown flower:flower /data

ENV PATH=/opt/sciencebench/bin:$PATH \
    PYTHONUNBUFFERED=1
USER flower
WORKDIR /data
EXPOSE 5555
CMD ["celery", "--app=sciencebench.worker.app", "flower", "--address=0.0.0.0", "--port=5555"]
