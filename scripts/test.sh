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
# shellcheck disable=SC1091
source "${SB_STATE:-/var/tmp/sciencebench-host}/env.sh"
# shellcheck disable=SC1091
source "${SB_STATE:-/var/tmp/sciencebench-host}/images.env"
export SB_BASE_IMAGE SB_SQUID_IMAGE LITELLM_LOCAL_MODEL_COST_MAP=True

echo "== lint and types"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache

echo "== benchmarks, quick smoke (full run: .venv/bin/python -m bench.run)"
.venv/bin/python -m bench.run --quick

echo "== tests (unit, integration, docker, reliability); setup took $(( $(date +%s) - started ))s so far"
exec .venv/bin/pytest -p no:cacheprovider "$@"
