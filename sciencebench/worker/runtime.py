"""The Docker Engine side of a trial, as the trial runner sees it.

`DockerRuntime` is the `HostRuntime` of real worker hosts: preflight before
each trial (the slow Pier version probe is cached per process), pinned
pulls deduplicated per host, and removal of a trial's containers, networks,
volumes and derived images afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from sciencebench import coordination
from sciencebench.coordination.protocol import Coordinator
from sciencebench.coordination.registries import RedisRegistryMarks, first_pull
from sciencebench.core.errors import BrokerUnavailableError, PreflightError, PullError, RefusedError
from sciencebench.core.images import image_digest, image_repository, normalize_repository
from sciencebench.core.mirrors import MIRRORS_KEYWORD, mirrors_keyword, through_mirror
from sciencebench.core.models import JobSpec
from sciencebench.core.settings import Settings
from sciencebench.dockerhost.hostlocks import hold_live_trial, owner_id
from sciencebench.dockerhost.naming import pier_trial_prefix
from sciencebench.worker import preflight
from sciencebench.worker.docker.budget import ImageBudget
from sciencebench.worker.docker.cleanup import remove_trial, sweep_leftovers
from sciencebench.worker.docker.diskwatch import watching
from sciencebench.worker.docker.engine import ClientPerProcess, connect
from sciencebench.worker.docker.images import ImagePuller, pull_log_path

log = logging.getLogger(__name__)

# How long a passed preflight is trusted before the next trial checks again.
PREFLIGHT_TTL_SEC = 60.0


class DockerRuntime:
    """The `HostRuntime` of a real worker host (one per worker process).

    With the cluster's store (`coord`), no pull goes to a registry the cluster is backing off from.
    """

    def __init__(self, settings: Settings, coord: Coordinator | None = None) -> None:
        self.settings = settings
        self._coord = coord
        gate = self._registry_wait if coord is not None else None
        hold = self._mirror_hold if coord is not None and settings.mirrors else None
        self.puller = ImagePuller(
            state=settings.state_dir, image_budget=settings.image_budget, registry_gate=gate, pull_hold=hold
        )
        self._report: preflight.HostReport | None = None
        self._checked_at = -PREFLIGHT_TTL_SEC
        self._client = ClientPerProcess()
        self._lock = threading.Lock()

    def _registry_wait(self, registry: str) -> tuple[float, str] | None:
        """(seconds left, last answer) of the cluster's back-off from `registry`; None: pull now."""
        if self._coord is None:
            return None
        try:
            marks = RedisRegistryMarks(self._coord)
            state = marks.state(registry)
            wait = state.wait_sec(marks.now()) if state is not None else 0.0
        except Exception:  # the mark is advice: a store blip lets the pull go
            log.warning("registry %s: the cluster's back-off could not be read", registry, exc_info=True)
            return None
        return (wait, state.status) if state is not None and wait > 0 else None

    def _mirror_hold(self, ref: str) -> AbstractContextManager[None]:
        """Held while `ref` is pulled: through a mirror, one host of the cluster at a time (`first_pull`)."""
        registry = normalize_repository(image_repository(ref)).partition("/")[0]
        if self._coord is None or registry not in {mirror.host for mirror in self.settings.mirrors}:
            return contextlib.nullcontext()
        return first_pull(self._coord, image_digest(ref))

    def check_host(self, fresh: bool = False) -> preflight.HostReport:
        """Raise PreflightError when this host cannot run trials now.

        The engine answers and is >= 28, compose v2 is there, the worker's own
        Pier is 0.3.0, the host state dir is writable. A failure is the host's,
        not any job's. A passed check is trusted for a minute unless `fresh`
        (after a failed try: was it the host?); Pier's version stays cached.
        """
        with self._lock:
            stale = time.monotonic() - self._checked_at >= PREFLIGHT_TTL_SEC
            if self._report is None or stale or fresh:
                self._report = None
                self._report = preflight.check_host(
                    platform=None, pier_bin=self.settings.pier_bin, state_dir=self.settings.state_dir
                )
                self._checked_at = time.monotonic()
            return self._report

    def preflight(self, job: JobSpec) -> None:
        """Raise RefusedError when this host cannot run the job's trials at all (its platform)."""
        report = self.check_host()
        engine_os, _, engine_arch = report.platform.partition("/")
        try:
            preflight.check_platform(engine_os, engine_arch, job.platform)
        except PreflightError as exc:
            raise RefusedError(str(exc)) from None

    def environment_kwargs(self) -> dict[str, str]:
        """Host-side keywords of the policy environment: proxy image, agent install, owner id, pids limit."""
        kwargs = {
            "owner": owner_id(self.settings.state_dir),
            "agent_install": self.settings.agent_install,
            "pids_limit": str(self.settings.pids_limit),
            "agent_artifacts": str(self.settings.agent_artifacts),
        }
        if self.settings.npm_registry:
            kwargs["npm_registry"] = self.settings.npm_registry
        if self.settings.proxy_image:
            kwargs["proxy_image"] = self.settings.proxy_image
        if self.settings.registry_mirror:
            kwargs[MIRRORS_KEYWORD] = mirrors_keyword(self.settings.mirrors)
        return kwargs

    def local_refs(self, refs: list[str]) -> list[str]:
        """The names `refs` have on this host: through a registry mirror where one serves their registry.

        The pull, the pull log, the image budget and the trial's holds all use
        these names, as the trial's environment does (`core.mirrors`).
        """
        mirrors = self.settings.mirrors
        return [through_mirror(ref, mirrors) for ref in refs] if mirrors else list(refs)

    def ensure_images(self, refs: list[str], platform: str, skip_pull: bool) -> None:
        """Make every pinned image present for `platform` (at most once per host; through a mirror)."""
        self.puller.ensure(self.local_refs(refs), platform, skip_pull)

    def images_held(self, refs: list[str]) -> AbstractContextManager[None]:
        """Hold from before the pull to after the cleanup: no eviction on this host removes these images."""
        return self.puller.hold(self.local_refs(refs))

    def live_trial(self, task_dir_name: str) -> AbstractContextManager[None]:
        """Hold while Pier runs: a sweep by any worker of this host spares the trial."""
        return hold_live_trial(pier_trial_prefix(task_dir_name), state=self.settings.state_dir)

    def watch_disk(
        self, trial_names: Callable[[], list[str]]
    ) -> AbstractContextManager[Callable[[], str | None]]:
        """Watch the writable layers of these trials' containers against `--disk-limit` (`diskwatch`)."""
        return watching(self.settings.disk_limit, trial_names)

    def cleanup_trial(self, trial_name: str) -> None:
        """Remove the trial's compose projects (best effort; problems are logged)."""
        try:
            client = self._client.get()
        except PreflightError:
            client = None  # remove_trial connects (and reports) by itself
        report = remove_trial(trial_name, client)
        for error in report.errors:
            log.warning("cleanup of %s: %s", trial_name, error)


def images_report(settings: Settings) -> str:
    """The host's image-budget line for `status` ("" without a budget); PullError when the engine fails."""
    if settings.image_budget <= 0:
        return ""
    budget = ImageBudget(settings.image_budget, settings.state_dir, pull_log_path(settings.state_dir))
    try:
        client = connect()
    except PreflightError as exc:
        raise PullError(str(exc)) from None
    try:
        return budget.summary(client)
    finally:
        client.close()


def prepare_host(platform: str, settings: Settings) -> None:
    """Worker start: the host must pass preflight; then sweep crashed trials' leftovers."""
    preflight.check_host(platform=platform, pier_bin=settings.pier_bin, state_dir=settings.state_dir)
    if swept := sweep_crashed(settings):
        log.warning(swept)


def sweep_crashed(settings: Settings) -> str:
    """Remove what crashed trials of this host state left on the Engine (`sweep_leftovers`); what went.

    At a worker's start and a `submit --local`'s: a trial some process of the
    host runs now holds its live-trial lock and is spared. "" when nothing went.
    """
    report = sweep_leftovers(state=settings.state_dir)
    return f"removed leftovers of crashed trials: {', '.join(report.projects)}" if report.projects else ""


def host_preflight(platform: str, jobs_dir: Path | None, pier_bin: str, broker: bool) -> list[str]:
    """Lines for `sciencebench preflight`; raises PreflightError on the first failure."""
    report = preflight.check_host(platform=platform, jobs_dir=jobs_dir, pier_bin=pier_bin)
    lines = [f"ok: {line}" for line in report.lines()]
    settings = Settings.from_env()
    lines.append(f"ok: {preflight.ensure_proxy_image(settings.proxy_image)}")
    lines.append(f"ok: agents {'installed online' if settings.agent_install == 'online' else 'baked only'}")
    if broker:
        try:
            coordination.connect(settings).ping()
        except BrokerUnavailableError as exc:
            raise PreflightError(f"{exc} ({settings.public_broker_url})") from None
        lines.append(f"ok: broker {settings.public_broker_url} reachable")
    return lines
