"""The Docker Engine side of a trial, as the trial runner sees it.

`DockerRuntime` is the `HostRuntime` of real worker hosts: preflight before
each trial (the slow Pier version probe is cached per process), pinned
pulls deduplicated per host, and removal of a trial's containers, networks,
volumes and derived images afterwards.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path

import docker

from sciencebench import dockerhost, preflight
from sciencebench.config import Settings
from sciencebench.errors import PreflightError
from sciencebench.plan import JobSpec

log = logging.getLogger(__name__)

# How long a passed preflight is trusted before the next trial checks again.
PREFLIGHT_TTL_SEC = 60.0


class DockerRuntime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.puller = dockerhost.ImagePuller(state=settings.state_dir)
        self._checked: dict[tuple[str, str, str], float] = {}
        self._client: docker.DockerClient | None = None
        self._client_pid = os.getpid()
        self._lock = threading.Lock()

    def preflight(self, job: JobSpec) -> None:
        """Raise PreflightError when this host cannot run the job's trials now."""
        key = (job.platform, str(job.jobs_dir), job.pier_bin)
        with self._lock:
            if time.monotonic() - self._checked.get(key, -PREFLIGHT_TTL_SEC) < PREFLIGHT_TTL_SEC:
                return
            preflight.check_host(platform=job.platform, jobs_dir=job.jobs_dir, pier_bin=job.pier_bin)
            self._checked[key] = time.monotonic()

    def _docker(self) -> docker.DockerClient | None:
        """One Docker client per process, reused across trials (none after a failure)."""
        if self._client_pid != os.getpid():
            self._client, self._client_pid = None, os.getpid()
        if self._client is None:
            try:
                self._client = dockerhost.connect()
            except PreflightError:
                return None  # cleanup_matching connects (and reports) by itself
        return self._client

    def ensure_images(self, refs: list[str], platform: str, skip_pull: bool) -> None:
        self.puller.ensure(refs, platform, skip_pull)

    def live_trial(self, task_dir_name: str) -> AbstractContextManager[None]:
        """Hold while Pier runs: a sweep by any worker of this host spares the trial."""
        prefix = dockerhost.pier_trial_prefix(task_dir_name)
        return dockerhost.trial_lease(prefix, state=self.settings.state_dir)

    def cleanup_trial(self, trial_name: str) -> None:
        report = dockerhost.cleanup_matching(dockerhost.projects_of_trial(trial_name), self._docker())
        for error in report.errors:
            log.warning("cleanup of %s: %s", trial_name, error)


def prepare_host(platform: str, pier_bin: str, settings: Settings) -> None:
    """Worker start: the host must pass preflight; then sweep crashed trials' leftovers."""
    preflight.check_host(platform=platform, jobs_dir=None, pier_bin=pier_bin)
    report = dockerhost.sweep_leftovers(state=settings.state_dir)
    if report.projects:
        log.warning("removed leftovers of crashed trials: %s", ", ".join(report.projects))


def host_preflight(platform: str, jobs_dir: Path | None, pier_bin: str, broker: bool) -> list[str]:
    """Lines for `sciencebench preflight`; raises PreflightError on the first failure."""
    report = preflight.check_host(platform=platform, jobs_dir=jobs_dir, pier_bin=pier_bin)
    lines = [f"ok: {line}" for line in report.lines()]
    if broker:
        from sciencebench.coord import RedisCoordinator
        from sciencebench.errors import BrokerUnavailableError
        from sciencebench.runrecord import public_url

        settings = Settings.from_env()
        try:
            RedisCoordinator(settings.broker_url).ping()
        except BrokerUnavailableError as exc:
            raise PreflightError(f"{exc} ({public_url(settings.broker_url)})") from None
        lines.append(f"ok: broker {public_url(settings.broker_url)} reachable")
    return lines
