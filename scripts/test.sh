#!/usr/bin/env bash
# The test command (README): prepares everything the tests need on a clean
# machine, then runs lint, types and every test tier. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)

scripts/bootstrap.sh                # .venv from uv.lock (Python >= 3.12)
scripts/host-setup.sh               # redis-server, Docker Engine 28 + compose v2, loopback registry
scripts/fixture-images.sh           # Debian-built base and proxy images, pushed by digest
scripts/agent-artifacts.sh          # pinned Codex, Claude Code, mini-swe-agent artifacts (npm, PyPI)
scripts/cluster-images.sh           # worker, Flower, proxy, Redis images built offline (wheelhouse from uv.lock)
# The cluster tier checks the worker's systemd unit with systemd-analyze (Debian's systemd).
command -v systemd-analyze >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends systemd >/dev/null; }
# shellcheck disable=SC1091
source "${SB_STATE:-/var/tmp/sciencebench-host}/env.sh"
# shellcheck disable=SC1091
source "${SB_STATE:-/var/tmp/sciencebench-host}/images.env"
# shellcheck disable=SC1091
source build/cluster/images.env
export SB_BASE_IMAGE SB_SQUID_IMAGE LITELLM_LOCAL_MODEL_COST_MAP=True
export SB_CLUSTER_PYTHON_IMAGE SB_CLUSTER_REDIS_IMAGE SB_CLUSTER_WORKER_IMAGE SB_CLUSTER_FLOWER_IMAGE \
    SB_CLUSTER_PROXY_IMAGE SB_CLUSTER_BUILD_INPUTS

echo "== lint and types"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache

echo "== benchmarks, quick smoke (full run: .venv/bin/python -m bench.run)"
.venv/bin/python -m bench.run --quick

echo "== tests (unit, integration, docker, reliability); setup took $(( $(date +%s) - started ))s so far"
# --durations: the slowest tests in the log, to see where the time goes (the bound is 45 minutes).
pytest=(.venv/bin/pytest -p no:cacheprovider --durations=40)
[ "$#" -eq 0 ] || exec "${pytest[@]}" "$@"
# tests/unit and tests/coordination share no state between tests (each pytest-xdist worker has its own
# redis-server, temporary and state directories): two processes at once. Every other test (worker processes,
# the Docker Engine, real agents, checks bound to timing) one at a time, as before.
status=0
"${pytest[@]}" -n 2 tests/unit tests/coordination || status=$?
"${pytest[@]}" --ignore=tests/unit --ignore=tests/coordination || status=$?
exit "$status"
