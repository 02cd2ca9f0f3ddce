"""Placement's store in one process (`coordination.placement.PlacementStore`, the embedded mode's)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sciencebench.coordination.placement import (
    PULLING_TTL_SEC,
    HostImages,
    HostLoad,
    PlacementStore,
    Pulling,
    Routed,
)

if TYPE_CHECKING:
    from sciencebench.coordination.memory import MemoryCoordinator

__all__ = ["MemoryPlacementStore"]


class MemoryPlacementStore(PlacementStore):
    """The same in one process (the embedded mode's coordinator)."""

    def __init__(self, coord: MemoryCoordinator) -> None:
        self._coord = coord
        self._lock = threading.Lock()
        self._holds: dict[str, HostImages] = {}
        self._routed: dict[tuple[str, str], Routed] = {}
        self._pulling: dict[str, Pulling] = {}

    def report(self, host: str, held: HostImages) -> None:
        """Replace the host's report; drop its pulling marks of what it holds."""
        with self._lock:
            self._holds[host] = held
            for image in held.images:
                if image in self._pulling and self._pulling[image].host == host:
                    del self._pulling[image]

    def forget(self, host: str) -> None:
        """Drop the host's report."""
        with self._lock:
            self._holds.pop(host, None)

    def holdings(self) -> dict[str, HostImages]:
        """Every report."""
        with self._lock:
            return dict(self._holds)

    def route(self, job: str, key: str, routed: Routed) -> None:
        """Remember the route."""
        with self._lock:
            self._routed[(job, key)] = routed

    def loads(self, now: float) -> dict[str, HostLoad]:
        """As over Redis, from the coordinator's running entries and fair-share sent sets."""
        counts: dict[str, list[int]] = {}
        for job in self._coord.live_jobs():
            for payload in self._coord.running_entries(job).values():
                if payload.host:
                    counts.setdefault(payload.host, [0, 0, 0])[0] += 1
        with self._lock:
            for (job, key), routed in list(self._routed.items()):
                running = self._coord.running_entries(job).get(key)
                if running is None or running.host:  # started (it counts where it runs), or over
                    del self._routed[(job, key)]
                elif routed.until > now:
                    entry = counts.setdefault(routed.host, [0, 0, 0])
                    entry[1] += 1
                    entry[2] += 1 if routed.waits else 0
        return {host: HostLoad(*entry) for host, entry in counts.items()}

    def mark_pulling(self, host: str, images: Iterable[str], at: float) -> None:
        """A mark per image."""
        with self._lock:
            for image in images:
                self._pulling[image] = Pulling(host=host, at=at)

    def pulling(self, now: float) -> dict[str, Pulling]:
        """Every mark still fresh (the stale ones are dropped)."""
        with self._lock:
            for image in [i for i, mark in self._pulling.items() if now - mark.at >= PULLING_TTL_SEC]:
                del self._pulling[image]
            return dict(self._pulling)
