"""The only module that knows Pier's command line and on-disk layout.

Rendering argv is pure. Running Pier puts it in its own process group so a
timeout or a cancel stops the whole tree (Pier, docker compose, docker exec).
Credentials reach Pier only through its process environment: argv carries
`--ae KEY=${KEY}` templates that Pier resolves from that environment.

When `pier` is the console script of this very environment, it starts warm:
forked from a zygote that imported it once (see `zygote.py`), which saves
about 7 s of CPU per trial. Anything else (another installation, a test
double) is executed cold, as is every run when the zygote is unavailable.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import importlib.metadata
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from sciencebench import zygote
from sciencebench.plan import JobSpec, TrialSpec

logger = logging.getLogger(__name__)

# Where the `sciencebench` package lives: Pier imports our environment class and adapters.
SCIENCEBENCH_PATH = str(Path(__file__).parent.parent)
# Pier names trial directories `<task dir name[:32]>__<7 random chars>`.
TRIAL_DIR = re.compile(r"^(task_\d{3,})__([A-Za-z0-9]+)$")
STAGES = ("environment_setup", "agent_setup", "agent_execution", "verifier")


def _fmt(value: float) -> str:
    return repr(float(value))


def render_argv(job: JobSpec, trial: TrialSpec, scratch_jobs_dir: Path, pier_job_name: str) -> list[str]:
    """Pier argv for exactly one trial in a private job directory.

    Always `--n-attempts 1 --n-concurrent 1 --no-force-build --no-delete
    --yes`: attempts and concurrency are sciencebench's business, images are
    prebuilt and shared, and nothing may prompt.
    """
    argv = [
        job.pier_bin,
        "run",
        "--path", str(trial.task_dir),
        "--jobs-dir", str(scratch_jobs_dir),
        "--job-name", pier_job_name,
        "--n-attempts", "1",
        "--n-concurrent", "1",
        "--max-retries", "0",
        "--no-force-build",
        "--no-delete",
        "--yes",
        "--quiet",
        "--env", job.env,
        "--environment-import-path", job.environment_import_path,
    ]  # fmt: skip
    gateway_urls = [gateway.url for gateway in job.agent.gateways]
    if gateway_urls:
        argv += ["--ek", f"inference_urls={json.dumps(gateway_urls)}"]
    if job.agent_timeout_multiplier is not None:
        argv += ["--agent-timeout-multiplier", _fmt(job.agent_timeout_multiplier)]
    if job.verifier_timeout_multiplier is not None:
        argv += ["--verifier-timeout-multiplier", _fmt(job.verifier_timeout_multiplier)]
        argv += ["--environment-build-timeout-multiplier", _fmt(job.verifier_timeout_multiplier)]
    if job.agent.agent_import_path:
        argv += ["--agent-import-path", job.agent.agent_import_path]
    elif job.agent.agent:
        argv += ["--agent", job.agent.agent]
    for model in job.agent.models:
        argv += ["--model", model]
    for key, value in job.agent.agent_kwargs.items():
        argv += ["--ak", f"{key}={value}"]
    for name in job.agent.agent_env_names:
        argv += ["--ae", f"{name}=${{{name}}}"]
    return argv


def pier_environment(
    base: dict[str, str], secrets: dict[str, str], platform: str, pythonpath: str
) -> dict[str, str]:
    """Pier's process environment: the worker's, the secrets, the platform.

    LiteLLM must not fetch its price table (no internet on worker hosts), and
    sciencebench must be importable for the environment class and adapters.
    """
    env = dict(base)
    env.update(secrets)
    env["DOCKER_DEFAULT_PLATFORM"] = platform
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, base.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def zygote_environment(platform: str) -> dict[str, str]:
    """Pier's environment without any secret: what the zygote imports Pier under."""
    return pier_environment(dict(os.environ), {}, platform, SCIENCEBENCH_PATH)


@dataclass(frozen=True)
class PierRun:
    exit_code: int
    duration_sec: float
    timed_out: bool
    cancelled: bool
    log_tail: str


class PierProcess(Protocol):
    """A started Pier: a `subprocess.Popen` (cold) or a `zygote.Run` (warm)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def run_pier(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    timeout_sec: float,
    should_stop: Callable[[], bool] = lambda: False,
    poll_sec: float = 0.5,
    zygote_env: dict[str, str] | None = None,
) -> PierRun:
    """Run Pier in its own process group; stop the group on timeout or cancel.

    Output goes to `log_path` (inside the private scratch directory). A stop
    sends SIGTERM to the group, then SIGKILL after a grace period.
    `zygote_env` (Pier's environment without secrets) allows a warm start.
    """
    started = time.monotonic()
    with log_path.open("wb") as log, contextlib.ExitStack() as stack:
        try:
            proc = start_pier(argv, env, cwd, log, zygote_env)
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
    argv: list[str], env: dict[str, str], cwd: Path, log: BinaryIO, zygote_env: dict[str, str] | None
) -> PierProcess:
    """Start Pier warm when `zygote_env` is given and argv[0] is ours, else cold."""
    warm = _zygote_for(argv[0], zygote_env) if zygote_env is not None else None
    if warm is not None:
        try:
            return warm.spawn(argv, env, cwd, log)
        except zygote.ZygoteError as exc:
            _warn_once(f"starting Pier cold: {exc.strerror}")
            _forget(warm)
    if shutil.which(argv[0], path=env.get("PATH")) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    if _SETPRIV is not None:
        # setpriv sets the death signal and execs Pier: without a preexec_fn the
        # worker is not fully forked for every trial.
        argv = [_SETPRIV, "--pdeathsig", "TERM", "--", *argv]
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=None if _SETPRIV is not None else _die_with_parent,
    )  # fmt: skip


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


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the worker process that started it dies.

    Pier runs in its own session (so a stop reaches its whole group), which
    also detaches it from the worker; without this, a killed worker would
    leave an orphaned Pier running a trial that is already being redone.
    """
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1
# Resolved once in the parent: nothing is looked up between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True)
# util-linux's setpriv (Debian: essential) can set the death signal itself.
_SETPRIV = shutil.which("setpriv")


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


def pier_version_of(pier_bin: str, env: dict[str, str], timeout_sec: float = 120.0) -> str:
    """Ask the Pier installation behind `pier_bin` for its version."""
    result = subprocess.run(
        [pier_bin, "--version"], env=env, capture_output=True, text=True,
        timeout=timeout_sec, check=False,
    )  # fmt: skip
    text = (result.stdout or result.stderr).strip().splitlines()
    return text[-1].split()[-1] if text else ""


# --- reading what Pier wrote ----------------------------------------------


def find_trial_dirs(pier_job_dir: Path) -> list[Path]:
    """Trial directories Pier created inside one job directory."""
    if not pier_job_dir.is_dir():
        return []
    return sorted(p for p in pier_job_dir.iterdir() if p.is_dir() and TRIAL_DIR.match(p.name))


@dataclass(frozen=True)
class TrialOutcome:
    rewards: dict[str, float] | None
    exception_type: str | None
    exception_message: str | None
    timings_sec: dict[str, float]


def _seconds(timing: Any) -> float | None:
    if not isinstance(timing, dict) or not timing.get("started_at") or not timing.get("finished_at"):
        return None
    start = datetime.fromisoformat(timing["started_at"])
    end = datetime.fromisoformat(timing["finished_at"])
    return round((end - start).total_seconds(), 3)


def read_trial_outcome(trial_dir: Path) -> TrialOutcome:
    """Read a trial's `result.json` (Pier's TrialResult). Raises OSError/ValueError."""
    data = json.loads((trial_dir / "result.json").read_text(encoding="utf-8"))
    verifier = data.get("verifier_result") or {}
    rewards = verifier.get("rewards")
    exception = data.get("exception_info") or {}
    timings = {stage: s for stage in STAGES if (s := _seconds(data.get(stage))) is not None}
    return TrialOutcome(
        rewards={k: float(v) for k, v in rewards.items()} if isinstance(rewards, dict) else None,
        exception_type=exception.get("exception_type"),
        exception_message=(exception.get("exception_message") or "")[:2000] or None,
        timings_sec=timings,
    )
