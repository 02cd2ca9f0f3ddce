"""Image registries that push back, backed off from per registry across the cluster.

A pull its registry refused (`core.errors.RegistryError`) marks the registry
in the store, one hash per host (`sciencebench:registry:<host>`): when the
next pull may go (`not_before`, the store's clock, only ever moved later),
the last answer and why, the refusals in a row. Every host's refused trials
wait until then (`worker.tries`). The wait is the registry's own when it
named one, else doubling with jitter, capped (`backoff_sec`); a mark lapses
`KEEP_SEC` after its wait. `status` shows each one still waiting (`RegistryState.line`).
"""

from __future__ import annotations

import contextlib
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from sciencebench.coordination.keys import ClusterKeys
from sciencebench.coordination.protocol import Coordinator

log = logging.getLogger(__name__)

REGISTRY_PREFIX = ClusterKeys.registry("")
# The longest one host's first pull of an image through a mirror holds the others' back (a holder
# that died holds it no longer): then they pull anyway.
FIRST_PULL_HOLD_SEC = 900.0
# How long a mark outlives its `not_before`: refusals within it count as in a row.
KEEP_SEC = 3600.0


def registry_key(registry: str) -> str:
    """`sciencebench:registry:<host>` (`ClusterKeys.registry`)."""
    return ClusterKeys.registry(registry)


@dataclass(frozen=True)
class RegistryState:
    """One registry's mark: when the next pull may go (store clock, epoch s), its last answer, why."""

    registry: str
    not_before: float
    status: str  # "429", "503", "reset", "refused", "timeout"
    reason: str
    failures: int  # refusals in a row, cluster-wide
    at: float  # when the last refusal was marked

    def wait_sec(self, now: float) -> float:
        """How long from `now` until the next pull may go (0: now)."""
        return max(0.0, self.not_before - now)

    def line(self, now: float) -> str:
        """`status`'s line: "docker.io: rate-limited (429), next try in 4m; <reason>"."""
        what = "rate-limited" if self.status == "429" else f"failing ({self.status})"
        if self.status == "429":
            what += " (429)"
        left = self.wait_sec(now)
        when = f"next try in {_duration(left)}" if left > 0 else "trying again"
        refusals = f", {self.failures} refusals in a row" if self.failures > 1 else ""
        return f"registry {self.registry}: {what}, {when}{refusals}; {self.reason}"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    if seconds >= 60:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:.0f}s"


def backoff_sec(
    failures: int, hint_sec: float | None, base_sec: float, cap_sec: float,
    rng: Callable[[], float] = random.random,
) -> float:  # fmt: skip
    """The wait after the `failures`-th refusal in a row.

    The registry's own wait (`hint_sec`) when it named one, plus up to 10 %
    jitter (hosts that all read the same hint do not come back at once);
    else `base_sec` doubling per refusal, capped at `cap_sec`, jittered to
    between half and all of it. A hint is honoured past the cap: the registry
    knows its window.
    """
    if hint_sec is not None:
        return max(hint_sec, 0.0) * (1.0 + 0.1 * rng())
    exponential = min(base_sec * 2.0 ** max(failures - 1, 0), cap_sec)
    return exponential * (0.5 + 0.5 * rng())


class RegistryMarks(ABC):
    """The registries' marks of a store."""

    @abstractmethod
    def now(self) -> float:
        """The store's clock (epoch s)."""

    @abstractmethod
    def _read(self, registry: str) -> dict[str, Any]:
        """The registry's raw fields ({} when unmarked)."""

    @abstractmethod
    def _write(self, registry: str, fields: dict[str, str], keep_sec: float) -> None:
        """Store the registry's fields, to lapse `keep_sec` from now."""

    @abstractmethod
    def _registries(self) -> list[str]:
        """Every marked registry."""

    def state(self, registry: str) -> RegistryState | None:
        """The registry's mark; None when it has none."""
        fields = self._read(registry)
        return _state(registry, fields) if fields else None

    def states(self) -> list[RegistryState]:
        """Every registry's mark, sorted by registry."""
        found = (self.state(registry) for registry in sorted(self._registries()))
        return [state for state in found if state is not None]

    def refused(
        self, registry: str, status: str, reason: str, hint_sec: float | None, base_sec: float, cap_sec: float
    ) -> RegistryState:
        """Mark a refusal of `registry`: its next pull waits (`backoff_sec`); the new mark.

        `not_before` only moves later: a host's refusal never shortens a wait another host set.
        """
        now = self.now()
        old = self._read(registry)
        failures = int(old.get("failures", 0) or 0) + 1
        wait = backoff_sec(failures, hint_sec, base_sec, cap_sec)
        not_before = max(float(old.get("not_before", 0) or 0), now + wait)
        fields: dict[str, str] = {
            "not_before": repr(not_before), "status": status, "reason": reason[:300],
            "failures": str(failures), "at": repr(now),
        }  # fmt: skip
        self._write(registry, fields, not_before - now + KEEP_SEC)
        return _state(registry, fields)


def _state(registry: str, fields: dict[str, Any]) -> RegistryState:
    return RegistryState(
        registry=registry, not_before=float(fields.get("not_before", 0) or 0),
        status=str(fields.get("status", "")), reason=str(fields.get("reason", "")),
        failures=int(fields.get("failures", 0) or 0), at=float(fields.get("at", 0) or 0),
    )  # fmt: skip


class RedisRegistryMarks(RegistryMarks):
    """`RegistryMarks` over the coordinator's Redis: one hash per registry, plain commands."""

    def __init__(self, coord: Coordinator) -> None:
        self._coord = coord

    def now(self) -> float:
        """The server's clock."""
        return self._coord.now()

    def _read(self, registry: str) -> dict[str, Any]:
        client = self._coord.client
        return cast("dict[str, Any]", self._coord.patiently(lambda: client.hgetall(registry_key(registry))))

    def _write(self, registry: str, fields: dict[str, str], keep_sec: float) -> None:
        client, key = self._coord.client, registry_key(registry)

        def write() -> None:
            with client.pipeline() as pipe:
                mapping: dict[Any, Any] = dict(fields)
                pipe.hset(key, mapping=mapping)
                pipe.expire(key, max(int(keep_sec), 1))
                pipe.execute()

        self._coord.patiently(write)

    def _registries(self) -> list[str]:
        client = self._coord.client
        keys = self._coord.patiently(lambda: list(client.scan_iter(match=f"{REGISTRY_PREFIX}*", count=100)))
        return [str(key).removeprefix(REGISTRY_PREFIX) for key in keys]


@contextlib.contextmanager
def first_pull(coord: Coordinator, digest: str, hold_sec: float = FIRST_PULL_HOLD_SEC) -> Iterator[None]:
    """Hold while this host pulls the image `digest` through a registry mirror: one host at a time.

    A pull-through cache asks its upstream for an image's manifest on every
    pull its cache misses, so hosts pulling a new image at once would each
    reach the upstream registry. Through this lock (`ClusterKeys.mirror_pull`)
    the first host pulls alone; the others wait for it, then find the image in
    the mirror's cache. It is advice: a wait past `hold_sec`, or a store that
    fails, lets the pull go.
    """
    lock = coord.client.lock(ClusterKeys.mirror_pull(digest), timeout=hold_sec, sleep=0.1,
                             blocking_timeout=hold_sec)  # fmt: skip
    try:
        held = bool(lock.acquire())
    except Exception:  # the lock is advice: a store blip lets the pull go
        log.warning("the cluster's first pull of %s could not be awaited", digest, exc_info=True)
        held = False
    try:
        yield
    finally:
        if held:
            with contextlib.suppress(Exception):  # it lapses by itself
                lock.release()
