"""What a trial runs with on a worker: coordination, the host's engine, the settings.

`WorkerContext` is built once per worker process (after Celery's prefork
fork: `worker_context`); the embedded mode builds its own with an in-memory
coordinator. `HostRuntime` is the seam to the container engine: the real one
is `runtime.DockerRuntime`.
"""

from __future__ import annotations

import os
import threading
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sciencebench.coordination import connect
from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.errors import WorkspaceError
from sciencebench.core.models import JobSpec
from sciencebench.core.paths import JobPaths
from sciencebench.core.settings import Settings


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
        """Host-side `--ek` keywords for the policy environment (proxy image, owner id)."""
        ...

    def ensure_images(self, refs: list[str], platform: str, skip_pull: bool) -> None:
        """Make every pinned image present for `platform`; raise PullError otherwise."""
        ...

    def images_held(self, refs: list[str]) -> AbstractContextManager[None]:
        """Hold while a try needs these images: the host's image budget never evicts them."""
        ...

    def live_trial(self, task_dir_name: str) -> AbstractContextManager[None]:
        """Hold while Pier runs a trial of this task directory (a leftover sweep spares it)."""
        ...

    def cleanup_trial(self, trial_name: str) -> None:
        """Remove the trial's containers, networks, volumes and derived images (best effort)."""
        ...


@dataclass
class WorkerContext:
    """One worker process's coordination, engine seam and settings; `owner` names its leases."""

    coord: Coordinator
    runtime: HostRuntime
    settings: Settings
    owner: str = field(default_factory=lambda: f"{os.getpid()}-{uuid.uuid4().hex[:8]}")


_context: WorkerContext | None = None
_context_lock = threading.Lock()
_settings: Settings | None = None


def use_settings(settings: Settings) -> None:
    """The settings every WorkerContext of this process (and its forks) is built with."""
    global _settings
    _settings = settings


def worker_context() -> WorkerContext:
    """The process's WorkerContext, built on first use (after a prefork fork).

    Its `settings.hostname` is the Celery node name (`w1@host`) that
    `worker.main` set before forking: every pause, unfit mark and record of
    this worker says that one name.
    """
    global _context
    with _context_lock:
        if _context is None:
            settings = _settings or Settings.from_env()
            coord = connect(settings)
            _context = WorkerContext(coord=coord, runtime=docker_runtime(settings), settings=settings)
        return _context


def docker_runtime(settings: Settings) -> HostRuntime:
    """The real engine seam (imported late: it loads the Docker SDK)."""
    from sciencebench.worker.runtime import DockerRuntime

    return DockerRuntime(settings)


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
