"""Trial coordination state: results, leases, concurrency slots, cancel flags.

Two implementations of one interface: `RedisCoordinator` for a cluster and
`LocalCoordinator` for the embedded single-process mode. Keys (Redis):

    sciencebench:jobs                         set of job names with live state
    sciencebench:{job}:result:{key}           latest TrialRecord JSON
    sciencebench:{job}:counted:{key}          the chord has been told about key
    sciencebench:{job}:lease:{key}            owner id, expires unless renewed
    sciencebench:{job}:running                hash key -> redispatch payload JSON
    sciencebench:{job}:slots                  zset key -> lease expiry (ms)
    sciencebench:{job}:state                  hash key -> {"state", "host", "at"}
    sciencebench:{job}:cancelled              present when the job is cancelled

`key` is `<task id>#<attempt>`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis

from sciencebench.errors import BrokerUnavailableError

PREFIX = "sciencebench"

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


class Coordinator(Protocol):
    def get_result(self, job: str, key: str) -> str | None: ...
    def store_result(self, job: str, key: str, record_json: str) -> None: ...
    def clear_result(self, job: str, key: str) -> None: ...
    def mark_counted(self, job: str, key: str) -> None: ...
    def is_counted(self, job: str, key: str) -> bool: ...
    def claim(self, job: str, key: str, owner: str, ttl_sec: float) -> bool: ...
    def renew(self, job: str, key: str, owner: str, ttl_sec: float) -> bool: ...
    def release(self, job: str, key: str, owner: str) -> None: ...
    def set_running(self, job: str, key: str, payload: dict[str, Any]) -> None: ...
    def clear_running(self, job: str, key: str) -> None: ...
    def acquire_slot(self, job: str, key: str, cap: int, ttl_sec: float) -> bool: ...
    def release_slot(self, job: str, key: str) -> None: ...
    def slot_holders(self, job: str) -> int: ...
    def set_state(self, job: str, key: str, state: str, host: str) -> None: ...
    def states(self, job: str) -> dict[str, dict[str, Any]]: ...
    def set_states(self, job: str, keys: list[str], state: str) -> None: ...
    def cancel(self, job: str) -> None: ...
    def uncancel(self, job: str) -> None: ...
    def is_cancelled(self, job: str) -> bool: ...
    def orphaned(self) -> list[tuple[str, str, dict[str, Any]]]: ...
    def try_lock(self, name: str, ttl_sec: float) -> bool: ...
    def retire(self, job: str, ttl_sec: int) -> None: ...
    def patiently[T](self, fn: Callable[[], T]) -> T: ...
    @property
    def recovered_at(self) -> float: ...


def _k(job: str, *parts: str) -> str:
    return ":".join((PREFIX, job, *parts))


_OUTAGE_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


class _Patient:
    """Runs Redis commands, waiting out a broker outage of up to `outage_sec`.

    A restart or a network blip must not turn a finished trial into a lost
    one, so commands are retried with backoff; only a longer outage raises
    BrokerUnavailableError. `recovered_at` (monotonic) is when the last
    outage ended, for the watchdog's grace period.
    """

    def __init__(self, client: redis.Redis, outage_sec: float) -> None:
        self._client = client
        self.outage_sec = outage_sec
        self.recovered_at = float("-inf")

    def __getattr__(self, name: str) -> Any:
        command = getattr(self._client, name)
        if not callable(command):
            return command

        def patiently(*args: Any, **kwargs: Any) -> Any:
            return self.call(lambda: command(*args, **kwargs))

        return patiently

    def call(self, fn: Any) -> Any:
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
                self.recovered_at = time.monotonic()
            return result


class RedisCoordinator:
    """Coordinator over Redis; every operation is one round trip or one script.

    Operations wait out a broker outage of up to `outage_sec` (see `_Patient`);
    `ping` answers at once.
    """

    def __init__(self, url: str, outage_sec: float = 900.0) -> None:
        raw = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
        self._raw = raw
        self.client: Any = _Patient(raw, outage_sec)
        self._renew_script = raw.register_script(_RENEW)
        self._release_script = raw.register_script(_RELEASE)
        self._slot_script = raw.register_script(_SLOT)

    @property
    def recovered_at(self) -> float:
        return float(self.client.recovered_at)

    def patiently[T](self, fn: Callable[[], T]) -> T:
        """Run `fn` (any Redis-backed call, e.g. Celery's result backend) waiting out outages."""
        result: T = self.client.call(fn)
        return result

    def _renew(self, keys: list[str], args: list[Any]) -> Any:
        return self.client.call(lambda: self._renew_script(keys=keys, args=args))

    def _release(self, keys: list[str], args: list[Any]) -> Any:
        return self.client.call(lambda: self._release_script(keys=keys, args=args))

    def _slot(self, keys: list[str], args: list[Any]) -> Any:
        return self.client.call(lambda: self._slot_script(keys=keys, args=args))

    def ping(self) -> None:
        try:
            self._raw.ping()
        except redis.RedisError as exc:
            raise BrokerUnavailableError(f"broker unreachable: {exc.__class__.__name__}") from None

    def get_result(self, job: str, key: str) -> str | None:
        value = self.client.get(_k(job, "result", key))
        return str(value) if value is not None else None

    def store_result(self, job: str, key: str, record_json: str) -> None:
        self.client.set(_k(job, "result", key), record_json)

    def clear_result(self, job: str, key: str) -> None:
        self.client.delete(_k(job, "result", key), _k(job, "counted", key))

    def mark_counted(self, job: str, key: str) -> None:
        self.client.set(_k(job, "counted", key), "1")

    def is_counted(self, job: str, key: str) -> bool:
        return bool(self.client.exists(_k(job, "counted", key)))

    def claim(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        self.client.sadd(f"{PREFIX}:jobs", job)
        return bool(self.client.set(_k(job, "lease", key), owner, nx=True, px=int(ttl_sec * 1000)))

    def renew(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        return bool(self._renew(keys=[_k(job, "lease", key)], args=[owner, int(ttl_sec * 1000)]))

    def release(self, job: str, key: str, owner: str) -> None:
        self._release(keys=[_k(job, "lease", key)], args=[owner])

    def set_running(self, job: str, key: str, payload: dict[str, Any]) -> None:
        self.client.hset(_k(job, "running"), key, json.dumps(payload))

    def clear_running(self, job: str, key: str) -> None:
        self.client.hdel(_k(job, "running"), key)

    def acquire_slot(self, job: str, key: str, cap: int, ttl_sec: float) -> bool:
        now_ms = int(time.time() * 1000)
        return bool(self._slot(keys=[_k(job, "slots")], args=[now_ms, key, cap, int(ttl_sec * 1000)]))

    def release_slot(self, job: str, key: str) -> None:
        self.client.zrem(_k(job, "slots"), key)

    def slot_holders(self, job: str) -> int:
        now_ms = int(time.time() * 1000)
        return int(self.client.zcount(_k(job, "slots"), now_ms, "+inf"))

    def set_state(self, job: str, key: str, state: str, host: str) -> None:
        value = json.dumps({"state": state, "host": host, "at": time.time()})
        self.client.hset(_k(job, "state"), key, value)

    def set_states(self, job: str, keys: list[str], state: str) -> None:
        if keys:
            value = json.dumps({"state": state, "host": "", "at": time.time()})
            self.client.hset(_k(job, "state"), mapping=dict.fromkeys(keys, value))

    def states(self, job: str) -> dict[str, dict[str, Any]]:
        raw = self.client.hgetall(_k(job, "state"))
        return {str(key): json.loads(value) for key, value in raw.items()}

    def cancel(self, job: str) -> None:
        self.client.set(_k(job, "cancelled"), "1")

    def uncancel(self, job: str) -> None:
        self.client.delete(_k(job, "cancelled"))

    def is_cancelled(self, job: str) -> bool:
        return bool(self.client.exists(_k(job, "cancelled")))

    def orphaned(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Running trials whose lease expired: their host is gone."""
        found = []
        for job in map(str, self.client.smembers(f"{PREFIX}:jobs")):
            running = {str(k): str(v) for k, v in self.client.hgetall(_k(job, "running")).items()}
            if not running:
                continue
            keys = list(running)
            leases = self.client.mget([_k(job, "lease", key) for key in keys])
            for key, lease in zip(keys, leases, strict=True):
                if lease is None:
                    found.append((job, key, json.loads(running[key])))
        return found

    def try_lock(self, name: str, ttl_sec: float) -> bool:
        return bool(self.client.set(f"{PREFIX}:lock:{name}", "1", nx=True, px=int(ttl_sec * 1000)))

    def retire(self, job: str, ttl_sec: int) -> None:
        """A finished job: watchdogs stop scanning it; its keys expire after `ttl_sec`."""
        self.client.srem(f"{PREFIX}:jobs", job)

        def expire_all() -> None:
            with self._raw.pipeline(transaction=False) as pipe:
                for key in self._raw.scan_iter(match=_k(job, "*"), count=1000):
                    pipe.expire(key, ttl_sec)
                pipe.execute()

        self.client.call(expire_all)


class LocalCoordinator:
    """The same contract in one process, for `submit --local` (no Redis)."""

    recovered_at = float("-inf")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, Any] = {}
        self._expiry: dict[str, float] = {}

    def _get(self, name: str) -> Any:
        expiry = self._expiry.get(name)
        if expiry is not None and expiry <= time.monotonic():
            self._values.pop(name, None)
            self._expiry.pop(name, None)
        return self._values.get(name)

    def get_result(self, job: str, key: str) -> str | None:
        with self._lock:
            value = self._get(_k(job, "result", key))
            return str(value) if value is not None else None

    def store_result(self, job: str, key: str, record_json: str) -> None:
        with self._lock:
            self._values[_k(job, "result", key)] = record_json

    def clear_result(self, job: str, key: str) -> None:
        with self._lock:
            self._values.pop(_k(job, "result", key), None)
            self._values.pop(_k(job, "counted", key), None)

    def mark_counted(self, job: str, key: str) -> None:
        with self._lock:
            self._values[_k(job, "counted", key)] = True

    def is_counted(self, job: str, key: str) -> bool:
        with self._lock:
            return bool(self._get(_k(job, "counted", key)))

    def claim(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        with self._lock:
            name = _k(job, "lease", key)
            if self._get(name) is not None:
                return False
            self._values[name] = owner
            self._expiry[name] = time.monotonic() + ttl_sec
            return True

    def renew(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        with self._lock:
            name = _k(job, "lease", key)
            if self._get(name) != owner:
                return False
            self._expiry[name] = time.monotonic() + ttl_sec
            return True

    def release(self, job: str, key: str, owner: str) -> None:
        with self._lock:
            name = _k(job, "lease", key)
            if self._get(name) == owner:
                self._values.pop(name, None)
                self._expiry.pop(name, None)

    def set_running(self, job: str, key: str, payload: dict[str, Any]) -> None:
        return None  # one process: a lost host cannot happen

    def clear_running(self, job: str, key: str) -> None:
        return None

    def acquire_slot(self, job: str, key: str, cap: int, ttl_sec: float) -> bool:
        with self._lock:
            slots: dict[str, float] = self._values.setdefault(_k(job, "slots"), {})
            now = time.monotonic()
            for holder in [h for h, expiry in slots.items() if expiry <= now]:
                del slots[holder]
            if key in slots or len(slots) < cap:
                slots[key] = now + ttl_sec
                return True
            return False

    def release_slot(self, job: str, key: str) -> None:
        with self._lock:
            self._values.get(_k(job, "slots"), {}).pop(key, None)

    def slot_holders(self, job: str) -> int:
        with self._lock:
            return len(self._values.get(_k(job, "slots"), {}))

    def set_state(self, job: str, key: str, state: str, host: str) -> None:
        with self._lock:
            states = self._values.setdefault(_k(job, "state"), {})
            states[key] = {"state": state, "host": host, "at": time.time()}

    def set_states(self, job: str, keys: list[str], state: str) -> None:
        for key in keys:
            self.set_state(job, key, state, "")

    def states(self, job: str) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self._values.get(_k(job, "state"), {}))

    def cancel(self, job: str) -> None:
        with self._lock:
            self._values[_k(job, "cancelled")] = True

    def uncancel(self, job: str) -> None:
        with self._lock:
            self._values.pop(_k(job, "cancelled"), None)

    def is_cancelled(self, job: str) -> bool:
        with self._lock:
            return bool(self._values.get(_k(job, "cancelled")))

    def orphaned(self) -> list[tuple[str, str, dict[str, Any]]]:
        return []

    def retire(self, job: str, ttl_sec: int) -> None:
        return None  # the process ends with the job

    def patiently[T](self, fn: Callable[[], T]) -> T:
        return fn()

    def try_lock(self, name: str, ttl_sec: float) -> bool:
        with self._lock:
            lock = f"lock:{name}"
            if self._get(lock) is not None:
                return False
            self._values[lock] = True
            self._expiry[lock] = time.monotonic() + ttl_sec
            return True
