"""Pier's memory bound on real processes: past it a run ends, warm or cold, however it handles MemoryError.

A parser that swallows its MemoryError (`tests/fixtures/hog_entry.py`, as
Pier's log parsers catch `Exception`) still ends at its bound with
`bounded.OUT_OF_MEMORY`: forked by a real zygote, or started cold through
`python -m sciencebench.worker.pier.bounded`; the processes it starts have
the same limit. Another installation's Pier (not this environment's console
script) gets the data limit alone. Real Pier 0.3.0 starts under the
smallest bound a worker takes, warm and cold.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sciencebench.core.settings import MIN_PIER_MEMORY
from sciencebench.worker.pier import bounded, process, zygote
from tests.fixtures.services import REPO, VENV_BIN
from tests.integration.test_zygote import fresh_zygotes as fresh_zygotes

pytestmark = pytest.mark.integration

HOG = "tests.fixtures.hog_entry:main"
BOUND = MIN_PIER_MEMORY
SAID = "sciencebench: Pier went past its memory bound"


def _limits(text: str) -> list[list[str]]:
    """The (soft, hard) data limits a run printed (`hog limits`), one per line."""
    return [line.split()[3:5] for line in text.splitlines() if line.startswith("Max data size")]


@pytest.fixture
def hogs() -> Iterator[zygote.Zygote]:
    started = zygote.Zygote(HOG, dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1"))
    yield started
    started.close()


def _spawn(hogs: zygote.Zygote, action: str, log_path: Path, memory_limit: int) -> int:
    with log_path.open("wb") as log:
        run = hogs.spawn(["hog", action], {"PATH": os.environ["PATH"]}, log_path.parent, log, memory_limit)
    return run.wait(timeout=120)


def test_a_warm_run_and_what_it_starts_hold_its_bound(hogs: zygote.Zygote, tmp_path: Path) -> None:
    assert _spawn(hogs, "limits", tmp_path / "bounded.log", BOUND) == 0
    assert _limits((tmp_path / "bounded.log").read_text()) == [[str(BOUND)] * 2] * 2  # its own, its child's
    assert _spawn(hogs, "limits", tmp_path / "unbounded.log", 0) == 0  # 0: the zygote's own limit
    limits = resource.getrlimit(resource.RLIMIT_DATA)
    own = ["unlimited" if value == resource.RLIM_INFINITY else str(value) for value in limits]
    assert _limits((tmp_path / "unbounded.log").read_text()) == [own] * 2


def test_a_warm_run_past_its_bound_ends_though_it_swallows_the_memory_error(
    hogs: zygote.Zygote, tmp_path: Path
) -> None:
    assert _spawn(hogs, "hog", tmp_path / "hog.log", BOUND) == bounded.OUT_OF_MEMORY
    said = (tmp_path / "hog.log").read_text()
    assert f"{SAID} ({BOUND} bytes of data); stopped" in said and "swallowed" not in said
    assert _spawn(hogs, "limits", tmp_path / "next.log", BOUND) == 0  # the zygote serves the next run


def test_a_cold_run_past_its_bound_ends_too(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sciencebench.worker.pier.bounded", str(BOUND), HOG, "hog", "hog"],
        env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == bounded.OUT_OF_MEMORY, done.stdout + done.stderr
    assert SAID in done.stderr and "swallowed" not in done.stdout


def test_another_installations_pier_gets_the_data_limit_alone(tmp_path: Path) -> None:
    other = tmp_path / "other-pier"
    other.write_text("#!/bin/sh\ncat /proc/self/limits\n")
    other.chmod(0o755)
    run = process.run_pier(
        [str(other)], {"PATH": os.environ["PATH"]}, tmp_path, tmp_path / "other.log", timeout_sec=60,
        memory_limit=BOUND,
    )  # fmt: skip
    assert run.exit_code == 0, run.log_tail
    assert _limits((tmp_path / "other.log").read_text()) == [[str(BOUND)] * 2]


@pytest.mark.usefixtures("fresh_zygotes")
def test_real_pier_starts_under_the_smallest_bound_warm_and_cold(tmp_path: Path) -> None:
    env = process.pier_environment(dict(os.environ), {}, "linux/amd64", process.SCIENCEBENCH_PATH)
    argv = [str(VENV_BIN / "pier"), "--version"]
    for name, zygote_env in (("warm", process.zygote_environment("linux/amd64")), ("cold", None)):
        run = process.run_pier(
            argv, env, tmp_path, tmp_path / f"{name}.log", timeout_sec=300, zygote_env=zygote_env,
            memory_limit=BOUND,
        )  # fmt: skip
        assert run.exit_code == 0 and "0.3.0" in run.log_tail, (name, run.log_tail)
    assert len(process._zygotes) == 1  # the first was warm
