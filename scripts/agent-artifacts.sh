#!/usr/bin/env bash
# Fetch the pinned agent artifacts on this (build or worker) host: Codex's and
# Claude Code's npm packages (their native linux-x64 binaries) with
# sciencebench's own fetcher (sciencebench/bake/fetch.py, the one a worker's
# online install uses: SCIENCEBENCH_NPM_REGISTRY, default registry.npmjs.org,
# each tarball checked against its sha512 integrity), `pip download` for
# mini-swe-agent and every wheel it installs. Nothing is fetched inside a
# container or an image build: `sciencebench images bake` and the online
# install mount these files read-only into a network-less container.
#
#   scripts/agent-artifacts.sh                     all three agents, pinned versions
#   scripts/agent-artifacts.sh --agent codex       one agent (repeatable)
#   scripts/agent-artifacts.sh --agent codex --version 0.169.0
#   scripts/agent-artifacts.sh --agent mini-swe-agent --python 3.12
#
# Layout (SCIENCEBENCH_AGENT_ARTIFACTS, default /var/tmp/sciencebench-agents):
#   codex/<v>/{codex,rg,MANIFEST}  claude-code/<v>/{claude,MANIFEST}
#   mini-swe-agent/<v>/py<X.Y>/{*.whl,MANIFEST}
# A directory with a MANIFEST is complete (it is renamed into place last), so
# re-runs cost nothing. Pins: sciencebench/core/harnesses.py (each entry's bake).
set -euo pipefail
cd "$(dirname "$0")/.."

ART=${SCIENCEBENCH_AGENT_ARTIFACTS:-/var/tmp/sciencebench-agents}
PY=${SCIENCEBENCH_PIP_PYTHON:-python3}   # any Python with pip; it only downloads
agents=() version="" pythons=()
while (($#)); do
    case $1 in
        --agent) agents+=("$2"); shift 2 ;;
        --version) version=$2; shift 2 ;;
        --python) pythons+=("$2"); shift 2 ;;
        *) echo "agent-artifacts: unknown option $1" >&2; exit 2 ;;
    esac
done
((${#agents[@]})) || agents=(codex claude-code mini-swe-agent)
((${#pythons[@]})) || pythons=(3.11)
if [[ -n $version && ${#agents[@]} -ne 1 ]]; then
    echo "agent-artifacts: --version needs exactly one --agent" >&2; exit 2
fi

START=$SECONDS
log() { printf 'agent-artifacts: [%3ds] %s\n' $((SECONDS - START)) "$*"; }
pin() { .venv/bin/python -m sciencebench.bake.recipes pin "$1"; }

mkdir -p "$ART"
exec 9>"$ART/.lock"
flock 9   # one fetch at a time per cache (other sessions share it)

# finish TMP DEST: checksum the files, write MANIFEST, move into place.
finish() {
    local tmp=$1 dest=$2 source=$3
    local files
    files=$(cd "$tmp" && find . -maxdepth 1 -type f -printf '%P\n' | LC_ALL=C sort)
    (cd "$tmp" && { echo "source $source"; xargs sha256sum <<<"$files"; } >"$tmp.manifest")
    mv "$tmp.manifest" "$tmp/MANIFEST"
    chmod 755 "$tmp"
    mkdir -p "$(dirname "$dest")"
    rm -rf "$dest"
    mv "$tmp" "$dest"
    log "$dest: $(du -sh "$dest" | cut -f1)"
}

# npm_binary AGENT VERSION: the harness's npm package, its binaries kept (sciencebench/bake/fetch.py).
npm_binary() {
    local agent=$1 v=$2
    local dest=$ART/$agent/$v
    if [[ -f $dest/MANIFEST ]]; then log "$agent $v: cached in $dest"; return; fi
    log "$agent $v: fetching its npm package"
    # The fetcher takes the cache's lock itself: release ours to it.
    flock -u 9
    .venv/bin/python -m sciencebench.bake.fetch "$agent" "$v" "$ART" "${SCIENCEBENCH_NPM_REGISTRY:-}" >/dev/null
    flock 9
    log "$dest: $(du -sh "$dest" | cut -f1)"
}

mswea() {
    local v=$1 py=$2
    local dest=$ART/mini-swe-agent/$v/py$py
    if [[ -f $dest/MANIFEST ]]; then log "mini-swe-agent $v (Python $py): cached in $dest"; return; fi
    local constraints=scripts/agent-constraints/mini-swe-agent-$v.txt
    [[ -f $constraints ]] || { echo "agent-artifacts: no $constraints (pin every wheel first)" >&2; exit 2; }
    local tmp; tmp=$(mktemp -d "$ART/.fetch-mswea-XXXXXX")
    log "mini-swe-agent $v: pip download for CPython $py (manylinux x86_64)"
    # -c: the pinned wheel set. --only-binary/--platform: wheels for the image's
    # Python, not this host's; nothing is built.
    # The host's pip configuration (local indexes, caps) is not what a build host
    # should depend on: only PyPI, through the system's CA bundle when there is one.
    local cert=()
    [[ -f /etc/ssl/certs/ca-certificates.crt ]] && cert=(--cert /etc/ssl/certs/ca-certificates.crt)
    PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS="" "$PY" -m pip download --quiet --disable-pip-version-check \
        "${cert[@]}" --dest "$tmp" \
        --only-binary=:all: --implementation cp --python-version "$py" --abi "cp${py//./}" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64 \
        -c "$constraints" "mini-swe-agent==$v" pip
    finish "$tmp" "$dest" "pypi:mini-swe-agent==$v"
}

for agent in "${agents[@]}"; do
    v=${version:-$(pin "$agent")}
    case $agent in
        codex | claude-code)
            npm_binary "$agent" "$v" ;;
        mini-swe-agent)
            for py in "${pythons[@]}"; do mswea "$v" "$py"; done ;;
        *) echo "agent-artifacts: unknown agent $agent (codex, claude-code, mini-swe-agent)" >&2; exit 2 ;;
    esac
done
echo "SCIENCEBENCH_AGENT_ARTIFACTS=$ART"
