"""A bound on what a trial's containers write to their writable layers and volumes, watched while Pier runs.

overlay2 bounds a writable layer only on a filesystem with project quotas,
which worker hosts lack; unbounded, one agent filling its disk fills the
host's for every trial. So every `DISK_POLL_SEC` the worker asks the Engine
for the writable-layer size (`SizeRw`) of each container of the try's compose
projects (the online agent install's carry its project label too:
`network.offlineinstall`), plus the volumes it mounts (an image's `VOLUME`
is no part of `SizeRw`). One past the limit is killed at once and `exceeded` says which:
the try stops Pier and ends with a ResourceLimitError (`worker.stages`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import docker

from sciencebench.core.sizes import format_size
from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL
from sciencebench.dockerhost.naming import projects_of_trial
from sciencebench.worker.docker.engine import ENGINE_ERRORS, connect, one_line

log = logging.getLogger(__name__)

# How often the writable layers are measured (each is a walk of the layer's upper directory).
DISK_POLL_SEC = 3.0


def volume_names(attrs: dict[str, Any]) -> list[str]:
    """The volumes a container mounts (its entry of a container listing): anonymous, named, an image's."""
    return [
        str(m.get("Name")) for m in attrs.get("Mounts") or [] if m.get("Type") == "volume" and m.get("Name")
    ]


def written(attrs: dict[str, Any], volumes: Mapping[str, int]) -> int:
    """What a container wrote: its writable layer (`SizeRw`) and the volumes it mounts (`volumes`: sizes)."""
    size = attrs.get("SizeRw")
    layer = size if isinstance(size, int) and size > 0 else 0
    return layer + sum(max(volumes.get(name, 0), 0) for name in volume_names(attrs))


def over_limit(
    containers: list[dict[str, Any]], limit: int, volumes: Mapping[str, int] | None = None
) -> dict[str, Any] | None:
    """The first of `containers` (a listing with sizes) that wrote more than `limit` bytes (`written`)."""
    for attrs in containers:
        if written(attrs, volumes or {}) > limit:
            return attrs
    return None


def volume_sizes(api: docker.APIClient) -> dict[str, int]:
    """The size of every volume of the Engine (its disk usage report, volumes only), by name."""
    # docker-py's `df` has no `type`; asked for volumes only, the Engine measures nothing else.
    url = api._url("/system/df")  # type: ignore[attr-defined]
    report = api._result(api._get(url, params={"type": "volume"}), True)  # type: ignore[attr-defined]
    return {
        str(volume.get("Name")): int((volume.get("UsageData") or {}).get("Size") or 0)
        for volume in report.get("Volumes") or []
    }


def limit_message(attrs: dict[str, Any], limit: int, volumes: Mapping[str, int] | None = None) -> str:
    """What the record says of a container past the limit (`attrs`: its entry of a container listing)."""
    names = attrs.get("Names") or [str(attrs.get("Id", "?"))[:12]]
    name = str(names[0]).lstrip("/")
    where = "its writable layer and volumes" if volume_names(attrs) else "its writable layer"
    return (
        f"container {name} wrote {format_size(written(attrs, volumes or {}))} to {where}, "
        f"past this host's limit of {format_size(limit)} (worker --disk-limit); the trial was ended"
    )


class DiskWatch:
    """Polls the writable layers of the containers of the trials `trial_names` gives, until stopped.

    `trial_names` is called at every poll (Pier picks a trial's name once it
    starts: the try's trial directories name them). `exceeded` is the message
    of the first container found past `limit` bytes (it was killed), else None.
    """

    def __init__(
        self,
        limit: int,
        trial_names: Callable[[], list[str]],
        poll_sec: float = DISK_POLL_SEC,
        client_factory: Callable[[], docker.DockerClient] = connect,
    ) -> None:
        self.limit = limit
        self.trial_names = trial_names
        self.poll_sec = poll_sec
        self.client_factory = client_factory
        self.exceeded: str | None = None
        self._stop = threading.Event()
        self._client: docker.DockerClient | None = None
        self._thread = threading.Thread(target=self._run, name="disk-watch", daemon=True)

    def start(self) -> DiskWatch:
        """Start polling in a thread of its own."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling; returns once the thread has ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._client is not None:
            self._client.close()
            self._client = None

    def _run(self) -> None:
        while not self._stop.wait(self.poll_sec):
            try:
                if self.check():
                    return
            except Exception as exc:  # the engine gone for a moment: measured again at the next poll
                log.warning("disk watch: %s", one_line(str(exc) or exc.__class__.__name__))
                if self._client is not None:
                    self._client.close()
                    self._client = None

    def check(self) -> bool:
        """Measure once; True when a container was past the limit (killed, `exceeded` set)."""
        names = self.trial_names()
        if not names:
            return False
        matches = [projects_of_trial(name) for name in names]
        if self._client is None:
            self._client = self.client_factory()
        api = self._client.api
        projects = {
            str((summary.get("Labels") or {}).get(COMPOSE_PROJECT_LABEL, ""))
            for summary in api.containers(filters={"label": COMPOSE_PROJECT_LABEL})
        }
        sizes = [
            summary
            for project in sorted(p for p in projects if any(match(p) for match in matches))
            # size=True: the Engine measures each listed container's writable layer (SizeRw)
            for summary in api.containers(size=True, filters={"label": f"{COMPOSE_PROJECT_LABEL}={project}"})
        ]
        # Volumes are measured only when a container mounts one (the Engine walks every volume).
        volumes = volume_sizes(api) if any(volume_names(summary) for summary in sizes) else {}
        found = over_limit(sizes, self.limit, volumes)
        if found is None:
            return False
        self.exceeded = limit_message(found, self.limit, volumes)
        try:
            api.kill(found["Id"])
        except ENGINE_ERRORS as exc:  # already stopped; Pier is stopped next
            log.warning("disk watch: killing %s: %s", found.get("Names"), one_line(str(exc)))
        return True


@contextmanager
def watching(limit: int, trial_names: Callable[[], list[str]]) -> Iterator[Callable[[], str | None]]:
    """While inside, a `DiskWatch` of `limit` bytes (none for 0); yields what reads its `exceeded`."""
    if limit <= 0:
        yield lambda: None
        return
    watch = DiskWatch(limit, trial_names).start()
    try:
        yield lambda: watch.exceeded
    finally:
        watch.stop()
