#!/usr/bin/env bash
# Frees the disk a developer's machine accumulates over many test runs (a CI
# machine is fresh and never needs it). Every run pushes new digests (cluster
# images, baked agents, the online-install images) and leaves Pier's build
# cache; nothing in the suite removes them. Run it while no test runs:
#   - the Engine's build cache, and every image no container uses (the next
#     run pulls what it needs again from the loopback registry);
#   - the loopback registry's manifests no tag names any more (earlier builds
#     of the same tags) and their blobs: the registry is stopped for the
#     garbage collection, then started again by scripts/host-setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
state=${SB_STATE:-/var/tmp/sciencebench-host}
# shellcheck disable=SC1091
source "$state/env.sh"
log() { printf 'prune: %s\n' "$*"; }

before=$(df --output=avail -B1M / | tail -1)
if docker version >/dev/null 2>&1; then
    docker builder prune -af >/dev/null
    docker image prune -af >/dev/null
    log "engine: build cache and unused images removed"
fi
if [[ -f $state/registry.pid ]] && kill -0 "$(<"$state/registry.pid")" 2>/dev/null; then
    kill "$(<"$state/registry.pid")"
    while kill -0 "$(<"$state/registry.pid")" 2>/dev/null; do sleep 0.2; done
fi
if [[ -f $state/registry/config.yml ]]; then
    /usr/bin/docker-registry garbage-collect --delete-untagged "$state/registry/config.yml" >/dev/null
    log "registry: untagged manifests and unreferenced blobs removed"
fi
scripts/host-setup.sh >/dev/null
log "freed $(( $(df --output=avail -B1M / | tail -1) - before )) MiB"
