#!/usr/bin/env bash
# The README's main job: a real two-task selection through real Pier in
# embedded mode (no Redis), on this host. Prepares what it needs first:
# .venv from the lock file, Docker Engine 28 with compose v2 and a loopback
# registry (scripts/host-setup.sh), and a Debian-built base image.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
scripts/host-setup.sh
scripts/fixture-images.sh
# shellcheck disable=SC1091
source "${SB_STATE:-/var/tmp/sciencebench-host}/env.sh"
# shellcheck disable=SC1091
source "${SB_STATE:-/var/tmp/sciencebench-host}/images.env"

export LITELLM_LOCAL_MODEL_COST_MAP=True
export PATH="$PWD/.venv/bin:$PATH"
export SCIENCEBENCH_DEMO_BASE_IMAGE="$SB_BASE_IMAGE"
export SCIENCEBENCH_DEMO_REGISTRY="$SCIENCEBENCH_TEST_REGISTRY"
exec sciencebench demo "$@"
