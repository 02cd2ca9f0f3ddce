"""The login node needs no worker extra: without Pier and the Docker SDK, `submit --dry-run` works.

A fresh virtual environment gets exactly the locked dependencies of the base
install (no extras), from uv's cache (`scripts/bootstrap.sh` filled it);
sciencebench itself comes from this checkout on PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.selection import make_selection
from tests.fixtures.services import REPO, free_port

pytestmark = pytest.mark.integration


def _uv() -> str:
    home = Path(os.environ.get("SCIENCEBENCH_UV_HOME", Path.home() / ".cache" / "sciencebench-uv"))
    uv = home / "bin" / "uv"
    if not uv.is_file():
        raise RuntimeError(f"{uv} missing: scripts/bootstrap.sh installs it")
    return str(uv)


@pytest.fixture(scope="module")
def login_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with the locked base dependencies only (no `worker` extra, no dev tools)."""
    venv = tmp_path_factory.mktemp("login") / "venv"
    subprocess.run(
        [_uv(), "sync", "--frozen", "--offline", "--no-install-project", "--quiet",
         "--python", sys.executable],
        cwd=REPO, env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)}, check=True,
    )  # fmt: skip
    return venv / "bin" / "python"


def _run(python: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args], capture_output=True, text=True, timeout=120,
        env={**(env or os.environ), "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def test_the_worker_extra_is_absent(login_python: Path) -> None:
    for module in ("pier", "docker", "litellm"):
        probe = _run(login_python, "-c", f"import {module}")
        assert probe.returncode != 0, f"{module} is importable without the worker extra"
        assert "ModuleNotFoundError" in probe.stderr


def test_submit_dry_run_on_the_login_side(login_python: Path, tmp_path: Path, ready_broker: str) -> None:
    selection = make_selection(tmp_path / "sel", ["001", "002"])
    args = ["-m", "sciencebench", "submit", "--path", str(selection), "--agent", "oracle",
            "--jobs-dir", str(tmp_path / "jobs"), "--job-name", "login-only",
            "--skip-pull", "--dry-run"]  # fmt: skip
    done = _run(login_python, *args, env={**os.environ, "SCIENCEBENCH_BROKER_URL": ready_broker})
    assert done.returncode == 0, done.stderr
    assert "dry run: 2 trial(s) of 2 task(s)" in done.stdout
    assert (selection / "batch-run.json").is_file()
    # A dry run checks the live hosts as a submit does; without a broker it says in one line it did not.
    (selection / "batch-run.json").unlink()
    gone = _run(
        login_python,
        *args,
        env={**os.environ, "SCIENCEBENCH_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"},
    )
    assert gone.returncode == 0, gone.stderr
    assert "dry run: not checked here: the live worker hosts' roots" in gone.stdout
    assert (selection / "batch-run.json").is_file()


def test_no_login_module_imports_the_worker_side(login_python: Path) -> None:
    script = (
        "import importlib, pkgutil, sys\n"
        "import sciencebench.login as login, sciencebench.cli\n"
        "for info in pkgutil.walk_packages(login.__path__, 'sciencebench.login.'):\n"
        "    importlib.import_module(info.name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('pier', 'docker')\n"
        "                or m.startswith(('sciencebench.worker', 'sciencebench.network')))\n"
        "print(loaded)\n"
    )
    done = _run(login_python, "-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
