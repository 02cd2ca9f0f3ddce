"""A cluster-wide concurrency limit per model gateway, for backing off from one that pushes back.

Every job's trials that send inference to the same gateway authority
(`host:port` of the job's provider base URL) share one limit, kept in the
store: it halves (never below 1) when a trial ends in a provider error and
grows back by one on each trial that got its answers (`GatewayLimits`). A
trial takes one of the authority's slots before its Pier run starts and
gives it back after; a slot is a lease its holder renews (`GatewaySlot`),
so a lost worker's slot lapses by itself. Other authorities are not
affected. Its keys are listed in `coordination.keys`, its scripts are `lua/gateway_*.lua`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any, cast

from sciencebench.coordination import scripts
from sciencebench.coordination.keys import GATEWAYS_KEY, ClusterKeys
from sciencebench.coordination.protocol import Coordinator


@dataclass(frozen=True)
class GatewayLimit:
    """One authority's current limit, the slots held now, and the last provider status that moved it."""

    authority: str
    limit: int
    ceiling: int
    held: int
    status: str  # the last provider status that halved it, "" when none did
    reason: str  # what last changed it, for `status`
    at: float  # when (epoch s)
    error_at: float = 0.0  # when the last provider error halved it (epoch s; 0: never)


class GatewayLimits:
    """The per-authority limits of the coordinator's store, every change one script (`lua/gateway_*.lua`).

    A limit starts at the first job's `--n-concurrent`, halves (never below 1)
    when a trial ends in a provider error (`TrialRecord.provider_status`), once
    per round (a try that took its slot before the last halving saw the old
    concurrency and halves nothing again), and grows back by one, up to the
    largest `--n-concurrent` seen, on each trial that got its answers.
    """

    def __init__(self, coord: Coordinator) -> None:
        self._coord = coord
        self._acquire = scripts.Registered(coord.client, scripts.GATEWAY_ACQUIRE)
        self._renew = scripts.Registered(coord.client, scripts.GATEWAY_RENEW)
        self._adjust = scripts.Registered(coord.client, scripts.GATEWAY_ADJUST)

    def acquire(self, authority: str, member: str, n_concurrent: int, ttl_sec: float) -> bool:
        """Take (or refresh) one of the authority's slots for `ttl_sec`; False when all are held.

        The authority's limit is created at `n_concurrent`; a larger
        `n_concurrent` raises its ceiling (what it grows back to).
        """
        args: list[Any] = [member, n_concurrent, int(ttl_sec * 1000), authority]
        return bool(self._coord.patiently(lambda: self._acquire("", "", args, authority)))

    def renew(self, authority: str, member: str, ttl_sec: float) -> bool:
        """Extend a held slot's lease; False when it is no longer held."""
        args: list[Any] = [member, int(ttl_sec * 1000)]
        return bool(self._coord.patiently(lambda: self._renew("", "", args, authority)))

    def release(self, authority: str, member: str) -> None:
        """Give a slot back."""
        self._coord.patiently(lambda: self._coord.client.zrem(ClusterKeys.gateway_slots(authority), member))

    def provider_error(self, authority: str, status: str, since: float = float("inf")) -> int:
        """Halve the authority's limit (never below 1) because of `status`; the new limit.

        `since` is when (`now`) the failed try took its slot: a try that took it
        before the last halving leaves the limit as it is (its status is recorded).
        """
        args = ["error", status, repr(min(since, 1e18))]
        return int(self._coord.patiently(lambda: self._adjust("", "", args, authority)))

    def now(self) -> float:
        """The store's clock (epoch s), as `provider_error`'s `since` and `GatewayLimit.at` use it."""
        return self._coord.now()

    def success(self, authority: str) -> int:
        """Grow the authority's limit by one, up to its ceiling; the new limit."""
        args = ["success", "", "0"]
        return int(self._coord.patiently(lambda: self._adjust("", "", args, authority)))

    def limits(self) -> list[GatewayLimit]:
        """Every authority's limit, sorted by authority."""
        client = self._coord.client
        now_ms = self._coord.now() * 1000

        def read() -> list[tuple[str, dict[str, Any], int]]:
            rows = []
            for authority in sorted(cast("set[str]", client.smembers(GATEWAYS_KEY))):
                fields = cast("dict[str, Any]", client.hgetall(ClusterKeys.gateway(authority)))
                held = int(client.zcount(ClusterKeys.gateway_slots(authority), now_ms, "+inf"))
                rows.append((authority, fields, held))
            return rows

        return [
            _limit(authority, fields, held)
            for authority, fields, held in self._coord.patiently(read)
            if fields
        ]


def _limit(authority: str, fields: dict[str, Any], held: int) -> GatewayLimit:
    return GatewayLimit(
        authority=authority, limit=int(fields.get("limit", 0)), ceiling=int(fields.get("ceiling", 0)),
        held=held, status=str(fields.get("status", "")), reason=str(fields.get("reason", "")),
        at=float(fields.get("at", 0) or 0), error_at=float(fields.get("error_at", 0) or 0),
    )  # fmt: skip


class GatewaySlot:
    """One trial's slot of its gateway authority, waited for, renewed while held, then given back.

    `wait` polls until a slot is free (or `should_stop` says the trial must
    stop: then it returns False); while held, a thread renews the slot's
    lease every `ttl_sec / 4`, so a worker that dies leaves a slot that lapses.
    """

    def __init__(
        self, limits: GatewayLimits, authority: str, member: str, n_concurrent: int, ttl_sec: float
    ) -> None:
        self.limits, self.authority, self.member = limits, authority, member
        self.n_concurrent, self.ttl_sec = n_concurrent, ttl_sec
        self.waited_sec = 0.0
        self.acquired_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wait(self, should_stop: Any, poll_sec: float = 0.5) -> bool:
        """Block until the slot is held (True) or `should_stop()` (False)."""
        started = time.monotonic()
        while not self.limits.acquire(self.authority, self.member, self.n_concurrent, self.ttl_sec):
            if should_stop():
                return False
            time.sleep(poll_sec)
        self.waited_sec = time.monotonic() - started
        self.acquired_at = self.limits.now()
        self._thread = threading.Thread(target=self._renew, daemon=True, name=f"gateway {self.member}")
        self._thread.start()
        return True

    def _renew(self) -> None:
        while not self._stop.wait(max(self.ttl_sec / 4, 0.2)):
            try:
                self.limits.renew(self.authority, self.member, self.ttl_sec)
            except Exception:  # a broker blip: the lease lapses if it lasts  # noqa: S112
                continue

    def release(self) -> None:
        """Stop renewing and give the slot back (best effort: a lost store lets it lapse)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):  # a lost store: it lapses with its lease
            self.limits.release(self.authority, self.member)
