"""Running Pier: one process per trial, in its own process group, started warm or cold.

Pier runs in its own process group so a timeout or a cancel stops the whole
tree (Pier, docker compose, docker exec). Credentials reach Pier only
through its process environment (`pier_environment`); the argv
(`sciencebench.core.pier_argv`) carries `--ae KEY=${KEY}` templates. When
`pier` is the console script of this very environment, it starts warm:
forked from a zygote that imported it once (`zygote.py`), which saves about
7 s of CPU per trial. Anything else (another installation, a test double)
is executed cold, as is every run when the zygote is unavailable.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib.metadata
import logging
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from sciencebench.core.errors import PreflightError
from sciencebench.core.versions import parse_version
from sciencebench.worker.pier import bounded, zygote

logger = logging.getLogger(__name__)

# Where the `sciencebench` package lives: Pier imports our environment class and adapters.
SCIENCEBENCH_PATH = str(Path(__file__).parents[3])


# What Pier, the docker CLI and compose need of the worker's own environment; nothing else of it
# (its SCIENCEBENCH_* settings hold the broker password) reaches Pier or, through task
# templates and compose variables, a container.
PASSED_THROUGH = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY", "DOCKER_CONTEXT",
)  # fmt: skip
PASSED_THROUGH_PREFIXES = ("LC_",)


def pier_environment(
    base: dict[str, str],
    secrets: dict[str, str],
    platform: str,
    pythonpath: str,
    passed: tuple[str, ...] = (),
) -> dict[str, str]:
    """Pier's process environment: an allowlist of the worker's, the job's values, the platform.

    `secrets` are the env file's and `--agent-env`'s values (their keys were
    checked: none steers the harness). `passed` names further variables of
    the worker's environment its operator lets through (SCIENCEBENCH_PIER_ENV).
    LiteLLM must not fetch its price table (no internet on worker hosts), and
    sciencebench must be importable for the environment class and adapters.
    """
    env = {
        key: value
        for key, value in base.items()
        if key in PASSED_THROUGH or key in passed or key.startswith(PASSED_THROUGH_PREFIXES)
    }
    env.update(secrets)
    env["DOCKER_DEFAULT_PLATFORM"] = platform
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, base.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def zygote_environment(platform: str, passed: tuple[str, ...] = ()) -> dict[str, str]:
    """Pier's environment without any job's values: what the zygote imports Pier under."""
    return pier_environment(dict(os.environ), {}, platform, SCIENCEBENCH_PATH, passed)


@dataclass(frozen=True)
class PierRun:
    """How one Pier process ended."""

    exit_code: int
    duration_sec: float
    timed_out: bool
    cancelled: bool
    log_tail: str


class PierProcess(Protocol):
    """A started Pier: a `subprocess.Popen` (cold) or a `zygote.Run` (warm)."""

    pid: int

    def poll(self) -> int | None:
        """The exit code when the process has ended, else None."""
        ...

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code; raises subprocess.TimeoutExpired after `timeout`."""
        ...


def run_pier(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    timeout_sec: float,
    should_stop: Callable[[], bool] = lambda: False,
    poll_sec: float = 0.5,
    zygote_env: dict[str, str] | None = None,
    memory_limit: int = 0,
) -> PierRun:
    """Run Pier in its own process group; stop the group on timeout or cancel.

    Output goes to `log_path` (inside the private scratch directory). A stop
    sends SIGTERM to the group, then SIGKILL after a grace period.
    `zygote_env` (Pier's environment without secrets) allows a warm start.
    `memory_limit` bytes bound Pier's data (`bounded`; 0: unbounded): past
    them it exits `bounded.OUT_OF_MEMORY`.
    """
    started = time.monotonic()
    with log_path.open("wb") as log, contextlib.ExitStack() as stack:
        try:
            proc = start_pier(argv, env, cwd, log, zygote_env, memory_limit)
        except OSError as exc:
            log.write(f"cannot start {argv[0]}: {exc.strerror}\n".encode())
            return PierRun(127, 0.0, False, False, f"cannot start {argv[0]}: {exc.strerror}")
        wait_briefly = _exit_waiter(proc, stack)
        timed_out = cancelled = False
        while proc.poll() is None:
            if time.monotonic() - started > timeout_sec:
                timed_out = True
            elif should_stop():
                cancelled = True
            if timed_out or cancelled:
                stop_process_group(proc)
                break
            wait_briefly(poll_sec)
        code = proc.wait()
    return PierRun(
        exit_code=code,
        duration_sec=time.monotonic() - started,
        timed_out=timed_out,
        cancelled=cancelled,
        log_tail=_tail(log_path),
    )


def _exit_waiter(proc: PierProcess, stack: contextlib.ExitStack) -> Callable[[float], None]:
    """A wait that returns as soon as Pier exits, or after at most `timeout` seconds.

    `Popen.wait(timeout)` polls with sleeps of up to 50 ms, so a short run
    would be noticed late: a cold start is waited for through a pidfd. A
    warm run's exit code arrives on a socket, which its own wait selects on.
    """
    if isinstance(proc, subprocess.Popen):
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:  # an old kernel: fall back to polling
            pass
        else:
            stack.callback(os.close, pidfd)

            def pidfd_wait(timeout: float) -> None:
                select.select([pidfd], [], [], timeout)

            return pidfd_wait

    def poll_wait(timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)

    return poll_wait


def start_pier(
    argv: list[str], env: dict[str, str], cwd: Path, log: BinaryIO, zygote_env: dict[str, str] | None,
    memory_limit: int = 0,
) -> PierProcess:  # fmt: skip
    """Start Pier warm when `zygote_env` is given and argv[0] is ours, else cold; bounded by `memory_limit`.

    This environment's own Pier is bounded in its own process before it
    imports Pier (`bounded.bound_memory`: the data limit, and its end at a
    MemoryError), warm or cold. Another installation's gets the data limit
    alone, set before it is executed (util-linux's prlimit, else the child
    between fork and exec).
    """
    warm = _zygote_for(argv[0], zygote_env) if zygote_env is not None else None
    if warm is not None:
        try:
            return warm.spawn(argv, env, cwd, log, memory_limit)
        except zygote.ZygoteError as exc:
            _warn_once(f"starting Pier cold: {exc.strerror}")
            _forget(warm)
    if shutil.which(argv[0], path=env.get("PATH")) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    limit = bounded.data_limit(memory_limit) if memory_limit else 0
    own = warm_entry(argv[0]) if limit else None
    preexec: Callable[[], None] | None = None
    if own is not None:
        argv = [sys.executable, "-m", bounded.__name__, str(limit), own, *argv]
    elif limit and _PRLIMIT is not None:
        argv = [_PRLIMIT, f"--data={limit}:{limit}", "--", *argv]
    elif limit:
        preexec = functools.partial(_limited_child, limit)
    if _SETPRIV is not None:
        # setpriv sets the death signal and execs Pier (prlimit its limit): without a
        # preexec_fn the worker is not fully forked for every trial.
        argv = [_SETPRIV, "--pdeathsig", "TERM", "--", *argv]
    elif preexec is None:
        preexec = zygote.die_with_parent
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=preexec,
    )  # fmt: skip


def _limited_child(limit: int) -> None:
    """In a fresh child (no util-linux): the death signal, and the data limit of another Pier."""
    zygote.die_with_parent()
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def prewarm(pier_bin: str, zygote_env: dict[str, str]) -> int | None:
    """Start the zygote for `pier_bin` now (in the background); its pid, or None when cold."""
    warm = _zygote_for(pier_bin, zygote_env)
    return warm.pid if warm is not None else None


def warm_entry(pier_bin: str) -> str | None:
    """The entry point behind `pier_bin` when it is this environment's console script."""
    return _warm_entry(pier_bin, os.environ.get("PATH", ""))


@functools.cache
def _warm_entry(pier_bin: str, search_path: str) -> str | None:
    resolved = shutil.which(pier_bin, path=search_path)
    if resolved is None or Path(resolved).parent != Path(sys.executable).parent:
        return None
    for entry in importlib.metadata.entry_points(group="console_scripts", name=Path(resolved).name):
        return entry.value
    return None


# One zygote per entry point per process; worker processes forked later share it.
_zygotes: dict[str, zygote.Zygote] = {}
_zygotes_lock = threading.Lock()
_warned: set[str] = set()


def _zygote_for(pier_bin: str, zygote_env: dict[str, str]) -> zygote.Zygote | None:
    entry = warm_entry(pier_bin)
    if entry is None:
        return None
    with _zygotes_lock:
        warm = _zygotes.get(entry)
        if warm is None:
            try:
                warm = _zygotes[entry] = zygote.Zygote(entry, zygote_env)
            except OSError as exc:
                _warn_once(f"starting Pier cold: cannot start its zygote: {exc.strerror}")
                return None
        return warm


def _forget(warm: zygote.Zygote) -> None:
    """Drop a zygote that failed a run; the next warm start begins a new one."""
    with _zygotes_lock:
        if _zygotes.get(warm.entry) is warm:
            del _zygotes[warm.entry]
    warm.close()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


# util-linux's setpriv (Debian: essential) can set the death signal itself, its prlimit a limit.
_SETPRIV = shutil.which("setpriv")
_PRLIMIT = shutil.which("prlimit")


def stop_process_group(proc: PierProcess, grace_sec: float = 20.0) -> None:
    """SIGTERM the whole group, then SIGKILL whatever is left after `grace_sec`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_sec)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; make sure no straggler of the group survives.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


# --- the installed release --------------------------------------------------

_pier_versions: dict[str, str] = {}
_pier_lock = threading.Lock()


def pier_version(pier_bin: str, timeout_sec: float = 180.0) -> str:
    """The version `pier_bin --version` prints; cached per process (it takes ~10 s).

    Runs with LITELLM_LOCAL_MODEL_COST_MAP=True (no price-table download).
    Raises PreflightError when Pier cannot be found, run, or gives no version.
    """
    resolved = shutil.which(pier_bin)
    if resolved is None:
        raise PreflightError(f"Pier is not installed: {pier_bin!r} is not an executable on PATH")
    with _pier_lock:
        cached = _pier_versions.get(resolved)
        if cached is not None:
            return cached
        if Path(resolved).parent == Path(sys.executable).parent:
            # Pier installed beside sciencebench: its metadata answers at once.
            try:
                version = importlib.metadata.version("datacurve-pier")
            except importlib.metadata.PackageNotFoundError:
                version = ""
            if parse_version(version) is not None:
                _pier_versions[resolved] = version
                return version
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
        try:
            result = subprocess.run(
                [resolved, "--version"], env=env, capture_output=True, text=True,
                timeout=timeout_sec, check=False, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise PreflightError(f"`{pier_bin} --version` did not finish within {timeout_sec:.0f}s") from None
        except OSError as exc:
            raise PreflightError(f"cannot run Pier ({resolved}): {exc.strerror}") from None
        lines = result.stdout.strip().splitlines()
        version = lines[-1].split()[-1] if lines else ""
        if result.returncode != 0 or parse_version(version) is None:
            detail = " ".join((result.stderr or result.stdout).split())[-300:]
            raise PreflightError(
                f"`{pier_bin} --version` failed (exit {result.returncode}): {detail or 'no output'}"
            )
        _pier_versions[resolved] = version
        return version
