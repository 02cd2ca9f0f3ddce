#!/usr/bin/env bash
# Prepare a Debian bookworm host (as root) for sciencebench's Docker-backed
# tests and workers:
#   - Debian packages (redis-server binary, docker-registry, debootstrap, runc, ...),
#   - a private Docker Engine 28 + compose v2 unpacked from Debian testing (forky),
#     because bookworm ships Docker 20.10, which lacks the isolated-gateway
#     bridge mode the network policy relies on,
#   - a dockerd on its own socket and a Docker registry on a loopback port,
#   - $SB_STATE/env.sh, which callers source to reach both.
# Idempotent: a re-run only checks what is already there (a few seconds), and
# it is safe while the daemons it started are running.
#
# Network rule: this script only talks to the Debian mirror (through apt), to
# loopback and to the docker socket.
set -euo pipefail

SB_STATE=${SB_STATE:-/var/tmp/sciencebench-host}
SB_REGISTRY_PORT=${SB_REGISTRY_PORT:-5555}
# The mirror the machine's own apt sources already use; forky is fetched from it.
SB_DEBIAN_MIRROR=${SB_DEBIAN_MIRROR:-http://deb.debian.org/debian}

PREFIX=$SB_STATE/prefix
REGISTRY=127.0.0.1:$SB_REGISTRY_PORT
export DOCKER_HOST=unix://$SB_STATE/docker.sock
export DOCKER_CONFIG=$SB_STATE/docker-config
# dockerd finds containerd, containerd-shim-runc-v2, docker-proxy and
# docker-init on PATH, so the prefix must come first for the daemon as well.
export PATH=$PREFIX/usr/bin:$PREFIX/usr/sbin:$PATH

# From bookworm. runc stays the system one: forky's runc needs glibc 2.38.
# faketime runs a worker whose clock is skewed (the fault-isolation tier).
SYSTEM_PACKAGES=(redis-server docker-registry debootstrap runc iptables
                 curl git ca-certificates debian-archive-keyring faketime)
# From forky. docker-cli keeps the client in step with the engine and frees the
# setup from whatever docker binary the machine image happens to carry;
# tini-static is docker-init (`--init`, compose `init: true`).
FORKY_PACKAGES=(docker.io containerd docker-cli docker-compose tini-static)

START=$SECONDS
log() { printf 'host-setup: [%3ds] %s\n' $((SECONDS - START)) "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

# wait_until SECONDS LOGFILE WHAT CMD...: poll CMD until it succeeds; on
# timeout show the daemon's log tail, which is where the reason is.
wait_until() {
    local timeout=$1 logfile=$2 what=$3; shift 3
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "$what did not answer within ${timeout}s; last lines of $logfile:" >&2
            tail -n 30 "$logfile" >&2 || true
            die "$what failed to start"
        fi
        sleep 0.5
    done
}

install_system_packages() {
    local missing=() p
    for p in "${SYSTEM_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    if ((${#missing[@]} == 0)); then
        log "system packages present"
        return
    fi
    log "apt-get install ${missing[*]}"
    # A fresh machine may have no package lists yet.
    apt-get update -qq
    # The postinst scripts of redis-server and docker-registry may start their
    # Debian services; we never use those (tests run their own redis, and our
    # registry runs from its own config below), so they are left alone.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >"$SB_STATE/apt-install.log" 2>&1 \
        || { tail -n 30 "$SB_STATE/apt-install.log" >&2; die "apt-get install failed"; }
}

# Download the forky .debs with a private apt configuration (own sources
# list, lists and cache dirs) so the machine's apt sources and state stay
# untouched, then unpack them into $PREFIX. Both steps are cached.
install_engine() {
    local apt_dir=$SB_STATE/apt-forky debs=$SB_STATE/debs missing=() p
    mkdir -p "$debs"
    for p in "${FORKY_PACKAGES[@]}"; do
        compgen -G "$debs/${p}_*.deb" >/dev/null || missing+=("$p")
    done
    if ((${#missing[@]})); then
        log "downloading from forky: ${missing[*]}"
        mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/sources.list.d"
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $SB_DEBIAN_MIRROR forky main" \
            >"$apt_dir/sources.list"
        local apt_opts=(
            -o "Dir::Etc::SourceList=$apt_dir/sources.list"
            -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
            -o "Dir::State::Lists=$apt_dir/lists"
            -o "Dir::Cache=$apt_dir/cache"
            # apt-get download writes into the current directory, which the
            # unprivileged _apt user cannot; download as root without a warning.
            -o "APT::Sandbox::User=root"
        )
        apt-get "${apt_opts[@]}" update -qq
        (cd "$debs" && apt-get "${apt_opts[@]}" download -qq "${missing[@]}")
    fi

    # The stamp names the exact .debs unpacked, so a changed set re-unpacks.
    local wanted
    wanted=$(cd "$debs" && for p in "${FORKY_PACKAGES[@]}"; do ls "${p}"_*.deb; done)
    if [[ -f $PREFIX/.debs && $(<"$PREFIX/.debs") == "$wanted" ]]; then
        log "engine prefix present"
    else
        log "unpacking engine into $PREFIX"
        rm -rf "$PREFIX.tmp"
        mkdir -p "$PREFIX.tmp"
        local deb
        for deb in $wanted; do dpkg-deb -x "$debs/$deb" "$PREFIX.tmp"; done
        echo "$wanted" >"$PREFIX.tmp/.debs"
        rm -rf "$PREFIX"
        mv "$PREFIX.tmp" "$PREFIX"
    fi

    mkdir -p "$DOCKER_CONFIG/cli-plugins"
    ln -sfn "$PREFIX/usr/libexec/docker/cli-plugins/docker-compose" \
        "$DOCKER_CONFIG/cli-plugins/docker-compose"
}

start_dockerd() {
    if docker version >/dev/null 2>&1; then
        log "dockerd already answering on $DOCKER_HOST"
        return
    fi
    # A second dockerd on the host would fight ours over docker0 and the
    # DOCKER iptables chains; refuse rather than produce odd network failures.
    local pid other=()
    for pid in $(pidof dockerd || true); do
        [[ -f $SB_STATE/docker.pid && $pid == "$(<"$SB_STATE/docker.pid")" ]] || other+=("$pid")
    done
    ((${#other[@]} == 0)) || die "another dockerd is running (pid ${other[*]}); stop it or set SB_STATE to its state dir"

    log "starting dockerd (log: $SB_STATE/dockerd.log)"
    mkdir -p "$SB_STATE/docker/data" "$SB_STATE/docker/exec"
    # setsid + closed stdio: the daemon outlives this script and never holds
    # the caller's terminal or pipes open; nor this script's lock (fd 9), or the
    # next run of this script would wait for it forever. The default
    # iptables/bridge settings work in this sandbox (the kernel has bridge,
    # veth, nf_tables, NAT built in).
    setsid dockerd \
        --data-root "$SB_STATE/docker/data" \
        --exec-root "$SB_STATE/docker/exec" \
        --pidfile "$SB_STATE/docker.pid" \
        -H "$DOCKER_HOST" \
        </dev/null >>"$SB_STATE/dockerd.log" 2>&1 9>&- &
    wait_until 60 "$SB_STATE/dockerd.log" dockerd docker version
}

check_docker() {
    local engine compose
    engine=$(docker version --format '{{.Server.Version}}')
    ((${engine%%.*} >= 28)) || die "Docker Engine $engine is older than 28"
    compose=$(docker compose version --short)
    [[ $compose == 2.* || $compose == v2.* ]] || die "docker compose $compose is not v2"
    log "engine $engine, containerd $(docker version --format '{{range .Server.Components}}{{if eq .Name "containerd"}}{{.Version}}{{end}}{{end}}'), compose $compose"

    # The network policy needs internal bridges whose gateway is isolated
    # (Engine >= 28); prove the engine accepts one.
    local net=sb-host-setup-check
    docker network rm "$net" >/dev/null 2>&1 || true
    docker network create --driver bridge --internal \
        -o com.docker.network.bridge.gateway_mode_ipv4=isolated "$net" >/dev/null
    local mode
    mode=$(docker network inspect "$net" \
        --format '{{.Internal}} {{index .Options "com.docker.network.bridge.gateway_mode_ipv4"}}')
    docker network rm "$net" >/dev/null
    [[ $mode == "true isolated" ]] || die "isolated internal bridge network not supported (got: $mode)"
    log "isolated internal bridge network: ok"
}

start_registry() {
    local cfg=$SB_STATE/registry/config.yml
    if curl -fsS -o /dev/null "http://$REGISTRY/v2/" 2>/dev/null; then
        log "registry already answering on $REGISTRY"
        return
    fi
    log "starting registry on $REGISTRY (log: $SB_STATE/registry.log)"
    mkdir -p "$SB_STATE/registry/data"
    # Debian's stock config listens on :5000 on all interfaces with htpasswd
    # auth; ours is loopback-only, unauthenticated, stored in the state dir.
    cat >"$cfg" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $SB_STATE/registry/data
  delete:
    enabled: true
http:
  addr: $REGISTRY
EOF
    setsid /usr/bin/docker-registry serve "$cfg" </dev/null >>"$SB_STATE/registry.log" 2>&1 9>&- &
    echo $! >"$SB_STATE/registry.pid"
    wait_until 30 "$SB_STATE/registry.log" registry curl -fsS "http://$REGISTRY/v2/"
}

# Push and pull a one-file image: proves the engine reaches the loopback
# registry without TLS/insecure-registry settings.
check_registry() {
    local ref=$REGISTRY/sciencebench/host-setup-check:latest tmp
    tmp=$(mktemp -d)
    echo "sciencebench host-setup check" >"$tmp/check.txt"
    # Fixed mtimes: the same layer every run, so the registry does not grow.
    tar --mtime=@0 -C "$tmp" -c . | docker import - "$ref" >/dev/null
    rm -rf "$tmp"
    docker push -q "$ref" >/dev/null
    docker rmi "$ref" >/dev/null
    docker pull -q "$ref" >/dev/null
    docker rmi "$ref" >/dev/null
    log "registry push/pull: ok"
}

write_env() {
    local redis_bin
    redis_bin=$(command -v redis-server || echo /usr/bin/redis-server)
    cat >"$SB_STATE/env.sh.tmp" <<EOF
# Written by scripts/host-setup.sh; source it to use this host's docker,
# compose, registry and redis binary.
export SB_STATE=$SB_STATE
export PATH=$PREFIX/usr/bin:$PREFIX/usr/sbin:\$PATH
export DOCKER_HOST=$DOCKER_HOST
export DOCKER_CONFIG=$DOCKER_CONFIG
export SB_REGISTRY_PORT=$SB_REGISTRY_PORT
export SB_DEBIAN_MIRROR=$SB_DEBIAN_MIRROR
export SCIENCEBENCH_TEST_REGISTRY=$REGISTRY
export REDIS_SERVER_BIN=$redis_bin
EOF
    mv "$SB_STATE/env.sh.tmp" "$SB_STATE/env.sh"
    log "wrote $SB_STATE/env.sh"
}

[[ $EUID -eq 0 ]] || die "must run as root"
mkdir -p "$SB_STATE"
# Test sessions may call this concurrently; one at a time, the rest then find
# everything in place.
exec 9>"$SB_STATE/host-setup.lock"
flock 9
install_system_packages
install_engine
start_dockerd
check_docker
start_registry
check_registry
write_env
log "done in $((SECONDS - START))s"
