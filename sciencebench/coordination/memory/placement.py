"""Placement's store in one process (`coordination.placement.PlacementStore`, the embedded mode's)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sciencebench.coordination.placement import (
    PULLING_TTL_SEC,
    HostImages,
    HostLine,
    HostLoad,
    PlacementStore,
    Pulling,
    Routed,
    earlier_keys,
    expected_of,
    host_lines,
)
from sciencebench.core.models import TrialState

if TYPE_CHECKING:
    from sciencebench.coordination.memory import MemoryCoordinator
    from sciencebench.core.models import Redispatch

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

    def lines(self, now: float) -> dict[str, HostLine]:
        """As over Redis, from the coordinator's running entries, states, records and the routes."""
        items: list[tuple[str, str, float | None, float]] = []
        for job in self._coord.live_jobs():
            states = self._coord.states(job)
            for key, payload in self._coord.running_entries(job).items():
                measured = self.estimate(job, payload)
                if payload.host:
                    status = states.get(key)
                    running = status is not None and status.state == TrialState.RUNNING
                    started = status.at if status is not None and running else now
                    items.append((payload.host, "end", measured, started))
                    continue
                with self._lock:
                    routed = self._routed.get((job, key))
                if routed is not None and routed.until > now:
                    items.append((routed.host, "line", measured, routed.at))
        return host_lines(items, now)

    def estimate(self, job: str, payload: Redispatch) -> float | None:
        """From the coordinator's records of the trial's earlier attempts."""
        return expected_of(self._coord.get_result(job, k) for k in earlier_keys(payload.trial.key))

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
