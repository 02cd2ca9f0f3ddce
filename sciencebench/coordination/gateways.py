"""A cluster-wide concurrency limit per model gateway, for backing off from one that pushes back.

Every job's trials that send inference to the same gateway authority
(`host:port` of the job's provider base URL) share one limit, kept in the
store: it halves (never below 1) when a trial ends in a provider error and
grows back by one on each trial that got its answers (`GatewayLimits`). A
trial takes one of the authority's slots before its Pier run starts and
gives it back after; a slot is a lease its holder renews (`GatewaySlot`),
so a lost worker's slot lapses by itself. Other authorities are not
affected. Its keys are listed in `coordination.keys`.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sciencebench.coordination.protocol import PREFIX, Coordinator

if TYPE_CHECKING:
    from sciencebench.coordination.redis import RedisCoordinator

GATEWAYS_KEY = f"{PREFIX}:gateways"


def gateway_key(authority: str, *parts: str) -> str:
    """`sciencebench:gateway:<authority>[:part]`."""
    return ":".join((PREFIX, "gateway", authority, *parts))


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


class GatewayLimits(ABC):
    """The per-authority limits of a store.

    A limit starts at the first job's `--n-concurrent`, halves (never below 1)
    when a trial ends in a provider error (`TrialRecord.provider_status`), once
    per round (a try that took its slot before the last halving saw the old
    concurrency and halves nothing again), and grows back by one, up to the
    largest `--n-concurrent` seen, on each trial that got its answers.
    """

    @abstractmethod
    def acquire(self, authority: str, member: str, n_concurrent: int, ttl_sec: float) -> bool:
        """Take (or refresh) one of the authority's slots for `ttl_sec`; False when all are held.

        The authority's limit is created at `n_concurrent`; a larger
        `n_concurrent` raises its ceiling (what it grows back to).
        """

    @abstractmethod
    def renew(self, authority: str, member: str, ttl_sec: float) -> bool:
        """Extend a held slot's lease; False when it is no longer held."""

    @abstractmethod
    def release(self, authority: str, member: str) -> None:
        """Give a slot back."""

    @abstractmethod
    def provider_error(self, authority: str, status: str, since: float = float("inf")) -> int:
        """Halve the authority's limit (never below 1) because of `status`; the new limit.

        `since` is when (`now`) the failed try took its slot: a try that took it
        before the last halving leaves the limit as it is (its status is recorded).
        """

    @abstractmethod
    def now(self) -> float:
        """The store's clock (epoch s), as `provider_error`'s `since` and `GatewayLimit.at` use it."""

    @abstractmethod
    def success(self, authority: str) -> int:
        """Grow the authority's limit by one, up to its ceiling; the new limit."""

    @abstractmethod
    def limits(self) -> list[GatewayLimit]:
        """Every authority's limit, sorted by authority."""


# Take (or refresh) a slot: create the limit at ARGV[2] (raising the ceiling to it), drop expired
# holders, admit the caller if it holds one already or fewer than the limit are held.
_ACQUIRE = """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[2])
redis.call('sadd', KEYS[3], ARGV[4])
if redis.call('hsetnx', KEYS[1], 'limit', n) == 1 then
  redis.call('hset', KEYS[1], 'ceiling', n, 'status', '', 'reason', 'started at --n-concurrent ' .. n,
             'at', t[1])
elseif tonumber(redis.call('hget', KEYS[1], 'ceiling') or '0') < n then
  redis.call('hset', KEYS[1], 'ceiling', n)
end
local limit = tonumber(redis.call('hget', KEYS[1], 'limit'))
redis.call('zremrangebyscore', KEYS[2], '-inf', now)
if redis.call('zscore', KEYS[2], ARGV[1]) or redis.call('zcard', KEYS[2]) < limit then
  redis.call('zadd', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
  return 1
end
return 0
"""
_RENEW = """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = redis.call('zscore', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then
  return 0
end
redis.call('zadd', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""
# ARGV[1]: 'error' (halve, ARGV[2] the status) or 'success' (+1 up to the ceiling).
_ADJUST = """
local t = redis.call('time')
local limit = tonumber(redis.call('hget', KEYS[1], 'limit') or '0')
if limit == 0 then
  return 0
end
local ceiling = tonumber(redis.call('hget', KEYS[1], 'ceiling') or limit)
local new = limit
if ARGV[1] == 'error' then
  local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
  if tonumber(ARGV[3]) < tonumber(redis.call('hget', KEYS[1], 'error_at') or '0') then
    redis.call('hset', KEYS[1], 'status', ARGV[2])
    return limit
  end
  new = math.max(1, math.floor(limit / 2))
  redis.call('hset', KEYS[1], 'limit', new, 'status', ARGV[2], 'at', now, 'error_at', now,
             'reason', 'provider error ' .. ARGV[2] .. ': halved from ' .. limit)
elseif limit < ceiling then
  new = limit + 1
  redis.call('hset', KEYS[1], 'limit', new, 'at', t[1], 'reason', 'a trial got its answers: +1')
end
return new
"""


class RedisGatewayLimits(GatewayLimits):
    """`GatewayLimits` over the coordinator's Redis, every change one script."""

    def __init__(self, coord: RedisCoordinator) -> None:
        self._coord = coord
        client = coord.client
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._adjust = client.register_script(_ADJUST)

    def acquire(self, authority: str, member: str, n_concurrent: int, ttl_sec: float) -> bool:
        """See `GatewayLimits.acquire`."""
        keys = [gateway_key(authority), gateway_key(authority, "slots"), GATEWAYS_KEY]
        args: list[Any] = [member, n_concurrent, int(ttl_sec * 1000), authority]
        return bool(self._coord.patiently(lambda: self._acquire(keys=keys, args=args)))

    def renew(self, authority: str, member: str, ttl_sec: float) -> bool:
        """See `GatewayLimits.renew`."""
        args: list[Any] = [member, int(ttl_sec * 1000)]
        keys = [gateway_key(authority, "slots")]
        return bool(self._coord.patiently(lambda: self._renew(keys=keys, args=args)))

    def release(self, authority: str, member: str) -> None:
        """See `GatewayLimits.release`."""
        self._coord.patiently(lambda: self._coord.client.zrem(gateway_key(authority, "slots"), member))

    def provider_error(self, authority: str, status: str, since: float = float("inf")) -> int:
        """See `GatewayLimits.provider_error`."""
        keys, args = [gateway_key(authority)], ["error", status, repr(min(since, 1e18))]
        return int(self._coord.patiently(lambda: self._adjust(keys=keys, args=args)))

    def now(self) -> float:
        """The server's clock."""
        return self._coord.now()

    def success(self, authority: str) -> int:
        """See `GatewayLimits.success`."""
        keys, args = [gateway_key(authority)], ["success", "", "0"]
        return int(self._coord.patiently(lambda: self._adjust(keys=keys, args=args)))

    def limits(self) -> list[GatewayLimit]:
        """See `GatewayLimits.limits`."""
        client = self._coord.client
        now_ms = self._coord.now() * 1000

        def read() -> list[tuple[str, dict[str, Any], int]]:
            rows = []
            for authority in sorted(cast("set[str]", client.smembers(GATEWAYS_KEY))):
                fields = cast("dict[str, Any]", client.hgetall(gateway_key(authority)))
                held = int(client.zcount(gateway_key(authority, "slots"), now_ms, "+inf"))
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


class MemoryGatewayLimits(GatewayLimits):
    """The same limits in one process (`submit --local`), leases on the monotonic clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fields: dict[str, dict[str, Any]] = {}
        self._slots: dict[str, dict[str, float]] = {}

    def acquire(self, authority: str, member: str, n_concurrent: int, ttl_sec: float) -> bool:
        """See `GatewayLimits.acquire`."""
        with self._lock:
            fields = self._fields.get(authority)
            if fields is None:
                fields = {"limit": n_concurrent, "ceiling": n_concurrent, "status": "", "at": time.time(),
                          "reason": f"started at --n-concurrent {n_concurrent}"}  # fmt: skip
                self._fields[authority] = fields
            fields["ceiling"] = max(fields["ceiling"], n_concurrent)
            slots = self._live(authority)
            if member in slots or len(slots) < fields["limit"]:
                slots[member] = time.monotonic() + ttl_sec
                return True
            return False

    def _live(self, authority: str) -> dict[str, float]:
        slots = self._slots.setdefault(authority, {})
        now = time.monotonic()
        for member in [m for m, expiry in slots.items() if expiry <= now]:
            del slots[member]
        return slots

    def renew(self, authority: str, member: str, ttl_sec: float) -> bool:
        """See `GatewayLimits.renew`."""
        with self._lock:
            slots = self._live(authority)
            if member not in slots:
                return False
            slots[member] = time.monotonic() + ttl_sec
            return True

    def release(self, authority: str, member: str) -> None:
        """See `GatewayLimits.release`."""
        with self._lock:
            self._slots.get(authority, {}).pop(member, None)

    def provider_error(self, authority: str, status: str, since: float = float("inf")) -> int:
        """See `GatewayLimits.provider_error`."""
        with self._lock:
            fields = self._fields.get(authority)
            if fields is None:
                return 0
            fields["status"] = status
            if since < fields.get("error_at", 0.0):
                return int(fields["limit"])
            old = fields["limit"]
            now = time.time()
            fields.update(limit=max(1, old // 2), status=status, at=now, error_at=now,
                          reason=f"provider error {status}: halved from {old}")  # fmt: skip
            return int(fields["limit"])

    def now(self) -> float:
        """This process's clock."""
        return time.time()

    def success(self, authority: str) -> int:
        """See `GatewayLimits.success`."""
        with self._lock:
            fields = self._fields.get(authority)
            if fields is None:
                return 0
            if fields["limit"] < fields["ceiling"]:
                fields.update(limit=fields["limit"] + 1, at=time.time(), reason="a trial got its answers: +1")
            return int(fields["limit"])

    def limits(self) -> list[GatewayLimit]:
        """See `GatewayLimits.limits`."""
        with self._lock:
            return [
                _limit(authority, fields, len(self._live(authority)))
                for authority, fields in sorted(self._fields.items())
            ]


_MEMORY: weakref.WeakKeyDictionary[Coordinator, MemoryGatewayLimits] = weakref.WeakKeyDictionary()
_MEMORY_LOCK = threading.Lock()


def gateway_limits(coord: Coordinator) -> GatewayLimits:
    """The gateway limits kept in `coord`'s store (Redis, or the embedded mode's memory)."""
    from sciencebench.coordination.redis import RedisCoordinator

    if isinstance(coord, RedisCoordinator):
        return RedisGatewayLimits(coord)
    with _MEMORY_LOCK:
        if coord not in _MEMORY:
            _MEMORY[coord] = MemoryGatewayLimits()
        return _MEMORY[coord]


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
