"""What a trial runs with on a worker: coordination, the host's engine, the settings, Pier, the clock.

The trial logic (`worker.trial`) takes its `WorkerContext` as an argument.
A worker process builds its own once, after Celery's prefork fork
(`worker_context`), from the builder its entry point set (`use_context`:
`worker.main`, else the Celery task module's default); the embedded mode
builds one on its embedded store, unit tests one with a fake
`HostRuntime`. `HostRuntime` is the seam to the container engine: the real
one is `runtime.DockerRuntime`.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.errors import WorkspaceError
from sciencebench.core.models import JobSpec
from sciencebench.core.paths import JobPaths
from sciencebench.core.settings import Settings
from sciencebench.worker.pier.process import PierRun, run_pier


class HostRuntime(Protocol):
    """What a trial needs from its host's container engine."""

    def check_host(self, fresh: bool = False) -> object:
        """Raise PreflightError when this host cannot run any trial now (the host's fault).

        A recent passed check may be reused unless `fresh`.
        """
        ...

    def preflight(self, job: JobSpec) -> None:
        """Raise RefusedError when this host cannot run this job's trials at all (the job's fault)."""
        ...

    def environment_kwargs(self) -> dict[str, str]:
        """Host-side `--ek` keywords for the policy environment (proxy image, owner id, pids limit)."""
        ...

    def ensure_images(self, refs: list[str], platform: str, skip_pull: bool) -> None:
        """Make every pinned image present for `platform`; raise PullError otherwise."""
        ...

    def images_held(self, refs: list[str]) -> AbstractContextManager[None]:
        """Hold from a trial's claim to its last cleanup: the host's image budget evicts none of these."""
        ...

    def live_trial(self, task_dir_name: str) -> AbstractContextManager[None]:
        """Hold while Pier runs a trial of this task directory (a leftover sweep spares it)."""
        ...

    def cleanup_trial(self, trial_name: str) -> None:
        """Remove the trial's containers, networks, volumes and derived images (best effort)."""
        ...

    def watch_disk(
        self, trial_names: Callable[[], list[str]]
    ) -> AbstractContextManager[Callable[[], str | None]]:
        """Hold while Pier runs: yields what says why a container of these trials went past the disk limit."""
        ...


class PierRunner(Protocol):
    """How a try runs Pier: one process until it exits, times out or must stop (`process.run_pier`)."""

    def __call__(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        timeout_sec: float,
        should_stop: Callable[[], bool] = ...,
        poll_sec: float = ...,
        zygote_env: dict[str, str] | None = None,
        memory_limit: int = 0,
    ) -> PierRun:
        """Run Pier's `argv` in `cwd`, its output in `log_path`, its data within `memory_limit`; its end."""
        ...


@dataclass
class WorkerContext:
    """One worker process's coordination, engine seam and settings; `owner` names its leases.

    `pier` runs Pier and `sleep` waits (between tries, for a slot in the
    embedded mode): the real ones unless a unit test gives its own.
    """

    coord: Coordinator
    runtime: HostRuntime
    settings: Settings
    owner: str = field(default_factory=lambda: f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
    pier: PierRunner = run_pier
    sleep: Callable[[float], None] = time.sleep


_context: WorkerContext | None = None
_context_lock = threading.Lock()
_build: Callable[[], WorkerContext] | None = None


def use_context(build: Callable[[], WorkerContext]) -> None:
    """How this process (and its forks) builds its WorkerContext: set once by the worker's entry point."""
    global _build, _context
    with _context_lock:
        _build, _context = build, None


def worker_context(default: Callable[[], WorkerContext]) -> WorkerContext:
    """The process's WorkerContext, built on first use (after a prefork fork).

    Built by what `use_context` set, else by `default`. A worker's
    `settings.hostname` is the Celery node name (`w1@host`) that
    `worker.main` set before forking: every pause, unfit mark and record of
    this worker says that one name.
    """
    global _context
    with _context_lock:
        if _context is None:
            _context = (_build or default)()
        return _context


def docker_runtime(settings: Settings, coord: Coordinator | None = None) -> HostRuntime:
    """The real engine seam (imported late: it loads the Docker SDK); `coord` shares registry back-offs."""
    from sciencebench.worker.runtime import DockerRuntime

    return DockerRuntime(settings, coord)


_job_cache: dict[Path, tuple[float, JobSpec]] = {}


def load_job(paths: JobPaths) -> JobSpec:
    """The JobSpec of a job, cached per process until job.json changes."""
    try:
        mtime = paths.job_spec.stat().st_mtime
        cached = _job_cache.get(paths.job_spec)
        if cached and cached[0] == mtime:
            return cached[1]
        job = JobSpec.model_validate_json(paths.job_spec.read_bytes())
    except OSError as exc:
        raise WorkspaceError(
            f"{paths.job_spec}: unreadable on this worker ({exc.strerror}); "
            "is the jobs directory on the shared filesystem?"
        ) from None
    _job_cache[paths.job_spec] = (mtime, job)
    return job
