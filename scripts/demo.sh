#!/usr/bin/env bash
# The README's main job: a real two-task selection through real Pier in
# embedded mode (no broker; sciencebench starts its own redis-server), on
# this host. Prepares what it needs first: .venv from the lock file, the
# redis-server package, Docker Engine 28 with compose v2 and a loopback
# registry (scripts/host-setup.sh), and a Debian-built base image.
#
#   scripts/demo.sh                  the oracle solves the selection (no model)
#   scripts/demo.sh --agent codex    the real Codex CLI solves it against a scripted
#                                    model gateway (also claude-code, mini-swe-agent):
#                                    the agent's pinned artifacts are fetched on this
#                                    host first (scripts/agent-artifacts.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

agent=oracle
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[$i]} in
        --agent) agent=${args[$((i + 1))]:-} ;;
        --agent=*) agent=${args[$i]#--agent=} ;;
    esac
done

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
case $agent in
    codex | claude-code | mini-swe-agent)
        scripts/agent-artifacts.sh --agent "$agent"
        export SCIENCEBENCH_PROXY_IMAGE="$SB_SQUID_IMAGE"
        exec .venv/bin/python -m tests.fixtures.agent_demo "$@" ;;
    *)
        exec sciencebench demo "$@" ;;
esac
