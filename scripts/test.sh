#!/usr/bin/env bash
# The test command (README): prepares everything the tests need on a clean
# machine, then runs lint, types, every test tier and the quick benchmark.
# Safe to re-run. With arguments, runs only `pytest ARGS` after the setup.
#
# The setup's long steps wait on the package registries and the disk, so they
# overlap: the host's Engine and images in one chain, the agent artifacts and
# lint/types beside it. The tiers then run in three phases (tests/tiers.py).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
logs=$(mktemp -d "${TMPDIR:-/tmp}/sciencebench-test.XXXXXX")
trap 'rm -rf "$logs"' EXIT

since() { echo "$(( $(date +%s) - $1 ))s"; }
declare -A pids=() began=()
# beside NAME CMD...: run CMD in the background, its output kept for `joined`.
beside() { local name=$1; shift; began[$name]=$(date +%s); ("$@") >"$logs/$name.log" 2>&1 & pids[$name]=$!; }
# joined NAME: wait for it, print its output, and stop here if it failed.
joined() {
    local name=$1 status=0
    wait "${pids[$name]}" || status=$?
    echo "== $name (exit $status, $(since "${began[$name]}"))"
    cat "$logs/$name.log"
    [ "$status" -eq 0 ] || { echo "test.sh: $name failed" >&2; exit "$status"; }
}

scripts/bootstrap.sh                # .venv from uv.lock (Python >= 3.12)
host_images() {
    scripts/host-setup.sh           # redis-server, Docker Engine 28 + compose v2, loopback registry
    scripts/fixture-images.sh       # Debian-built base and proxy images, pushed by digest
    scripts/cluster-images.sh       # worker, Flower, proxy, Redis images built offline (wheelhouse from uv.lock)
    # The cluster tier checks the worker's systemd unit with systemd-analyze (Debian's systemd).
    command -v systemd-analyze >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends systemd >/dev/null; }
    # The report's test opens its page in a real headless Chromium (Debian's package).
    command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
}
lint_and_types() {
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .
    .venv/bin/mypy
    .venv/bin/lint-imports --no-cache
}
beside host-images host_images
beside agent-artifacts scripts/agent-artifacts.sh   # pinned Codex, Claude Code, mini-swe-agent (npm, PyPI)
[ "$#" -gt 0 ] || beside lint-and-types lint_and_types
joined agent-artifacts
[ "$#" -gt 0 ] || joined lint-and-types
joined host-images

# shellcheck disable=SC1091
source "${SB_STATE:-/var/tmp/sciencebench-host}/env.sh"
# shellcheck disable=SC1091
source "${SB_STATE:-/var/tmp/sciencebench-host}/images.env"
# shellcheck disable=SC1091
source build/cluster/images.env
export SB_BASE_IMAGE SB_SQUID_IMAGE LITELLM_LOCAL_MODEL_COST_MAP=True
export SB_CLUSTER_PYTHON_IMAGE SB_CLUSTER_REDIS_IMAGE SB_CLUSTER_WORKER_IMAGE SB_CLUSTER_FLOWER_IMAGE \
    SB_CLUSTER_PROXY_IMAGE SB_CLUSTER_MIRROR_IMAGE SB_CLUSTER_BUILD_INPUTS
echo "== setup done in $(since "$started")"

# --durations: the slowest tests in the log, to see where the time goes (the goal is 25 minutes in all).
pytest=(.venv/bin/pytest -p no:cacheprovider --durations=40)
[ "$#" -eq 0 ] || exec "${pytest[@]}" "$@"

status=0
# phase NAME PYTEST-ARGS...: one pytest run, timed; its exit status in $last.
phase() {
    local name=$1 at; shift
    at=$(date +%s)
    echo "== tests: $name"
    last=0
    "${pytest[@]}" "$@" || last=$?
    echo "== tests: $name took $(since "$at") (exit $last)"
}
# Which test runs in which phase, and why: tests/tiers.py.
phase "unit and coordination, 2 at a time" -n 2 tests/unit tests/coordination
[ "$last" -eq 0 ] || status=$last
# A test that fails beside others runs again, alone: a bound on time a loaded machine missed is not a
# failure of the code; one that fails alone too fails the run. The log names every test run again.
failed_beside="$logs/failed-beside"
# The quick benchmark (a smoke: it fails only on a crash, its goals are judged in the full run) runs beside
# the second phase, whose tests wait on containers more than they use the CPU; it ends before the third.
beside bench .venv/bin/python -m bench.run --quick
SCIENCEBENCH_FAILED_TESTS=$failed_beside phase "integration, reliability and docker, side by side" \
    -n 4 --dist loadfile -m "not alone" --ignore=tests/unit --ignore=tests/coordination
if [ "$last" -ne 0 ] && [ -s "$failed_beside" ]; then
    mapfile -t again < <(sort -u "$failed_beside")
    printf '== tests: failed beside others, run again alone:\n'; printf '  %s\n' "${again[@]}"
    phase "the tests that failed beside others, alone" "${again[@]}"
fi
[ "$last" -eq 0 ] || status=$last
bench_status=0
wait "${pids[bench]}" || bench_status=$?
echo "== benchmarks, quick smoke, beside the second phase (exit $bench_status, $(since "${began[bench]}"))" \
    "(full run: .venv/bin/python -m bench.run)"
cat "$logs/bench.log"
[ "$bench_status" -eq 0 ] || status=$bench_status
phase "tests that measure time or the whole Engine, one at a time" -m alone \
    --ignore=tests/unit --ignore=tests/coordination
[ "$last" -eq 0 ] || status=$last

echo "== all done in $(since "$started"), exit $status"
exit "$status"
