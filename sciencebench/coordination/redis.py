"""The coordination contract over Redis: every operation is one round trip or one script.

Operations wait out a broker outage of up to `outage_sec`: a restart or a
network blip must not turn a finished trial into a lost one, so commands are
retried with backoff and only a longer outage raises BrokerUnavailableError.
`recovered_at` (monotonic) is when the last outage ended, for the watchdog's
grace period. Keys are listed in `coordination.protocol`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, override

import redis
from redis.typing import EncodableT

from sciencebench.coordination.protocol import JOBS_KEY, PREFIX, Coordinator, job_key
from sciencebench.core.errors import BrokerUnavailableError
from sciencebench.core.models import Redispatch, TrialState, TrialStatus

# Refresh a lease we own; re-create it when it lapsed while nobody could
# renew it (a broker outage) and no other run has taken the trial since.
_RENEW = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
if not holder then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""
# Take (or refresh) a concurrency slot: drop expired holders, then admit
# the caller if it already holds a slot or fewer than the cap are held.
_SLOT = """
local now = tonumber(ARGV[1])
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
if redis.call('zscore', KEYS[1], ARGV[2]) or redis.call('zcard', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('zadd', KEYS[1], now + tonumber(ARGV[4]), ARGV[2])
  return 1
end
return 0
"""


_OUTAGE_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


class RedisCoordinator(Coordinator):
    """`Coordinator` over Redis (see the module docstring); `ping` answers at once."""

    def __init__(self, url: str, outage_sec: float = 900.0) -> None:
        self._redis: redis.Redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
        self.outage_sec = outage_sec
        self._recovered_at = float("-inf")
        self._renew_script = self._redis.register_script(_RENEW)
        self._release_script = self._redis.register_script(_RELEASE)
        self._slot_script = self._redis.register_script(_SLOT)

    @property
    @override
    def recovered_at(self) -> float:
        """When (monotonic) the last broker outage ended; -inf when there was none."""
        return self._recovered_at

    def patiently[T](self, fn: Callable[[], T]) -> T:
        """Run `fn` (any Redis-backed call, e.g. Celery's result backend) waiting out outages.

        Raises BrokerUnavailableError when the broker stays unreachable for `outage_sec`.
        """
        started = time.monotonic()
        delay = 0.2
        failed = False
        while True:
            try:
                result = fn()
            except _OUTAGE_ERRORS as exc:
                failed = True
                if time.monotonic() - started > self.outage_sec:
                    raise BrokerUnavailableError(
                        f"broker unreachable for {self.outage_sec:.0f}s: {exc.__class__.__name__}"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if failed:
                self._recovered_at = time.monotonic()
            return result

    def ping(self) -> None:
        """Raise BrokerUnavailableError at once when the broker does not answer."""
        try:
            self._redis.ping()
        except redis.RedisError as exc:
            raise BrokerUnavailableError(f"broker unreachable: {exc.__class__.__name__}") from None

    # --- results

    @override
    def get_result(self, job: str, key: str) -> str | None:
        """The stored TrialRecord JSON of a trial, or None."""
        value = self.patiently(lambda: self._redis.get(job_key(job, "result", key)))
        return str(value) if value is not None else None

    @override
    def store_result(self, job: str, key: str, record_json: str) -> None:
        """Store a trial's TrialRecord JSON (the latest wins)."""
        self.patiently(lambda: self._redis.set(job_key(job, "result", key), record_json))

    @override
    def clear_result(self, job: str, key: str) -> None:
        """Forget a trial's record and its counted mark."""
        self.patiently(lambda: self._redis.delete(job_key(job, "result", key), job_key(job, "counted", key)))

    @override
    def mark_counted(self, job: str, key: str) -> None:
        """Remember that the chord counted this trial."""
        self.patiently(lambda: self._redis.set(job_key(job, "counted", key), "1"))

    @override
    def is_counted(self, job: str, key: str) -> bool:
        """Whether the chord has counted this trial."""
        return bool(self.patiently(lambda: self._redis.exists(job_key(job, "counted", key))))

    # --- leases

    @override
    def claim(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        """Take the trial's lease (`SET NX PX`); the job joins the set watchdogs scan."""

        def claim() -> Any:
            self._redis.sadd(JOBS_KEY, job)
            return self._redis.set(job_key(job, "lease", key), owner, nx=True, px=int(ttl_sec * 1000))

        return bool(self.patiently(claim))

    @override
    def renew(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        """Extend `owner`'s lease; re-create it when it lapsed in an outage and nobody took it."""
        lease = job_key(job, "lease", key)
        return bool(
            self.patiently(lambda: self._renew_script(keys=[lease], args=[owner, int(ttl_sec * 1000)]))
        )

    @override
    def release(self, job: str, key: str, owner: str) -> None:
        """Give the lease up if `owner` still holds it."""
        lease = job_key(job, "lease", key)
        self.patiently(lambda: self._release_script(keys=[lease], args=[owner]))

    @override
    def set_running(self, job: str, key: str, payload: Redispatch) -> None:
        """Record how to re-send a trial that is running now."""
        self.patiently(lambda: self._redis.hset(job_key(job, "running"), key, payload.model_dump_json()))

    @override
    def clear_running(self, job: str, key: str) -> None:
        """The trial is no longer running here."""
        self.patiently(lambda: self._redis.hdel(job_key(job, "running"), key))

    @override
    def orphaned(self) -> list[tuple[str, str, Redispatch]]:
        """Running trials whose lease expired: their host is gone."""
        found = []
        for job in self.patiently(lambda: self._redis.smembers(JOBS_KEY)):
            running = self._hash(job_key(str(job), "running"))
            if not running:
                continue
            keys = list(running)
            leases = self._mget([job_key(str(job), "lease", key) for key in keys])
            for key, lease in zip(keys, leases, strict=True):
                if lease is None:
                    found.append((str(job), key, Redispatch.model_validate_json(running[key])))
        return found

    def _mget(self, names: list[str]) -> list[str | None]:
        values = self.patiently(lambda: self._redis.mget(names))
        return [None if value is None else str(value) for value in values]

    def _hash(self, name: str) -> dict[str, str]:
        raw = self.patiently(lambda: self._redis.hgetall(name))
        return {str(key): str(value) for key, value in raw.items()}

    @override
    def try_lock(self, name: str, ttl_sec: float) -> bool:
        """A short-lived lock `name` (`SET NX PX`); False when someone holds it."""
        lock = f"{PREFIX}:lock:{name}"
        return bool(self.patiently(lambda: self._redis.set(lock, "1", nx=True, px=int(ttl_sec * 1000))))

    # --- slots

    @override
    def acquire_slot(self, job: str, key: str, cap: int, ttl_sec: float) -> bool:
        """Take (or refresh) one of the job's `cap` slots for `ttl_sec`."""
        now_ms = int(time.time() * 1000)
        args: list[int | str] = [now_ms, key, cap, int(ttl_sec * 1000)]
        return bool(self.patiently(lambda: self._slot_script(keys=[job_key(job, "slots")], args=args)))

    @override
    def release_slot(self, job: str, key: str) -> None:
        """Give the trial's slot back."""
        self.patiently(lambda: self._redis.zrem(job_key(job, "slots"), key))

    # --- job control

    @override
    def cancel(self, job: str) -> None:
        """Set the job's cancel flag."""
        self.patiently(lambda: self._redis.set(job_key(job, "cancelled"), "1"))

    @override
    def uncancel(self, job: str) -> None:
        """Clear the job's cancel flag."""
        self.patiently(lambda: self._redis.delete(job_key(job, "cancelled")))

    @override
    def is_cancelled(self, job: str) -> bool:
        """Whether the job's cancel flag is set."""
        return bool(self.patiently(lambda: self._redis.exists(job_key(job, "cancelled"))))

    @override
    def retire(self, job: str, ttl_sec: int) -> None:
        """A finished job: watchdogs stop scanning it; its keys expire after `ttl_sec`."""

        def expire_all() -> None:
            self._redis.srem(JOBS_KEY, job)
            with self._redis.pipeline(transaction=False) as pipe:
                for name in self._redis.scan_iter(match=job_key(job, "*"), count=1000):
                    pipe.expire(name, ttl_sec)
                pipe.execute()

        self.patiently(expire_all)

    # --- board

    @override
    def set_state(self, job: str, key: str, state: TrialState, host: str) -> None:
        """Show one trial as `state` on `host`."""
        value = TrialStatus(state=state, host=host, at=time.time()).model_dump_json()
        self.patiently(lambda: self._redis.hset(job_key(job, "state"), key, value))

    @override
    def set_states(self, job: str, keys: list[str], state: TrialState) -> None:
        """Show many trials as `state` (no host), in one round trip."""
        if keys:
            value = TrialStatus(state=state, at=time.time()).model_dump_json()
            mapping: dict[EncodableT, EncodableT] = dict.fromkeys(keys, value)
            self.patiently(lambda: self._redis.hset(job_key(job, "state"), mapping=mapping))

    @override
    def states(self, job: str) -> dict[str, TrialStatus]:
        """Every trial's status by trial key."""
        raw = self._hash(job_key(job, "state"))
        return {key: TrialStatus.model_validate_json(value) for key, value in raw.items()}
