"""What task images this host holds, for image-aware placement (`coordination.placement`).

Only the pinned task images the host's trials used (its pull log, and the
image-use locks a trial takes on each of its images, pulled here or found
present: `worker.docker.imageholds.hold_images`) and that its Engine still has
are reported, with their sizes, and the throughput of its recent pulls;
nothing else the Engine holds (the proxy image, an operator's images). The
worker reports at start, within a second of each pull, eviction or first
use of an image (the pull log or the locks changed: `worker.main.watch_holdings`),
and every lease period (after a broker that lost its data).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import docker

from sciencebench.coordination.placement import HostImages, PlacementStore
from sciencebench.core.errors import PreflightError, PullError
from sciencebench.core.images import image_digest, normalize_repository
from sciencebench.core.mirrors import Mirror, upstream_name
from sciencebench.core.sizes import format_size
from sciencebench.worker.docker.engine import ENGINE_ERRORS, connect, one_line
from sciencebench.worker.docker.imageholds import IMAGES_DIR
from sciencebench.worker.docker.images import pull_log_path, read_pull_log

log = logging.getLogger(__name__)

# The pulls a host's throughput is measured over: its most recent ones.
THROUGHPUT_PULLS = 20


def host_images(
    state: Path, client: docker.DockerClient, at: float = 0.0, mirrors: tuple[Mirror, ...] = ()
) -> HostImages:
    """The task images trials used here that the Engine still has (`repository@digest`); pulls' bytes/s.

    An image pulled through a registry mirror is reported under its upstream
    name (the name trials ask for: `core.mirrors.upstream_name`).
    """
    records = read_pull_log(state)
    used = {image_digest(record.ref) for record in records}
    used |= {f"sha256:{lock.stem}" for lock in (state / IMAGES_DIR).glob("*.lock")}
    try:
        listed = client.api.images()
    except ENGINE_ERRORS as exc:
        raise PullError(f"cannot list images: {one_line(str(exc))}") from None
    images: dict[str, int] = {}
    for attrs in listed:
        for entry in attrs.get("RepoDigests") or []:
            name, sep, digest = str(entry).rpartition("@")
            if sep and digest in used:
                repository = upstream_name(normalize_repository(name), mirrors)
                images[f"{repository}@{digest}"] = int(attrs.get("Size") or 0)
    recent = [r for r in records if r.size > 0 and r.seconds > 0][-THROUGHPUT_PULLS:]
    seconds = sum(r.seconds for r in recent)
    rate = sum(r.size for r in recent) / seconds if seconds > 0 else 0.0
    return HostImages(images=images, bytes_per_sec=rate, at=at)


class HoldingsReporter:
    """Reports the host's images to the store when its pull log changed, or when asked to (`force`)."""

    def __init__(
        self, host: str, state: Path, store: PlacementStore, mirrors: tuple[Mirror, ...] = ()
    ) -> None:
        self.host, self.state, self.store, self.mirrors = host, state, store, mirrors
        self._seen: tuple[int, ...] | None = None
        self._failing = False  # the last try failed: said once, until a report goes through again
        self.line = ""  # the last report for `status`

    def _stamp(self) -> tuple[int, ...]:
        """The pull log's size and time, and the image locks' directory's time: what changes with a use."""
        stamp: list[int] = []
        for path in (pull_log_path(self.state), self.state / IMAGES_DIR):
            try:
                info = os.stat(path)
            except FileNotFoundError:
                stamp += [0, 0]
                continue
            stamp += [info.st_size, info.st_mtime_ns]
        return tuple(stamp)

    def tick(self, force: bool = False) -> bool:
        """Report if the pull log changed since the last report (or `force`); True when it reported."""
        stamp = self._stamp()
        if not force and stamp == self._seen:
            return False
        try:
            client = connect()
        except PreflightError as exc:
            return self._failed(exc)
        try:
            held = host_images(self.state, client, mirrors=self.mirrors)
        except PullError as exc:
            return self._failed(exc)
        finally:
            client.close()
        self.store.report(self.host, held)
        self._seen = stamp
        self.line = holdings_line(held)
        if self._failing:
            log.warning("reporting the task images this host holds again")
        self._failing = False
        return True

    def _failed(self, exc: Exception) -> bool:
        """A try that could not read the Engine: warned once per run of failures (it is tried again)."""
        if not self._failing:
            log.warning("cannot report the task images this host holds (trying again): %s", exc)
        self._failing = True
        return False


def holdings_line(held: HostImages) -> str:
    """`status`'s words for a report: `holds 4 task image(s) (1.2 GiB), pulls at 85.0 MiB/s`."""
    line = f"holds {len(held.images)} task image(s) ({format_size(sum(held.images.values()))})"
    if held.bytes_per_sec > 0:
        line += f", pulls at {format_size(int(held.bytes_per_sec))}/s"
    return line
