"""What task images this host holds, for image-aware placement (`coordination.placement`).

Only the pinned task images the host pulled for trials (its pull log) and
that its Engine still has are reported, with their sizes, and the
throughput of its recent pulls; nothing else the Engine holds (the proxy
image, an operator's images). The host keeper reports at start, within a
quarter lease of each pull or eviction (the pull log changed), and every
lease period (after a broker that lost its data).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import docker

from sciencebench.coordination.placement import HostImages, PlacementStore
from sciencebench.core.errors import PreflightError, PullError
from sciencebench.core.images import normalize_repository, repo_digest_name
from sciencebench.worker.docker.engine import ENGINE_ERRORS, connect, one_line
from sciencebench.worker.docker.images import pull_log_path, read_pull_log

log = logging.getLogger(__name__)

# The pulls a host's throughput is measured over: its most recent ones.
THROUGHPUT_PULLS = 20


def host_images(state: Path, client: docker.DockerClient, at: float = 0.0) -> HostImages:
    """The task images of the pull log the Engine has now, by `repository@digest`, and the pulls' bytes/s."""
    records = read_pull_log(state)
    wanted = {repo_digest_name(record.ref) for record in records}
    try:
        listed = client.api.images()
    except ENGINE_ERRORS as exc:
        raise PullError(f"cannot list images: {one_line(str(exc))}") from None
    images: dict[str, int] = {}
    for attrs in listed:
        for entry in attrs.get("RepoDigests") or []:
            name, sep, digest = str(entry).rpartition("@")
            pinned = f"{normalize_repository(name)}@{digest}"
            if sep and pinned in wanted:
                images[pinned] = int(attrs.get("Size") or 0)
    recent = [r for r in records if r.size > 0 and r.seconds > 0][-THROUGHPUT_PULLS:]
    seconds = sum(r.seconds for r in recent)
    rate = sum(r.size for r in recent) / seconds if seconds > 0 else 0.0
    return HostImages(images=images, bytes_per_sec=rate, at=at)


class HoldingsReporter:
    """Reports the host's images to the store when its pull log changed, or when asked to (`force`)."""

    def __init__(self, host: str, state: Path, store: PlacementStore) -> None:
        self.host, self.state, self.store = host, state, store
        self._seen: tuple[int, int] | None = None

    def _stamp(self) -> tuple[int, int]:
        try:
            info = os.stat(pull_log_path(self.state))
        except FileNotFoundError:
            return (0, 0)
        return (info.st_size, info.st_mtime_ns)

    def tick(self, force: bool = False) -> bool:
        """Report if the pull log changed since the last report (or `force`); True when it reported."""
        stamp = self._stamp()
        if not force and stamp == self._seen:
            return False
        try:
            client = connect()
        except PreflightError as exc:
            log.warning("cannot report the task images this host holds: %s", exc)
            return False
        try:
            held = host_images(self.state, client)
        except PullError as exc:
            log.warning("cannot report the task images this host holds: %s", exc)
            return False
        finally:
            client.close()
        self.store.report(self.host, held)
        self._seen = stamp
        return True
