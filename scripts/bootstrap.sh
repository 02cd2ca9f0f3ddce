#!/usr/bin/env bash
# Create .venv from uv.lock with a host Python >= 3.12 (never a downloaded one).
# Prints nothing but progress; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  for candidate in "${SCIENCEBENCH_PYTHON:-}" python3.13 python3.12 \
      /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  return 1
}

PYTHON=$(find_python) || { echo "bootstrap: Python >= 3.12 not found (set SCIENCEBENCH_PYTHON)" >&2; exit 2; }
UV_HOME=${SCIENCEBENCH_UV_HOME:-$HOME/.cache/sciencebench-uv}
if [ ! -x "$UV_HOME/bin/uv" ]; then
  echo "bootstrap: installing uv into $UV_HOME"
  "$PYTHON" -m venv "$UV_HOME"
  "$UV_HOME/bin/pip" install --quiet "uv>=0.5,<1"
fi
echo "bootstrap: syncing .venv from uv.lock with $PYTHON"
# Compiled bytecode, as pip installs it: without it every process (the CLI, each
# worker) compiles Celery, pydantic and the rest from source at start-up,
# which doubles the CLI's start-up where PYTHONDONTWRITEBYTECODE is set.
"$UV_HOME/bin/uv" sync --frozen --all-extras --python "$PYTHON" --quiet --compile-bytecode
.venv/bin/python -m compileall -q sciencebench bench >/dev/null
