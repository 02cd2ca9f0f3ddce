"""Placement's store over Redis (`coordination.placement.PlacementStore`; its keys are listed there)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sciencebench.coordination import scripts
from sciencebench.coordination.keys import HOLDS_KEY, PULLING_KEY, ROUTED_KEY, ClusterKeys, JobKeys
from sciencebench.coordination.placement import (
    MEASURED_ATTEMPTS,
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
from sciencebench.coordination.protocol import Coordinator

if TYPE_CHECKING:
    from sciencebench.core.models import Redispatch

__all__ = ["RedisPlacementStore"]


class RedisPlacementStore(PlacementStore):
    """`PlacementStore` over the cluster's Redis (through the coordinator's client and outage handling)."""

    def __init__(self, coord: Coordinator) -> None:
        self._coord = coord
        self._loads = scripts.Registered(coord.client, scripts.PLACE_LOADS)
        self._report = scripts.Registered(coord.client, scripts.PLACE_REPORT)
        self._lines = scripts.Registered(coord.client, scripts.PLACE_LINES)

    def report(self, host: str, held: HostImages) -> None:
        """The host's report and its pulling marks of what it holds now, in one script."""
        args = [host, held.model_dump_json(), *held.images]
        self._coord.patiently(lambda: self._report("", "", args))

    def forget(self, host: str) -> None:
        """`HDEL` of its report."""
        self._coord.patiently(lambda: self._coord.client.hdel(HOLDS_KEY, host))

    def holdings(self) -> dict[str, HostImages]:
        """`HGETALL` of the reports (a report this version cannot read counts as holding nothing)."""
        raw: dict[Any, Any] = self._coord.patiently(lambda: self._coord.client.hgetall(HOLDS_KEY))
        return {str(host): _host_images(str(value)) for host, value in raw.items()}

    def route(self, job: str, key: str, routed: Routed) -> None:
        """`HSET` of the trial's route."""
        value = routed.model_dump_json()
        self._coord.patiently(lambda: self._coord.client.hset(ROUTED_KEY, f"{job}/{key}", value))

    def loads(self, now: float) -> dict[str, HostLoad]:
        """One script over the jobs' running entries and the routes (stale routes are dropped)."""
        flat = self._coord.patiently(lambda: self._loads("", "", [repr(now), ClusterKeys.job_prefix]))
        return {
            str(flat[i]): HostLoad(
                running=int(flat[i + 1]), routed=int(flat[i + 2]), waiting=int(flat[i + 3])
            )
            for i in range(0, len(flat), 4)
        }

    def lines(self, now: float) -> dict[str, HostLine]:
        """One script over the jobs' running entries, their states, earlier attempts' records and routes."""
        args: list[str | int] = [repr(now), ClusterKeys.job_prefix, MEASURED_ATTEMPTS]
        flat = [str(v) for v in self._coord.patiently(lambda: self._lines("", "", args))]
        return host_lines(
            ((flat[i], flat[i + 1], float(flat[i + 2]) if flat[i + 2] else None, float(flat[i + 3]))
             for i in range(0, len(flat), 4)),
            now,
        )  # fmt: skip

    def estimate(self, job: str, payload: Redispatch) -> float | None:
        """`MGET` of the records of the trial's earlier attempts."""
        result = JobKeys(job).result
        keys = [result(key) for key in earlier_keys(payload.trial.key)]
        records: list[Any] = self._coord.patiently(lambda: self._coord.client.mget(keys)) if keys else []
        return expected_of(None if r is None else str(r) for r in records)

    def mark_pulling(self, host: str, images: Iterable[str], at: float) -> None:
        """`HSET` of a mark per image."""
        value = Pulling(host=host, at=at).model_dump_json()
        mapping: dict[Any, Any] = dict.fromkeys(images, value)
        if mapping:
            self._coord.patiently(lambda: self._coord.client.hset(PULLING_KEY, mapping=mapping))

    def pulling(self, now: float) -> dict[str, Pulling]:
        """`HGETALL` of the marks; `HDEL` of the stale ones."""
        client = self._coord.client
        raw: dict[Any, Any] = self._coord.patiently(lambda: client.hgetall(PULLING_KEY))
        marks = {str(image): Pulling.model_validate_json(str(value)) for image, value in raw.items()}
        if stale := [image for image, mark in marks.items() if now - mark.at >= PULLING_TTL_SEC]:
            self._coord.patiently(lambda: client.hdel(PULLING_KEY, *stale))
        return {image: mark for image, mark in marks.items() if image not in stale}


def _host_images(value: str) -> HostImages:
    try:
        return HostImages.model_validate_json(value)
    except ValueError:
        return HostImages()
