#!/usr/bin/env bash
# Build sciencebench's fixture images from Debian packages and publish them to
# the loopback registry that scripts/host-setup.sh started. No image registry
# is reachable from this machine, so nothing can be pulled from a hub: each
# image is a debootstrap rootfs imported with `docker import`.
#
#   sciencebench/base   minbase + bash git curl python3 and network tools:
#                       task/agent containers and fixture HTTP servers.
#   sciencebench/squid  minbase + squid: the proxy of the network policy
#                       (which mounts its own squid.conf over the default).
#
# Writes $SB_STATE/images.env with digest-pinned refs (SB_BASE_IMAGE,
# SB_SQUID_IMAGE). Cached by content: rootfs tarballs are kept in the state
# dir keyed by their recipe, and an image whose recipe is unchanged and already
# in the registry is reused, so a re-run takes about a second.
set -euo pipefail

SB_STATE=${SB_STATE:-/var/tmp/sciencebench-host}
[[ -f $SB_STATE/env.sh ]] || { echo "fixture-images: run scripts/host-setup.sh first" >&2; exit 1; }
# shellcheck source=/dev/null
source "$SB_STATE/env.sh"

SUITE=bookworm
MIRROR=${SB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
REG=$SCIENCEBENCH_TEST_REGISTRY
ROOTFS=$SB_STATE/rootfs

# Per image: the packages debootstrap adds to minbase, and the image settings
# as Dockerfile instructions for `docker import --change`, one per line (an
# imported rootfs has none).
BASE_PACKAGES=bash,git,ca-certificates,curl,netcat-openbsd,iproute2,dnsutils,python3
BASE_CHANGES='CMD ["sleep","infinity"]'
SQUID_PACKAGES=bash,ca-certificates,squid
# -N keeps squid in the foreground as PID 1; -d 1 sends its start-up and error
# messages to stderr, i.e. to `docker logs`. On SIGTERM squid drains
# connections for shutdown_lifetime (30 s), longer than docker's 10 s stop
# timeout; SIGINT makes it exit at once, so `docker stop`/`compose down` is quick.
SQUID_CHANGES='CMD ["squid","-N","-d","1","-f","/etc/squid/squid.conf"]
STOPSIGNAL SIGINT'

START=$SECONDS
log() { printf 'fixture-images: [%3ds] %s\n' $((SECONDS - START)) "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

sha16() { sha256sum | cut -c1-16; }

# make_rootfs_tar NAME PACKAGES TARBALL: debootstrap a minbase rootfs, strip
# what an image does not need (apt caches and lists, docs, the host's
# resolver config) and tar it. Runs in the background, so it logs to a file.
make_rootfs_tar() {
    local name=$1 packages=$2 tarball=$3 dir=$ROOTFS/work-$1
    # A debootstrap killed midway can leave proc/sys mounted inside its target;
    # unmount before deleting so rm never walks into a live /proc or /sys.
    awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount -l
    rm -rf "$dir"
    debootstrap --variant=minbase --include="$packages" "$SUITE" "$dir" "$MIRROR"
    rm -rf "${dir:?}"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* \
        "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/info/* \
        "$dir"/usr/share/locale/* "${dir:?}"/dev/*
    find "$dir/var/log" -type f -delete
    # Docker bind-mounts its own resolv.conf and hostname at run time.
    rm -f "$dir/etc/resolv.conf" "$dir/etc/hostname"
    tar --numeric-owner -C "$dir" -c . >"$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
    rm -rf "$dir"
}

# True when the registry holds REPO:TAG.
registry_has() { # REPO TAG
    curl -fs -o /dev/null -I \
        -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
        -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
        "http://$REG/v2/$1/manifests/$2"
}

# Phase 1: work out each image's keys and build the rootfs tarballs that are
# neither cached on disk nor needed (image already published). The
# debootstraps run in parallel: they are mostly dpkg work and mirror
# round-trips, so two overlap well on two cores.
#   TAR[name]   rootfs tarball, keyed by suite, mirror, packages and the body
#               of make_rootfs_tar (editing the recipe rebuilds it);
#   TAG[name]   image tag, keyed by the tarball and the import settings.
declare -A TAR TAG CHANGES
build_tarballs() { # NAME PACKAGES CHANGES ... (triples)
    local pids=() names=()
    mkdir -p "$ROOTFS"
    while (($#)); do
        local name=$1 packages=$2 changes=$3 rootfs_key; shift 3
        rootfs_key=$(printf '%s\n' "$SUITE" "$MIRROR" "$packages" "$(declare -f make_rootfs_tar)" | sha16)
        TAR[$name]=$ROOTFS/$name-$rootfs_key.tar
        TAG[$name]=$(printf '%s\n' "$rootfs_key" "$changes" | sha16)
        CHANGES[$name]=$changes
        if [[ -f ${TAR[$name]} ]] || registry_has "sciencebench/$name" "${TAG[$name]}"; then
            continue
        fi
        log "$name: debootstrap $SUITE minbase + $packages (log: ${TAR[$name]%.tar}.log)"
        make_rootfs_tar "$name" "$packages" "${TAR[$name]}" >"${TAR[$name]%.tar}.log" 2>&1 &
        pids+=($!) names+=("$name")
    done
    local i failed=0
    for i in "${!pids[@]}"; do
        local name=${names[$i]}
        if wait "${pids[$i]}"; then
            log "$name: rootfs $(du -h "${TAR[$name]}" | cut -f1)"
            # Only the current recipe's tarball (and its log) is worth keeping.
            find "$ROOTFS" -maxdepth 1 -name "$name-*" ! -name "$(basename "${TAR[$name]%.tar}").*" -delete
        else
            log "$name: debootstrap failed; last lines of ${TAR[$name]%.tar}.log:" >&2
            tail -n 20 "${TAR[$name]%.tar}.log" >&2
            failed=1
        fi
    done
    ((failed == 0)) || die "rootfs build failed"
}

# Phase 2: make sure $REG/sciencebench/NAME:<tag> (also tagged :latest) is in
# the registry and present locally, and record its digest-pinned ref in REF.
declare -A REF
publish() { # NAME
    local name=$1 repo=$REG/sciencebench/$1 tag=${TAG[$1]}
    if ! registry_has "sciencebench/$name" "$tag"; then
        if ! docker image inspect "$repo:$tag" >/dev/null 2>&1; then
            log "$name: docker import ${TAR[$name]}"
            local change args=()
            while IFS= read -r change; do args+=(--change "$change"); done <<<"${CHANGES[$name]}"
            docker import "${args[@]}" "${TAR[$name]}" "$repo:$tag" >/dev/null
        fi
        docker tag "$repo:$tag" "$repo:latest"
        log "$name: push $repo:$tag"
        docker push -q "$repo:$tag" >/dev/null
        docker push -q "$repo:latest" >/dev/null
    fi
    # A no-op when the image is local; restores it when only the registry has it.
    docker pull -q "$repo:$tag" >/dev/null
    docker tag "$repo:$tag" "$repo:latest"
    REF[$name]=$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$repo:$tag" \
        | grep -m1 "^$repo@sha256:") || die "$name: no registry digest for $repo:$tag"
    log "$name: ${REF[$name]} ($(docker image inspect --format '{{.Size}}' "$repo:$tag" | numfmt --to=iec))"
}

# Concurrent callers (parallel test sessions) wait for one build.
exec 9>"$SB_STATE/fixture-images.lock"
flock 9
build_tarballs base "$BASE_PACKAGES" "$BASE_CHANGES" \
               squid "$SQUID_PACKAGES" "$SQUID_CHANGES"
publish base
publish squid

cat >"$SB_STATE/images.env.tmp" <<EOF
SB_BASE_IMAGE=${REF[base]}
SB_SQUID_IMAGE=${REF[squid]}
EOF
mv "$SB_STATE/images.env.tmp" "$SB_STATE/images.env"
log "wrote $SB_STATE/images.env; done in $((SECONDS - START))s"
