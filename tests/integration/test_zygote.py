"""The Pier zygote: a warm start must be the process a cold start would have been.

Real processes throughout: a real zygote (`python -m sciencebench.worker.pier.zygote`)
preloading `tests/fixtures/toy_entry.py` for the mechanics, and real Pier
0.3.0 for the path `sciencebench.worker.pier.process` takes on worker hosts.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sciencebench.worker.pier import process, zygote
from tests.fixtures.services import FAKE_PIER, REPO, VENV_BIN

pytestmark = pytest.mark.integration

TOY = "tests.fixtures.toy_entry:main"
CANARY = "sk-zygote-canary-41f9"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _report(log_path: Path) -> dict[str, Any]:
    return json.loads(log_path.read_text().splitlines()[0])  # type: ignore[no-any-return]


@pytest.fixture
def toy_env(tmp_path: Path) -> dict[str, str]:
    """The zygote's own environment: importable tests, and where the toy logs its imports."""
    return dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
                TOY_IMPORT_LOG=str(tmp_path / "imports.log"))  # fmt: skip


@pytest.fixture
def toy(toy_env: dict[str, str]) -> Iterator[zygote.Zygote]:
    started = zygote.Zygote(TOY, toy_env)
    yield started
    started.close()


def _run(z: zygote.Zygote, args: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> zygote.Run:
    with log_path.open("wb") as log:
        return z.spawn(["toy", *args], env, cwd, log)


def test_a_run_is_what_a_cold_start_would_be(toy: zygote.Zygote, tmp_path: Path) -> None:
    cwd = tmp_path / "scratch"
    cwd.mkdir()
    run = _run(toy, ["exit", "3", "--path", str(cwd)], {"ONLY": "this", "PATH": "/usr/bin:/bin"}, cwd,
               tmp_path / "run.log")  # fmt: skip
    assert run.wait(timeout=30) == 3
    seen = _report(tmp_path / "run.log")
    assert seen["argv"] == ["toy", "exit", "3", "--path", str(cwd)]
    assert seen["cwd"] == str(cwd)
    assert seen["env"] == {"ONLY": "this", "PATH": "/usr/bin:/bin"}  # exactly the run's environment
    assert seen["pid"] == run.pid
    assert seen["ppid"] == toy.pid
    assert seen["sid"] == seen["pgid"] == run.pid  # its own session: a stop reaches its whole group
    assert seen["stdin"] == "/dev/null"
    assert seen["cmdline"] == f"toy exit 3 --path {cwd}"  # `ps` shows what runs


def test_exit_codes_and_errors_are_reported_as_popen_does(toy: zygote.Zygote, tmp_path: Path) -> None:
    raised = _run(toy, ["raise"], {}, tmp_path, tmp_path / "raise.log")
    assert raised.wait(timeout=30) == 1
    assert "RuntimeError: toy failure" in (tmp_path / "raise.log").read_text()  # traceback into its log
    text = _run(toy, ["exit-text"], {}, tmp_path, tmp_path / "text.log")
    assert text.wait(timeout=30) == 1
    assert "toy says no" in (tmp_path / "text.log").read_text()
    sleeper = _run(toy, ["sleep", "60"], {}, tmp_path, tmp_path / "sleep.log")
    assert sleeper.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(timeout=0.2)
    os.killpg(sleeper.pid, signal.SIGKILL)
    assert sleeper.wait(timeout=30) == -signal.SIGKILL
    assert sleeper.poll() == -signal.SIGKILL


def test_the_entry_point_is_imported_once(toy: zygote.Zygote, tmp_path: Path) -> None:
    runs = [_run(toy, ["exit", "0"], {}, tmp_path, tmp_path / f"{n}.log") for n in range(5)]
    assert [run.wait(timeout=30) for run in runs] == [0] * 5
    assert (tmp_path / "imports.log").read_text().split() == [str(toy.pid)]


def test_a_runs_secret_stays_in_that_run(toy: zygote.Zygote, tmp_path: Path) -> None:
    first = _run(toy, ["exit", "0"], {"API_KEY": CANARY}, tmp_path, tmp_path / "first.log")
    assert first.wait(timeout=30) == 0
    second = _run(toy, ["exit", "0"], {"OTHER": "1"}, tmp_path, tmp_path / "second.log")
    assert second.wait(timeout=30) == 0
    assert _report(tmp_path / "first.log")["env"] == {"API_KEY": CANARY}
    assert _report(tmp_path / "second.log")["env"] == {"OTHER": "1"}
    for part in ("environ", "cmdline"):
        assert CANARY.encode() not in Path(f"/proc/{toy.pid}/{part}").read_bytes()


def test_runs_from_many_threads_run_side_by_side(toy: zygote.Zygote, tmp_path: Path) -> None:
    go = tmp_path / "go"
    runs: list[zygote.Run] = []
    lock = threading.Lock()

    def start(n: int) -> None:
        run = _run(toy, ["await", str(go)], {}, tmp_path, tmp_path / f"t{n}.log")
        with lock:
            runs.append(run)

    threads = [threading.Thread(target=start, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len({run.pid for run in runs}) == 6
    assert all(_alive(run.pid) and run.poll() is None for run in runs)  # all six at once
    go.touch()
    assert [run.wait(timeout=30) for run in runs] == [0] * 6


def _grandchild(log_path: Path) -> int:
    """The pid of the `sleep` a `group` run started (its second log line)."""
    _wait_for(lambda: len(log_path.read_text().splitlines()) >= 2, 30, "the grandchild")
    return int(json.loads(log_path.read_text().splitlines()[1])["grandchild"])


@dataclass
class MiniWorker:
    """tests/fixtures/zygote_requester.py running: a zygote, a requester, its run."""

    host: subprocess.Popen[bytes]
    zygote: int
    requester: int
    run: int
    grandchild: int

    def kill(self) -> None:
        """SIGKILL the host and its forked requester together (a whole worker dying)."""
        _kill_group(self.host)


def _kill_group(host: subprocess.Popen[bytes]) -> None:
    if host.poll() is None:
        os.killpg(host.pid, signal.SIGKILL)
        host.wait(timeout=30)


@pytest.fixture
def mini_worker(toy_env: dict[str, str], tmp_path: Path) -> Iterator[MiniWorker]:
    host = subprocess.Popen([sys.executable, "-m", "tests.fixtures.zygote_requester", str(tmp_path)],
                            env=toy_env, cwd=REPO, start_new_session=True)  # fmt: skip
    try:
        _wait_for(lambda: (tmp_path / "pids.json").exists(), 60, "the run to start")
        pids = json.loads((tmp_path / "pids.json").read_text())
        grandchild = _grandchild(tmp_path / "run.log")
        yield MiniWorker(host, pids["zygote"], pids["requester"], pids["run"], grandchild)
    finally:
        _kill_group(host)


def test_a_run_dies_with_its_requester_while_the_zygote_lives_on(mini_worker: MiniWorker) -> None:
    """As in a worker: the main process starts the zygote, a forked pool process asks for
    the run; when that pool process is SIGKILLed the run's whole group must go."""
    run, grandchild = mini_worker.run, mini_worker.grandchild
    assert _alive(run) and _alive(grandchild)
    os.kill(mini_worker.requester, signal.SIGKILL)
    _wait_for(lambda: not _alive(run) and not _alive(grandchild), 15, "the run's group to end")
    assert _alive(mini_worker.zygote)  # the parent still holds it: other runs go on
    mini_worker.kill()
    _wait_for(lambda: not _alive(mini_worker.zygote), 15, "the zygote to exit with its last holder")


def test_when_every_holder_is_gone_the_runs_stop_and_the_zygote_exits(mini_worker: MiniWorker) -> None:
    """A whole worker SIGKILLed (main and pool processes at once): the zygote stops the runs'
    whole groups (PR_SET_PDEATHSIG alone would reach only their leaders), then exits."""
    assert _alive(mini_worker.run) and _alive(mini_worker.grandchild)
    mini_worker.kill()
    _wait_for(lambda: not _alive(mini_worker.run) and not _alive(mini_worker.grandchild), 15,
              "the run's group to end")  # fmt: skip
    _wait_for(lambda: not _alive(mini_worker.zygote), 15, "the zygote to exit")


def test_when_the_zygote_dies_its_runs_end_and_report_it(toy: zygote.Zygote, tmp_path: Path) -> None:
    run = _run(toy, ["group", "600"], {"PATH": os.environ["PATH"]}, tmp_path, tmp_path / "run.log")
    grandchild = _grandchild(tmp_path / "run.log")
    os.kill(toy.pid, signal.SIGKILL)
    assert run.wait(timeout=30) == zygote.LOST
    _wait_for(lambda: not _alive(run.pid) and not _alive(grandchild), 15, "the orphaned run's group to end")
    with (tmp_path / "late.log").open("wb") as log, pytest.raises(zygote.ZygoteError):
        toy.spawn(["toy", "exit", "0"], {}, tmp_path, log)


def test_the_zygote_exits_when_nobody_holds_it(toy: zygote.Zygote) -> None:
    assert _alive(toy.pid)
    toy.close()
    _wait_for(lambda: not _alive(toy.pid), 15, "the zygote to exit")


# --- sciencebench.worker.pier.process: when Pier starts warm, and real Pier through the zygote ----------


def test_only_this_environments_own_pier_starts_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    assert process.warm_entry("pier") == "pier.cli.main:app"
    assert process.warm_entry(str(VENV_BIN / "pier")) == "pier.cli.main:app"
    assert process.warm_entry(str(FAKE_PIER)) is None  # another program: executed cold
    assert process.warm_entry("no-such-pier") is None


@pytest.fixture
def fresh_zygotes() -> Iterator[None]:
    """sciencebench.worker.pier.process: per-process zygotes, started and stopped within one test."""
    assert process._zygotes == {}
    yield
    for started in list(process._zygotes.values()):
        started.close()
    process._zygotes.clear()


@pytest.mark.usefixtures("fresh_zygotes")
def test_real_pier_starts_warm_and_cold_when_its_zygote_is_gone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = process.pier_environment(
        dict(os.environ), {"API_KEY": CANARY}, "linux/amd64", process.SCIENCEBENCH_PATH
    )
    zygote_env = process.zygote_environment("linux/amd64")
    argv = [str(VENV_BIN / "pier"), "--version"]

    warm = process.run_pier(
        argv, env, tmp_path, tmp_path / "warm.log", timeout_sec=300, zygote_env=zygote_env
    )
    assert warm.exit_code == 0, warm.log_tail
    assert "0.3.0" in warm.log_tail
    (started,) = process._zygotes.values()
    assert CANARY.encode() not in Path(f"/proc/{started.pid}/environ").read_bytes()

    os.kill(started.pid, signal.SIGKILL)
    _wait_for(lambda: not _alive(started.pid), 15, "the zygote to die")
    with caplog.at_level(logging.WARNING, logger="sciencebench.worker.pier.process"):
        cold = process.run_pier(
            argv, env, tmp_path, tmp_path / "cold.log", timeout_sec=300, zygote_env=zygote_env
        )
    assert cold.exit_code == 0, cold.log_tail
    assert cold.log_tail == warm.log_tail  # the same output either way
    assert any("starting Pier cold" in r.getMessage() for r in caplog.records)
    assert process._zygotes == {}  # the dead one is forgotten; the next trial starts a new one


def test_an_entry_point_that_cannot_be_imported_fails_each_run_as_cold(
    toy_env: dict[str, str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    broken = zygote.Zygote("tests.fixtures.no_such_module:main", toy_env)
    try:
        run = _run(broken, ["exit", "0"], {}, tmp_path, tmp_path / "run.log")
        assert run.wait(timeout=30) == 1
        assert (
            "ModuleNotFoundError: No module named 'tests.fixtures.no_such_module'"
            in (tmp_path / "run.log").read_text()
        )
    finally:
        broken.close()
    said = capfd.readouterr().err.strip().splitlines()
    assert said == [
        "sciencebench zygote: cannot import tests.fixtures.no_such_module:main (ModuleNotFoundError: "
        "No module named 'tests.fixtures.no_such_module'); every run will try on its own"
    ]
