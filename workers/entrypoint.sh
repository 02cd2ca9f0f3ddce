#!/bin/sh
# Entrypoint of the sciencebench worker image (workers/Dockerfile).
#
# 1. Copy registry credentials, if provided, into the container's own Docker
#    config (the mounted directory is read-only; the CLI and compose want a
#    writable one).
# 2. `sciencebench preflight`: Engine >= 28, platform, compose v2, Pier 0.3.0,
#    the shared jobs directory writable, the broker reachable. A host that
#    fails here never consumes a trial; the container exits non-zero and its
#    restart policy tries again later.
# 3. exec `sciencebench worker`, which becomes the container's main process so
#    `docker stop` (SIGTERM) starts Celery's warm shutdown: no new trials,
#    running ones finish within the stop grace period.
#
# Settings come from the environment (see compose/example.env); extra
# arguments are appended to `sciencebench worker`.
set -eu

: "${SCIENCEBENCH_CONCURRENCY:=1}"
: "${SCIENCEBENCH_PLATFORM:=linux/amd64}"
: "${SCIENCEBENCH_LOGLEVEL:=INFO}"
: "${SCIENCEBENCH_WORKER_NAME:=sciencebench@%h}"
: "${SCIENCEBENCH_REGISTRY_AUTH_DIR:=/etc/sciencebench/registry-auth}"

if [ -z "${SCIENCEBENCH_JOBS_DIR:-}" ]; then
    echo "sciencebench-entrypoint: SCIENCEBENCH_JOBS_DIR is unset (the shared jobs directory)" >&2
    exit 2
fi

auth="$SCIENCEBENCH_REGISTRY_AUTH_DIR/config.json"
if [ -f "$auth" ] && [ ! -r "$auth" ]; then
    echo "sciencebench-entrypoint: $auth is not readable by uid $(id -u); make it readable by the worker's user" >&2
    exit 2
fi
if [ -f "$auth" ]; then
    config_dir="${DOCKER_CONFIG:-$HOME/.docker}"
    mkdir -p "$config_dir"
    # umask: the copy holds registry credentials.
    (umask 077 && cp "$auth" "$config_dir/config.json")
fi

sciencebench preflight \
    --platform "$SCIENCEBENCH_PLATFORM" \
    --jobs-dir "$SCIENCEBENCH_JOBS_DIR"

exec sciencebench worker \
    --concurrency "$SCIENCEBENCH_CONCURRENCY" \
    --hostname "$SCIENCEBENCH_WORKER_NAME" \
    --platform "$SCIENCEBENCH_PLATFORM" \
    --loglevel "$SCIENCEBENCH_LOGLEVEL" \
    "$@"
