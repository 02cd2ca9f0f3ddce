#!/bin/sh
# Entrypoint of the sciencebench worker image (workers/Dockerfile).
#
# 1. The account. Started as root (the image's default, as compose starts
#    it), the entrypoint gives SCIENCEBENCH_UID/SCIENCEBENCH_GID a name in
#    the container, finds the group that owns the Docker socket, and runs
#    itself again as that uid:gid plus the socket's group, with no
#    capabilities left; the worker never runs as root. Started as another
#    user (`docker run --user`), it checks that this user can reach the socket.
#    Root itself is refused unless SCIENCEBENCH_ALLOW_ROOT=1 (see below).
#    Every problem is one line and exit 2, before anything else runs.
# 2. Copy registry credentials, if provided, into the container's own Docker
#    config (the mounted directory is read-only; the CLI and compose want a
#    writable one).
# 3. `sciencebench preflight`: Engine >= 28, platform, compose v2, Pier 0.3.0,
#    the shared jobs directory writable, the broker reachable. A host that
#    fails here never consumes a trial; the container exits non-zero and its
#    restart policy tries again later.
# 4. exec `sciencebench worker`, which becomes the container's main process so
#    `docker stop` (SIGTERM) starts Celery's warm shutdown: no new trials,
#    running ones finish within the stop grace period.
#
# Why not root: the worker writes trial directories, records and summaries
# into the shared jobs directory, which the login node's account must be able
# to read and `retry` to replace; files written as root on a shared
# filesystem (or squashed to nobody by NFS) break that. Run it as the account
# that runs `sciencebench submit`, or one sharing its group. Root is only for
# a shared filesystem that everyone uses as root.
#
# Settings come from the environment (see compose/example.env); extra
# arguments are appended to `sciencebench worker`.
set -eu

: "${SCIENCEBENCH_CONCURRENCY:=1}"
: "${SCIENCEBENCH_PLATFORM:=linux/amd64}"
: "${SCIENCEBENCH_LOGLEVEL:=INFO}"
: "${SCIENCEBENCH_WORKER_NAME:=sciencebench@%h}"
: "${SCIENCEBENCH_REGISTRY_AUTH_DIR:=/etc/sciencebench/registry-auth}"
: "${SCIENCEBENCH_ALLOW_ROOT:=0}"

say() { echo "sciencebench-entrypoint: $*" >&2; }
number() { case $1 in '' | *[!0-9]*) return 1 ;; esac; }

if [ -z "${SCIENCEBENCH_JOBS_DIR:-}" ]; then
    say "SCIENCEBENCH_JOBS_DIR is unset (the shared jobs directory)"
    exit 2
fi

socket=${DOCKER_HOST:-unix:///var/run/docker.sock}
socket=${socket#unix://}
if [ ! -S "$socket" ]; then
    say "no Docker socket at $socket: mount the host's Engine socket there (compose: SCIENCEBENCH_DOCKER_SOCKET)"
    exit 2
fi
socket_gid=$(stat -c %g "$socket")
uid=$(id -u)

if [ "$uid" = 0 ] && [ "$SCIENCEBENCH_ALLOW_ROOT" != 1 ]; then
    want_uid=${SCIENCEBENCH_UID:-}
    want_gid=${SCIENCEBENCH_GID:-}
    if ! number "$want_uid" || ! number "$want_gid" || [ "$want_uid" = 0 ]; then
        say "refusing to run as root: set SCIENCEBENCH_UID and SCIENCEBENCH_GID to the owner of the shared directories (not 0; the entrypoint drops to them), or set SCIENCEBENCH_ALLOW_ROOT=1 if the shared filesystem is used as root everywhere"
        exit 2
    fi
    # Names for the ids (Celery, Pier and the docker CLI look them up).
    grep -q "^[^:]*:[^:]*:$want_gid:" /etc/group || echo "sciencebench:x:$want_gid:" >>/etc/group
    grep -q "^[^:]*:[^:]*:$socket_gid:" /etc/group || echo "docker-host:x:$socket_gid:" >>/etc/group
    grep -q "^[^:]*:[^:]*:$want_uid:" /etc/passwd \
        || echo "sciencebench:x:$want_uid:$want_gid:sciencebench worker:$HOME:/usr/sbin/nologin" >>/etc/passwd
    # The host-local scratch of running trials is the account's alone (the worker refuses one others may write).
    if [ -n "${SCIENCEBENCH_SCRATCH_DIR:-}" ]; then
        mkdir -p "$SCIENCEBENCH_SCRATCH_DIR"
        chown "$want_uid:$want_gid" "$SCIENCEBENCH_SCRATCH_DIR"
        chmod 700 "$SCIENCEBENCH_SCRATCH_DIR"
    fi
    # The online install's artifact cache: the account fetches into a fresh (empty) one.
    if [ -n "${SCIENCEBENCH_AGENT_ARTIFACTS:-}" ]; then
        mkdir -p "$SCIENCEBENCH_AGENT_ARTIFACTS"
        [ -n "$(ls -A "$SCIENCEBENCH_AGENT_ARTIFACTS")" ] || chown "$want_uid:$want_gid" "$SCIENCEBENCH_AGENT_ARTIFACTS"
    fi
    # Run this script again as the account: its groups are its own and the
    # socket's only, and it keeps no capability.
    exec setpriv --reuid="$want_uid" --regid="$want_gid" --groups="$want_gid,$socket_gid" \
        --inh-caps=-all --bounding-set=-all -- "$0" "$@"
fi

if [ ! -r "$socket" ] || [ ! -w "$socket" ]; then
    say "uid $uid (groups $(id -G)) cannot use the Docker socket $socket (owner gid $socket_gid, mode $(stat -c %a "$socket")): start the container as root with SCIENCEBENCH_UID/SCIENCEBENCH_GID set, or add gid $socket_gid to its groups (docker run --group-add $socket_gid)"
    exit 2
fi
if [ ! -w "${HOME:-/}" ]; then
    say "HOME ${HOME:-unset} is not writable by uid $uid (Pier and the docker CLI keep state there)"
    exit 2
fi
say "running as $(id -un 2>/dev/null || echo "uid $uid") (uid $uid gid $(id -g) groups $(id -G)); Docker socket $socket (gid $socket_gid)"

auth="$SCIENCEBENCH_REGISTRY_AUTH_DIR/config.json"
if [ -f "$auth" ] && [ ! -r "$auth" ]; then
    say "$auth is not readable by uid $uid; make it readable by the worker's user"
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
