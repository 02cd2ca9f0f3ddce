#!/usr/bin/env bash
# Build the images a sciencebench cluster runs, the air-gapped way
# (docs/deployment.md, "Building the images offline"), and publish them to the
# loopback registry that scripts/host-setup.sh started:
#
#   sciencebench/python   Debian 13 (trixie) minbase + python3 (3.13): the base
#                         of the worker and Flower images. Debian 12 ships
#                         Python 3.11 and Pier needs >= 3.12.
#   sciencebench/redis    Debian 12 minbase + redis-server (7.0): the broker
#                         image for compose/control-plane.yml (SCIENCEBENCH_REDIS_IMAGE)
#   sciencebench/mirror   the redis image's Debian 12 + Debian's docker-registry
#                         package (the Distribution registry 2.8), configured as a
#                         pull-through cache: compose/control-plane.yml's optional
#                         mirror (SCIENCEBENCH_MIRROR_IMAGE); one small layer
#   sciencebench/worker   workers/Dockerfile         } built by compose/build.yml
#   sciencebench/flower   compose/flower.Dockerfile  } with no network inside
#   sciencebench/proxy    workers/proxy/Dockerfile   } any build
#
# Only this script reaches out, and only to package registries, on the host:
# debootstrap to the Debian mirror, `pip download` to PyPI for the wheelhouse
# (every wheel uv.lock pins for the worker and monitor extras, hash-checked),
# `apt-get download docker-registry` when apt's cache no longer holds the .deb
# scripts/host-setup.sh installed.
# The docker CLI and compose plugin binaries come from the engine packages
# scripts/host-setup.sh already unpacked.
#
# Writes build/cluster/images.env (per checkout) with digest-pinned refs
# (SB_CLUSTER_*). Cached: rootfs tarballs, base images and the wheelhouse are
# kept in $SB_STATE/cluster keyed by their recipe and uv.lock; image builds use
# BuildKit's cache. A re-run with nothing changed takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

SB_STATE=${SB_STATE:-/var/tmp/sciencebench-host}
[[ -f $SB_STATE/env.sh && -f $SB_STATE/images.env ]] \
    || { echo "cluster-images: run scripts/host-setup.sh and scripts/fixture-images.sh first" >&2; exit 1; }
# shellcheck source=/dev/null
source "$SB_STATE/env.sh"
# shellcheck source=/dev/null
source "$SB_STATE/images.env"

MIRROR=${SB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
REG=$SCIENCEBENCH_TEST_REGISTRY
CACHE=$SB_STATE/cluster
OUT=$REPO/build/cluster
UV_HOME=${SCIENCEBENCH_UV_HOME:-$HOME/.cache/sciencebench-uv}

# Base rootfs recipes: suite, packages added to minbase, and `docker import`
# settings (Dockerfile instructions, one per line).
PYTHON_SUITE=trixie
PYTHON_PACKAGES=python3,ca-certificates
PYTHON_CHANGES='ENV LANG=C.UTF-8
CMD ["python3"]'
REDIS_SUITE=bookworm
REDIS_PACKAGES=redis-server
# As the official image: /data is the working directory (AOF lands there) and
# owned by the unprivileged redis user the server runs as.
REDIS_CHANGES='WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server"]'
# The mirror: the package's files over the redis base (Debian 12, the package's suite), its stock config
# (htpasswd auth, no proxy) replaced by a pull-through cache of Docker Hub. compose/control-plane.yml sets
# the upstream, address and storage again (REGISTRY_* variables), so any Distribution image serves there.
MIRROR_CONFIG='version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: /var/lib/registry
http:
  addr: :5000
proxy:
  remoteurl: https://registry-1.docker.io'
MIRROR_DOCKERFILE='ARG BASE
FROM $BASE
COPY rootfs/ /
COPY --chown=65534:65534 storage/ /var/lib/registry/
USER 65534:65534
WORKDIR /var/lib/registry
EXPOSE 5000
ENTRYPOINT ["/usr/bin/docker-registry", "serve"]
CMD ["/etc/docker/registry/config.yml"]'
# Wheelhouse extras: pip runs from its own wheel inside the build, and builds
# sciencebench with its backend (pyproject's build-system) from the wheelhouse.
PIP_PIN=pip==26.3
HATCHLING_PIN=hatchling==1.33.0

START=$SECONDS
log() { printf 'cluster-images: [%3ds] %s\n' $((SECONDS - START)) "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }
sha16() { sha256sum | cut -c1-16; }

# make_rootfs NAME SUITE PACKAGES TARBALL: debootstrap a minbase rootfs, strip
# what an image does not need, tar it. Logs to a file (runs in the background).
make_rootfs() {
    local name=$1 suite=$2 packages=$3 tarball=$4 dir=$CACHE/work-$1
    awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount -l
    rm -rf "$dir"
    debootstrap --variant=minbase --include="$packages" "$suite" "$dir" "$MIRROR"
    if [[ $name == redis ]]; then
        mkdir -p "$dir/data"
        chroot "$dir" chown redis:redis /data
    fi
    rm -rf "${dir:?}"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* \
        "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/info/* \
        "$dir"/usr/share/locale/* "${dir:?}"/dev/*
    find "$dir/var/log" -type f -delete
    rm -f "$dir/etc/resolv.conf" "$dir/etc/hostname"
    tar --numeric-owner -C "$dir" -c . >"$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
    rm -rf "$dir"
}

registry_has() { # REPO TAG
    curl -fs -o /dev/null -I \
        -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
        -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
        "http://$REG/v2/$1/manifests/$2"
}

# The digest-pinned ref of a pushed local image REPO:TAG.
pinned() { # REPO TAG
    docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$1:$2" \
        | grep -m1 "^$1@sha256:" || die "no registry digest for $1:$2"
}

declare -A TAR TAG CHANGES REF
base_keys() { # NAME SUITE PACKAGES CHANGES
    local key
    key=$(printf '%s\n' "$2" "$MIRROR" "$3" "$(declare -f make_rootfs)" | sha16)
    TAR[$1]=$CACHE/$1-$key.tar
    TAG[$1]=$(printf '%s\n' "$key" "$4" | sha16)
    CHANGES[$1]=$4
}

# Phase 1 (in parallel): the rootfs tarballs that are neither on disk nor
# needed (image already published), and the build inputs.
build_rootfs_bg() { # NAME SUITE PACKAGES
    if [[ -f ${TAR[$1]} ]] || registry_has "sciencebench/$1" "${TAG[$1]}"; then
        return
    fi
    log "$1: debootstrap $2 minbase + $3 (log: ${TAR[$1]%.tar}.log)"
    make_rootfs "$1" "$2" "$3" "${TAR[$1]}" >"${TAR[$1]%.tar}.log" 2>&1 &
    PIDS+=($!) NAMES+=("$1")
}

publish_base() { # NAME
    local name=$1 repo=$REG/sciencebench/$1 tag=${TAG[$1]}
    if ! registry_has "sciencebench/$name" "$tag"; then
        if ! docker image inspect "$repo:$tag" >/dev/null 2>&1; then
            log "$name: docker import ${TAR[$name]}"
            local change args=()
            while IFS= read -r change; do args+=(--change "$change"); done <<<"${CHANGES[$name]}"
            docker import "${args[@]}" "${TAR[$name]}" "$repo:$tag" >/dev/null
        fi
        log "$name: push $repo:$tag"
        docker push -q "$repo:$tag" >/dev/null
    fi
    docker pull -q "$repo:$tag" >/dev/null
    REF[$name]=$(pinned "$repo" "$tag")
    log "$name: ${REF[$name]}"
}

# The wheelhouse for Python X.Y (manylinux, glibc of the base) plus the docker
# binaries: INPUTS/{wheelhouse,bin}. Complete when INPUTS/.complete exists.
make_inputs() { # PYVERSION INPUTS
    local py=$1 inputs=$2 tmp=$2.tmp extra
    rm -rf "$tmp"
    mkdir -p "$tmp/wheelhouse" "$tmp/bin"
    for extra in worker monitor; do
        "$UV_HOME/bin/uv" export --frozen --no-emit-project --extra "$extra" \
            --format requirements-txt --quiet --project "$REPO" >"$tmp/wheelhouse/$extra.txt"
    done
    # pip 23 does not widen a manylinux platform to older ones: name them all.
    local platforms=() m
    for m in $(seq 41 -1 17); do platforms+=(--platform "manylinux_2_${m}_x86_64"); done
    platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64
                --platform manylinux1_x86_64 --platform linux_x86_64)
    local target=(--only-binary=:all: "${platforms[@]}" --python-version "$py" --implementation cp
                  --abi "cp${py/./}" --abi abi3 --abi none)
    # --no-deps: uv.lock has resolved every requirement already (each pinned, with its hashes); pip must
    # not resolve again (a newer release of a dependency named with extras fails pip's hash check).
    for extra in worker monitor; do
        "$UV_HOME/bin/pip" download --quiet --disable-pip-version-check --no-deps "${target[@]}" \
            -r "$tmp/wheelhouse/$extra.txt" -d "$tmp/wheelhouse" 2>&1 | grep -v 'is ignored' >&2 || true
        # grep's status hides pip's; check the result instead.
    done
    "$UV_HOME/bin/pip" download --quiet --disable-pip-version-check "${target[@]}" \
        "$PIP_PIN" "$HATCHLING_PIN" -d "$tmp/wheelhouse" 2>&1 | grep -v 'is ignored' >&2 || true
    local missing
    missing=$(check_wheelhouse "$tmp/wheelhouse" "$py") || die "wheelhouse incomplete: $missing"
    cp "$SB_STATE/prefix/usr/bin/docker" "$tmp/bin/docker"
    cp "$SB_STATE/prefix/usr/libexec/docker/cli-plugins/docker-compose" "$tmp/bin/docker-compose"
    touch "$tmp/.complete"
    rm -rf "$inputs"
    mv "$tmp" "$inputs"
}

# Every requirement of both files that applies to the image (markers
# evaluated for CPython X.Y on linux/x86_64) has its pinned wheel in the
# directory; prints the first that has none.
check_wheelhouse() { # DIR PYVERSION
    "$UV_HOME/bin/python" - "$1" "$2" <<'PY'
import pathlib, re, sys
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename

wheelhouse, py = pathlib.Path(sys.argv[1]), sys.argv[2]
target = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
          "platform_machine": "x86_64", "python_version": py, "python_full_version": py + ".0",
          "implementation_name": "cpython", "platform_python_implementation": "CPython"}
have = {parse_wheel_filename(w.name)[:2] for w in wheelhouse.glob("*.whl")}
names = {name for name, _ in have}
if not {"pip", "hatchling"} <= names:
    sys.exit(print("pip or hatchling") or 1)
for listing in ("worker.txt", "monitor.txt"):
    for line in (wheelhouse / listing).read_text().splitlines():
        if not re.match(r"^[A-Za-z0-9]", line):
            continue
        req = Requirement(line.rstrip(" \\"))
        if req.marker is not None and not req.marker.evaluate(target):
            continue
        (version,) = [spec.version for spec in req.specifier]
        if not any(n == canonicalize_name(req.name) and str(v) == str(type(v)(version)) for n, v in have):
            sys.exit(print(f"{req.name}=={version}") or 1)
PY
}

mkdir -p "$CACHE" "$OUT"
# Concurrent callers (parallel sessions) share the caches: one at a time.
exec 9>"$CACHE/cluster-images.lock"
flock 9

base_keys python "$PYTHON_SUITE" "$PYTHON_PACKAGES" "$PYTHON_CHANGES"
base_keys redis "$REDIS_SUITE" "$REDIS_PACKAGES" "$REDIS_CHANGES"
PIDS=() NAMES=()
build_rootfs_bg python "$PYTHON_SUITE" "$PYTHON_PACKAGES"
build_rootfs_bg redis "$REDIS_SUITE" "$REDIS_PACKAGES"
failed=0
for i in "${!PIDS[@]}"; do
    name=${NAMES[$i]}
    if wait "${PIDS[$i]}"; then
        log "$name: rootfs $(du -h "${TAR[$name]}" | cut -f1)"
        find "$CACHE" -maxdepth 1 -name "$name-*" ! -name "$(basename "${TAR[$name]%.tar}").*" -delete
    else
        log "$name: debootstrap failed; last lines of ${TAR[$name]%.tar}.log:" >&2
        tail -n 20 "${TAR[$name]%.tar}.log" >&2
        failed=1
    fi
done
((failed == 0)) || die "rootfs build failed"
publish_base python
publish_base redis

# Debian's docker-registry .deb, kept in the cache: apt's copy from host-setup, else downloaded.
registry_deb() {
    local found
    found=$(compgen -G "$CACHE/docker-registry_*.deb" | head -n1 || true)
    if [[ -z $found ]]; then
        found=$(compgen -G "/var/cache/apt/archives/docker-registry_*.deb" | head -n1 || true)
        if [[ -n $found ]]; then
            cp "$found" "$CACHE/"
        else
            (cd "$CACHE" && apt-get download -qq docker-registry) >&2
        fi
        found=$(compgen -G "$CACHE/docker-registry_*.deb" | head -n1 || true)
    fi
    [[ -n $found ]] || die "no docker-registry .deb (apt-get download docker-registry failed)"
    echo "$found"
}

publish_mirror() {
    local deb repo=$REG/sciencebench/mirror tag context=$CACHE/work-mirror
    deb=$(registry_deb)
    tag=$(printf '%s\n' "${REF[redis]}" "$(sha256sum <"$deb")" "$MIRROR_CONFIG" "$MIRROR_DOCKERFILE" | sha16)
    if ! registry_has sciencebench/mirror "$tag"; then
        log "mirror: $(basename "$deb") over ${REF[redis]##*/}"
        rm -rf "$context"
        mkdir -p "$context/rootfs" "$context/storage"
        dpkg-deb -x "$deb" "$context/rootfs"
        rm -rf "$context/rootfs/usr/share" "$context/rootfs/etc/init.d" "$context/rootfs/lib" \
            "$context/rootfs/var"
        printf '%s\n' "$MIRROR_CONFIG" >"$context/rootfs/etc/docker/registry/config.yml"
        printf '%s\n' "$MIRROR_DOCKERFILE" >"$context/Dockerfile"
        # The legacy builder (no buildx plugin here) warns about itself on stderr: kept in a log.
        docker build -q --network none --build-arg "BASE=${REF[redis]}" -t "$repo:$tag" "$context" \
            >"$CACHE/mirror-build.log" 2>&1 || { cat "$CACHE/mirror-build.log" >&2; die "mirror build failed"; }
        docker push -q "$repo:$tag" >/dev/null
        rm -rf "$context"
    fi
    docker pull -q "$repo:$tag" >/dev/null
    REF[mirror]=$(pinned "$repo" "$tag")
    log "mirror: ${REF[mirror]}"
}
publish_mirror

# The wheelhouse matches the base's Python (minor version and glibc).
PY_VERSION=$(docker run --rm --network none "${REF[python]}" \
    python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
inputs_key=$(printf '%s\n' "$PY_VERSION" "$PIP_PIN" "$HATCHLING_PIN" "$(sha256sum uv.lock)" \
    "$(declare -f make_inputs check_wheelhouse)" "$(cat "$SB_STATE/prefix/.debs")" | sha16)
INPUTS=$CACHE/inputs-$inputs_key
if [[ -f $INPUTS/.complete ]]; then
    log "build inputs present: $INPUTS"
else
    log "build inputs: wheelhouse for Python $PY_VERSION from uv.lock (pip download), docker binaries"
    make_inputs "$PY_VERSION" "$INPUTS"
    log "build inputs: $(find "$INPUTS/wheelhouse" -name '*.whl' | wc -l) wheels, $(du -sh "$INPUTS" | cut -f1)"
fi
# Inputs of other uv.lock versions not used for two days go.
find "$CACHE" -maxdepth 1 -name 'inputs-*' ! -name "inputs-$inputs_key" -mtime +2 -exec rm -rf {} +
touch "$INPUTS"
flock -u 9

# Phase 2: the three images, no network inside any build. The tag is per
# checkout, so parallel sessions never push each other's builds.
tag=$(printf '%s\n' "$REPO" | sha16)
export SCIENCEBENCH_BASE_IMAGE=${REF[python]} \
    SCIENCEBENCH_SQUID_BASE_IMAGE=$SB_SQUID_IMAGE \
    SCIENCEBENCH_BUILD_INPUTS=$INPUTS \
    SCIENCEBENCH_WORKER_IMAGE=$REG/sciencebench/worker:$tag \
    SCIENCEBENCH_FLOWER_IMAGE=$REG/sciencebench/flower:$tag \
    SCIENCEBENCH_PROXY_BUILD_IMAGE=$REG/sciencebench/proxy:$tag
build_started=$SECONDS
log "docker compose -f compose/build.yml build (log: $OUT/build.log)"
if ! docker compose --progress plain -f compose/build.yml build >"$OUT/build.log" 2>&1; then
    tail -n 40 "$OUT/build.log" >&2
    die "image build failed"
fi
build_s=$((SECONDS - build_started))
for image in "$SCIENCEBENCH_WORKER_IMAGE" "$SCIENCEBENCH_FLOWER_IMAGE" "$SCIENCEBENCH_PROXY_BUILD_IMAGE"; do
    docker push -q "$image" >/dev/null
done
worker=$(pinned "$REG/sciencebench/worker" "$tag")
flower=$(pinned "$REG/sciencebench/flower" "$tag")
proxy=$(pinned "$REG/sciencebench/proxy" "$tag")
size() { docker image inspect --format '{{.Size}}' "$1" | numfmt --to=iec; }
log "worker $worker ($(size "$worker")); flower ($(size "$flower")); proxy ($(size "$proxy")); built in ${build_s}s"

cat >"$OUT/images.env.tmp" <<EOF
SB_CLUSTER_PYTHON_IMAGE=${REF[python]}
SB_CLUSTER_REDIS_IMAGE=${REF[redis]}
SB_CLUSTER_MIRROR_IMAGE=${REF[mirror]}
SB_CLUSTER_WORKER_IMAGE=$worker
SB_CLUSTER_FLOWER_IMAGE=$flower
SB_CLUSTER_PROXY_IMAGE=$proxy
SB_CLUSTER_BUILD_INPUTS=$INPUTS
EOF
mv "$OUT/images.env.tmp" "$OUT/images.env"
log "wrote $OUT/images.env; done in $((SECONDS - START))s"
