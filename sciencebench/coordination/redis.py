"""The coordination contract over Redis: every operation is one round trip or one script.

Operations wait out a broker outage of up to `outage_sec`: a restart or a
network blip must not turn a finished trial into a lost one, so commands are
retried with backoff and only a longer outage raises BrokerUnavailableError.
`recovered_at` (monotonic) is when the last outage ended, for the watchdog's
grace period. Keys are listed in `coordination.protocol`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, override

import redis
from redis.typing import EncodableT

from sciencebench.coordination import budget, shares
from sciencebench.coordination.budget import Budget, Spend
from sciencebench.coordination.history import SAMPLES
from sciencebench.coordination.protocol import (
    HISTORY_KEY,
    HOSTS_KEY,
    IMAGES_KEY,
    JOBS_KEY,
    KIT_KEY,
    PAUSED_KEY,
    PREFIX,
    Claim,
    Coordinator,
    Held,
    HostKit,
    HostStatus,
    Start,
    Unfit,
    job_key,
)
from sciencebench.core.errors import BrokerUnavailableError
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import Redispatch, TrialState, TrialStatus

# Claim a trial: nothing if it has a result (KEYS[2]) or a live lease (KEYS[1])
# other than the parked one the caller's message may take over (ARGV[4]).
_CLAIM = """
if redis.call('exists', KEYS[2]) == 1 then
  return 'answered'
end
local holder = redis.call('get', KEYS[1])
if holder and (ARGV[4] == '' or holder ~= ARGV[4]) then
  return 'held'
end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('sadd', KEYS[3], ARGV[3])
return 'claimed'
"""
# Park a lease under a token unless the chord counted the trial (KEYS[3]) or a
# live process holds it.
_PARK = """
if redis.call('exists', KEYS[3]) == 1 then
  return 0
end
local holder = redis.call('get', KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('sadd', KEYS[2], ARGV[3])
return 1
"""
# Is the caller still the trial's rightful holder? It holds the lease (KEYS[1]),
# or the lease lapsed while nobody could renew it (a broker outage) and the
# trial's running entry (KEYS[2], field ARGV[3]) still names it: no watchdog
# has sent the trial to anyone else. Once one has, the caller's claim is gone.
_RIGHTFUL = """
local function rightful(lease, running, field, owner)
  local holder = redis.call('get', lease)
  if holder then
    return holder == owner
  end
  local entry = redis.call('hget', running, field)
  return entry ~= false and cjson.decode(entry)['owner'] == owner
end
"""
_RENEW = (
    _RIGHTFUL
    + """
if rightful(KEYS[1], KEYS[2], ARGV[3], ARGV[1]) then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
)
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""
# Store the record (KEYS[3]) only while the caller is the rightful holder; add
# its spend (ARGV[5] tokens, ARGV[6] cost) to the job's budget (KEYS[5], KEYS[6]).
_COMMIT = (
    _RIGHTFUL
    + budget.LUA_REACHED
    + budget.LUA_SPEND
    + """
if redis.call('exists', KEYS[3]) == 1 or not rightful(KEYS[1], KEYS[2], ARGV[3], ARGV[1]) then
  return 0
end
redis.call('set', KEYS[3], ARGV[2])
if ARGV[4] ~= '' then
  redis.call('hset', KEYS[4], ARGV[3], ARGV[4])
end
add_spend(KEYS[5], KEYS[6], ARGV[5], ARGV[6])
return 1
"""
)
# The trial ends in its rightful holder's process: drop its slot (KEYS[3]),
# running entry and lease. Nothing for a copy that lost the trial.
_FINISH = (
    _RIGHTFUL
    + """
if not rightful(KEYS[1], KEYS[2], ARGV[2], ARGV[1]) then
  return 0
end
redis.call('zrem', KEYS[3], ARGV[2])
redis.call('hdel', KEYS[2], ARGV[2])
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
end
return 1
"""
)
# Queue a trial for a slot once (KEYS[1] list of keys, KEYS[2] hash key ->
# payload); waiting again refreshes the payload and keeps the place.
_WAIT = """
if redis.call('hset', KEYS[2], ARGV[1], ARGV[2]) == 1 then
  redis.call('rpush', KEYS[1], ARGV[1])
end
return 1
"""
# A trial record's measured seconds: its harness stage, unless cancelled. The
# twin of `coordination.history.measured_seconds`.
_MEASURED = """
local function measured(record)
  local ok, r = pcall(cjson.decode, record)
  if not ok or type(r) ~= 'table' or r['exception_type'] == 'Cancelled' then
    return nil
  end
  local timings = r['timings_sec']
  if type(timings) ~= 'table' or type(timings['harness']) ~= 'number' or timings['harness'] < 0 then
    return nil
  end
  return timings['harness']
end
"""
# A held trial handed out (payload, trial key) while its message is on the way:
# a running entry (KEYS[n]) and a lease (ARGV[p] .. key) parked under its
# message's token for ARGV[g] ms unless someone holds it; the job is scanned by
# the watchdog (JOBS). No guard when ARGV[g] is empty.
_GUARD = """
local function guard(running, jobs, job, lease_prefix, guard_ms, payload, key)
  if guard_ms == '' then
    return
  end
  redis.call('hset', running, key, payload)
  redis.call('set', lease_prefix .. key, 'parked:' .. cjson.decode(payload)['task_id'], 'PX', guard_ms, 'NX')
  redis.call('sadd', jobs, job)
end
"""
# The next trial to send as one ended: the oldest waiting for a slot (KEYS[1]
# list of keys, KEYS[2] hash key -> payload), else the held trial expected to
# run longest (KEYS[3] zset member -> -seconds, KEYS[4] payloads). First,
# probed trials (KEYS[6], sent trials of tasks with held ones) that have a
# record (key ARGV[1] .. K) measure their task: its held trials (KEYS[5] task
# -> members) are expected to take that long. KEYS[7] notes the release time.
# A held trial taken is guarded (`_GUARD`: KEYS[8] running, KEYS[9] jobs,
# ARGV[2] job, ARGV[3] lease prefix, ARGV[4] ms).
# The records are read by name, which a single Redis (not a cluster) allows.
_NEXT_WAITING = (
    _MEASURED
    + _GUARD
    + """
while true do
  local key = redis.call('lpop', KEYS[1])
  if not key then
    break
  end
  local payload = redis.call('hget', KEYS[2], key)
  if payload then
    redis.call('hdel', KEYS[2], key)
    return payload
  end
end
if redis.call('exists', KEYS[3]) == 0 then
  return false
end
for _, key in ipairs(redis.call('smembers', KEYS[6])) do
  local record = redis.call('get', ARGV[1] .. key)
  if record then
    redis.call('srem', KEYS[6], key)
    local task = string.match(key, '^(.*)#')
    local members = redis.call('hget', KEYS[5], task)
    local seconds = measured(record)
    if members and seconds then
      for _, member in ipairs(cjson.decode(members)) do
        redis.call('zadd', KEYS[3], 'XX', -seconds, member)
      end
      redis.call('hdel', KEYS[5], task)
    end
  end
end
while true do
  local popped = redis.call('zpopmin', KEYS[3])
  if #popped == 0 then
    redis.call('del', KEYS[4], KEYS[5], KEYS[6], KEYS[7])
    return false
  end
  local payload = redis.call('hget', KEYS[4], popped[1])
  if payload then
    redis.call('hdel', KEYS[4], popped[1])
    local key = string.match(popped[1], '/(.*)$')
    guard(KEYS[8], KEYS[9], ARGV[2], ARGV[3], ARGV[4], payload, key)
    if redis.call('hexists', KEYS[5], string.match(key, '^(.*)#')) == 1 then
      redis.call('sadd', KEYS[6], key)
    end
    if redis.call('exists', KEYS[3]) == 0 then
      redis.call('del', KEYS[4], KEYS[5], KEYS[6], KEYS[7])
    else
      redis.call('hset', KEYS[7], 'at', redis.call('time')[1])
    end
    return payload
  end
end
"""
)
# Every held trial's payload, longest expected first; the job holds nothing after.
# Each is guarded (`_GUARD`: KEYS[6] running, KEYS[7] jobs, ARGV[1] job, ARGV[2]
# lease prefix, ARGV[3] ms) unless they are dropped (ARGV[3] empty).
_RELEASE_HELD = (
    _GUARD
    + """
local members = redis.call('zrange', KEYS[1], 0, -1)
local payloads = {}
for _, member in ipairs(members) do
  local payload = redis.call('hget', KEYS[2], member)
  if payload then
    guard(KEYS[6], KEYS[7], ARGV[1], ARGV[2], ARGV[3], payload, string.match(member, '/(.*)$'))
    table.insert(payloads, payload)
  end
end
redis.call('del', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return payloads
"""
)
# Add a job's measured seconds (ARGV[3], ARGV[4]: key, JSON list; ...) to the
# history hash (KEYS[1]): entries [seconds, job] of this job (ARGV[1]) are
# replaced, and only the newest ARGV[2] are kept.
_ADD_DURATIONS = """
local keep = tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  local kept = {}
  local old = redis.call('hget', KEYS[1], ARGV[i])
  if old then
    for _, entry in ipairs(cjson.decode(old)) do
      if entry[2] ~= ARGV[1] then
        table.insert(kept, entry)
      end
    end
  end
  for _, seconds in ipairs(cjson.decode(ARGV[i + 1])) do
    table.insert(kept, {seconds, ARGV[1]})
  end
  while #kept > keep do
    table.remove(kept, 1)
  end
  redis.call('hset', KEYS[1], ARGV[i], cjson.encode(kept))
end
return 1
"""
# Take an orphan: clear the running entry (KEYS[2], field ARGV[1]) only while
# the lease (KEYS[1]) is still absent, so a late renewal and a re-send never
# both win: after this the old holder is no longer rightful.
_TAKE_ORPHAN = """
if redis.call('exists', KEYS[1]) == 1 then
  return 0
end
return redis.call('hdel', KEYS[2], ARGV[1])
"""
# Take (or refresh) a concurrency slot: drop expired holders, then admit the
# caller if it already holds a slot or fewer than the cap are held. Expiry is
# on the server's clock, so hosts with skewed clocks agree.
_TAKE_SLOT = """
local function take_slot(slots, member, cap, ttl_ms)
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('zremrangebyscore', slots, '-inf', now)
  if redis.call('zscore', slots, member) or redis.call('zcard', slots) < tonumber(cap) then
    redis.call('zadd', slots, now + tonumber(ttl_ms), member)
    return 1
  end
  return 0
end
"""
_SLOT = _TAKE_SLOT + "return take_slot(KEYS[1], ARGV[1], ARGV[2], ARGV[3])"
# A trial's start in one round trip: the claim (as _CLAIM), then, when
# claimed, the cancel flag (KEYS[4]), the budget (KEYS[7], KEYS[8]) and a slot
# (KEYS[5], as _SLOT).
_START = (
    _TAKE_SLOT
    + budget.LUA_REACHED
    + budget.LUA_LET_START
    + """
if redis.call('exists', KEYS[2]) == 1 then
  return {'answered', 0, 0, 0}
end
local holder = redis.call('get', KEYS[1])
if holder and (ARGV[4] == '' or holder ~= ARGV[4]) then
  return {'held', 0, 0, 0}
end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('sadd', KEYS[3], ARGV[3])
if ARGV[7] ~= '' then
  redis.call('hset', KEYS[6], ARGV[5], ARGV[7])
end
if redis.call('exists', KEYS[4]) == 1 then
  return {'claimed', 1, 0, 0}
end
if budget_reached(KEYS[7]) then
  return {'claimed', 0, 0, 1}
end
local slot = take_slot(KEYS[5], ARGV[5], ARGV[6], ARGV[2])
if slot == 1 then
  let_start(KEYS[7], KEYS[8], ARGV[5])
end
return {'claimed', 0, slot, 0}
"""
)


_OUTAGE_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def _held_keys(job: str) -> tuple[str, str, str, str, str]:
    """A job's held trials: zset, payloads, tasks, probe, meta (see `coordination.protocol`)."""
    return (job_key(job, "held"), job_key(job, "held", "payloads"), job_key(job, "held", "tasks"),
            job_key(job, "held", "probe"), job_key(job, "held", "meta"))  # fmt: skip


def _budget_keys(job: str) -> tuple[str, str]:
    """A job's budget: its ledger and the trials it let start (see `coordination.budget`)."""
    return job_key(job, "budget"), job_key(job, "budget", "started")


def _guard_ms(guard_sec: float) -> int:
    """A guard's park in milliseconds (at least 1: SET PX refuses 0)."""
    return max(int(guard_sec * 1000), 1)


def _chunks[T](items: list[T], size: int) -> list[list[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class RedisCoordinator(Coordinator):
    """`Coordinator` over Redis (see the module docstring); `ping` answers at once."""

    def __init__(self, url: str, outage_sec: float = 900.0) -> None:
        self._redis: redis.Redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
        self.outage_sec = outage_sec
        self._recovered_at = float("-inf")
        self._claim_script = self._redis.register_script(_CLAIM)
        self._park_script = self._redis.register_script(_PARK)
        self._renew_script = self._redis.register_script(_RENEW)
        self._release_script = self._redis.register_script(_RELEASE)
        self._commit_script = self._redis.register_script(_COMMIT)
        self._slot_script = self._redis.register_script(_SLOT)
        self._start_script = self._redis.register_script(_START)
        self._take_orphan_script = self._redis.register_script(_TAKE_ORPHAN)
        self._finish_script = self._redis.register_script(_FINISH)
        self._wait_script = self._redis.register_script(_WAIT)
        self._next_waiting_script = self._redis.register_script(_NEXT_WAITING)
        self._release_held_script = self._redis.register_script(_RELEASE_HELD)
        self._add_durations_script = self._redis.register_script(_ADD_DURATIONS)
        self._set_budget_script = self._redis.register_script(budget.SET_BUDGET)
        self._start_within_budget_script = self._redis.register_script(budget.START_WITHIN_BUDGET)
        self._choose_share_script = self._redis.register_script(shares.LUA_CHOOSE)

    def close(self) -> None:
        """Close this coordinator's connections (it may not be used afterwards)."""
        self._redis.close()

    @property
    def client(self) -> redis.Redis:
        """The Redis client (`coordination.gateways` keeps its own keys through it)."""
        return self._redis

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
    def store_result(self, job: str, key: str, record_json: str) -> bool:
        """Store a trial's record unless it has one (`SET NX`)."""
        return bool(
            self.patiently(lambda: self._redis.set(job_key(job, "result", key), record_json, nx=True))
        )

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
    def claim(self, job: str, key: str, owner: str, ttl_sec: float, parked: str = "") -> Claim:
        """Take the trial's lease unless it has a result or a live holder; the job joins the scan."""
        keys = [job_key(job, "lease", key), job_key(job, "result", key), JOBS_KEY]
        args: list[int | str] = [owner, int(ttl_sec * 1000), job, parked]
        return Claim(str(self.patiently(lambda: self._claim_script(keys=keys, args=args))))

    @override
    def park(self, job: str, key: str, token: str, ttl_sec: float) -> bool:
        """Hold the lease under `token` unless a live process holds it or the chord counted the trial."""
        keys = [job_key(job, "lease", key), JOBS_KEY, job_key(job, "counted", key)]
        args: list[int | str] = [token, int(ttl_sec * 1000), job]
        return bool(self.patiently(lambda: self._park_script(keys=keys, args=args)))

    @override
    def renew(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        """Extend `owner`'s lease while it is the trial's rightful holder (see `_RIGHTFUL`)."""
        keys = [job_key(job, "lease", key), job_key(job, "running")]
        args: list[int | str] = [owner, int(ttl_sec * 1000), key]
        return bool(self.patiently(lambda: self._renew_script(keys=keys, args=args)))

    @override
    def commit_result(
        self, job: str, key: str, owner: str, record_json: str, status: TrialStatus | None = None
    ) -> bool:
        """Store the record (and `status`) if `owner` is rightful and the trial has none (one script)."""
        keys = [job_key(job, "lease", key), job_key(job, "running"), job_key(job, "result", key),
                job_key(job, "state"), *_budget_keys(job)]  # fmt: skip
        args = [owner, record_json, key, status.model_dump_json() if status else "",
                *budget.spend_args(budget.spend_of(record_json))]  # fmt: skip
        return bool(self.patiently(lambda: self._commit_script(keys=keys, args=args)))

    @override
    def start(
        self, job: str, key: str, owner: str, ttl_sec: float, cap: int, parked: str = "",
        running: Redispatch | None = None,
    ) -> Start:  # fmt: skip
        """Claim (with the running entry), then the cancel flag and a slot, in one script (`Leases.start`)."""
        keys = [job_key(job, "lease", key), job_key(job, "result", key), JOBS_KEY,
                job_key(job, "cancelled"), job_key(job, "slots"), job_key(job, "running"),
                *_budget_keys(job)]  # fmt: skip
        entry = running.model_dump_json() if running is not None else ""
        args: list[int | str] = [owner, int(ttl_sec * 1000), job, parked, key, cap, entry]
        claim, cancelled, slot, over = self.patiently(lambda: self._start_script(keys=keys, args=args))
        return Start(
            claim=Claim(str(claim)), cancelled=bool(cancelled), slot=bool(slot), over_budget=bool(over)
        )

    @override
    def run_started(self, job: str, key: str, payload: Redispatch | None, host: str) -> None:
        """The running entry (when sent by a broker) and the state `running`, in one pipeline."""
        status = TrialStatus(state=TrialState.RUNNING, host=host, at=time.time()).model_dump_json()

        def send() -> None:
            with self._redis.pipeline(transaction=False) as pipe:
                if payload is not None:
                    pipe.hset(job_key(job, "running"), key, payload.model_dump_json())
                pipe.hset(job_key(job, "state"), key, status)
                pipe.execute()

        self.patiently(send)

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
    def is_leased(self, job: str, key: str) -> bool:
        """Whether anyone holds the trial's lease now (`EXISTS`)."""
        return bool(self.patiently(lambda: self._redis.exists(job_key(job, "lease", key))))

    @override
    def finish(self, job: str, key: str, owner: str) -> bool:
        """Give back slot, running entry and lease while `owner` is rightful (one script)."""
        keys = [job_key(job, "lease", key), job_key(job, "running"), job_key(job, "slots")]
        return bool(self.patiently(lambda: self._finish_script(keys=keys, args=[owner, key])))

    @override
    def take_orphan(self, job: str, key: str) -> bool:
        """Clear the running entry if the lease is still absent (one script)."""
        keys = [job_key(job, "lease", key), job_key(job, "running")]
        return bool(self.patiently(lambda: self._take_orphan_script(keys=keys, args=[key])))

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

    @override
    def unlock(self, name: str) -> None:
        """Release the lock `name` (`DEL`)."""
        self.patiently(lambda: self._redis.delete(f"{PREFIX}:lock:{name}"))

    # --- slots

    @override
    def acquire_slot(self, job: str, key: str, cap: int, ttl_sec: float) -> bool:
        """Take (or refresh) one of the job's `cap` slots for `ttl_sec` (the server's clock)."""
        args: list[int | str] = [key, cap, int(ttl_sec * 1000)]
        return bool(self.patiently(lambda: self._slot_script(keys=[job_key(job, "slots")], args=args)))

    # --- job control

    @override
    def wait_for_slot(self, job: str, payload: Redispatch) -> None:
        """Queue a parked trial once to be sent again when a slot frees (one script)."""
        keys = [job_key(job, "waiting"), job_key(job, "waiting", "payloads")]
        args = [payload.trial.key, payload.model_dump_json()]
        self.patiently(lambda: self._wait_script(keys=keys, args=args))

    @override
    def next_waiting(self, job: str, guard_sec: float) -> Redispatch | None:
        """The longest-waiting parked trial, else the longest expected held one (guarded); one script."""
        keys = [job_key(job, "waiting"), job_key(job, "waiting", "payloads"), *_held_keys(job),
                job_key(job, "running"), JOBS_KEY]  # fmt: skip
        args: list[str | int] = [
            job_key(job, "result", ""),
            job,
            job_key(job, "lease", ""),
            _guard_ms(guard_sec),
        ]
        value = self.patiently(lambda: self._next_waiting_script(keys=keys, args=args))
        return Redispatch.model_validate_json(str(value)) if value is not None else None

    @override
    def hold(self, job: str, held: list[Held], sent: list[str], window: int) -> None:
        """Store the held trials, their tasks and the probes in one transaction."""
        if not held:
            return
        zset, payloads, tasks, probe, meta = _held_keys(job)
        scores: dict[str, float] = {}
        bodies: dict[str, str] = {}
        by_task: dict[str, list[str]] = {}
        for rank, item in enumerate(held):
            member = f"{rank:08d}/{item.payload.trial.key}"
            scores[member] = -item.expected_sec
            bodies[member] = item.payload.model_dump_json()
            by_task.setdefault(item.payload.trial.task_id, []).append(member)
        probes = [key for key in sent if TrialKey.parse(key).task_id in by_task]

        def store() -> None:
            with self._redis.pipeline(transaction=True) as pipe:
                for chunk in _chunks(list(scores), 5000):
                    pipe.zadd(zset, {member: scores[member] for member in chunk})
                    mapping: dict[EncodableT, EncodableT] = {member: bodies[member] for member in chunk}
                    pipe.hset(payloads, mapping=mapping)
                listed: dict[EncodableT, EncodableT] = {t: json.dumps(m) for t, m in by_task.items()}
                pipe.hset(tasks, mapping=listed)
                if probes:
                    pipe.sadd(probe, *probes)
                pipe.hset(meta, mapping={"window": window, "at": self.now()})
                pipe.execute()

        self.patiently(store)

    @override
    def release_held(self, job: str, guard_sec: float | None) -> list[Redispatch]:
        """Every held trial, longest expected first, guarded unless dropped; the job holds none after."""
        keys = [*_held_keys(job), job_key(job, "running"), JOBS_KEY]
        args = [job, job_key(job, "lease", ""), "" if guard_sec is None else _guard_ms(guard_sec)]
        values = self.patiently(lambda: self._release_held_script(keys=keys, args=args))
        return [Redispatch.model_validate_json(str(value)) for value in values]

    @override
    def stalled_holds(self, idle_sec: float) -> dict[str, int]:
        """Jobs with held trials, none running or waiting, none handed out for `idle_sec`."""
        jobs = sorted(str(job) for job in self.patiently(lambda: self._redis.smembers(JOBS_KEY)))
        if not jobs:
            return {}

        def look() -> list[Any]:
            with self._redis.pipeline(transaction=False) as pipe:
                for job in jobs:
                    pipe.exists(job_key(job, "held"))
                    pipe.hlen(job_key(job, "running"))
                    pipe.llen(job_key(job, "waiting"))
                    pipe.hmget(job_key(job, "held", "meta"), ["window", "at"])
                pipe.time()
                return list(pipe.execute())

        found = self.patiently(look)
        seconds, micros = found[-1]
        now = float(seconds) + float(micros) / 1e6
        stalled = {}
        for i, job in enumerate(jobs):
            held, running, waiting, (window, at) = found[4 * i : 4 * i + 4]
            if held and not running and not waiting and now - float(at or 0) >= idle_sec:
                stalled[job] = int(window or 1)
        return stalled

    @override
    def open_dispatch(self, job: str, dispatch_id: str) -> None:
        """Add the chord to the job's open ones (`SADD`)."""
        self.patiently(lambda: self._redis.sadd(job_key(job, "dispatches"), dispatch_id))

    @override
    def close_dispatch(self, job: str, dispatch_id: str) -> None:
        """Remove the chord from the job's open ones (`SREM`)."""
        self.patiently(lambda: self._redis.srem(job_key(job, "dispatches"), dispatch_id))

    @override
    def open_dispatches(self, job: str) -> set[str]:
        """The job's open chords (`SMEMBERS`)."""
        return {str(d) for d in self.patiently(lambda: self._redis.smembers(job_key(job, "dispatches")))}

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
    def mark_unfit(self, job: str, host: str, reason: str) -> None:
        """Remember that `host` could not serve the job just now, and why."""
        value = Unfit(reason=reason, at=self.now()).model_dump_json()
        self.patiently(lambda: self._redis.hset(job_key(job, "unfit"), host, value))

    @override
    def unfit_hosts(self, job: str) -> dict[str, Unfit]:
        """Hosts that found they could not serve the job, with why and when."""
        return {
            host: Unfit.model_validate_json(value)
            for host, value in self._hash(job_key(job, "unfit")).items()
        }

    @override
    def retire(self, job: str, ttl_sec: int) -> None:
        """A finished job: watchdogs stop scanning it; its keys expire after `ttl_sec`.

        `EXPIRE LT` never lengthens a shorter life: a live lease still lapses
        on time (a key without a TTL counts as infinite, so it gets one).
        """

        def expire_all() -> None:
            self._redis.srem(JOBS_KEY, job)
            self._redis.hdel(shares.SHARES_KEY, job)
            self._redis.hdel(shares.WEIGHTS_KEY, shares.job_field(job))
            with self._redis.pipeline(transaction=False) as pipe:
                for name in self._redis.scan_iter(match=job_key(job, "*"), count=1000):
                    pipe.expire(name, ttl_sec, lt=True)
                pipe.execute()

        self.patiently(expire_all)

    # --- history

    @override
    def add_durations(self, job: str, durations: dict[str, list[float]]) -> None:
        """Add the job's measured seconds to `sciencebench:history` (one script per 1,000 keys)."""
        for chunk in _chunks(sorted(durations.items()), 1000):
            args: list[EncodableT] = [job, SAMPLES]
            for key, seconds in chunk:
                args += [key, json.dumps(seconds)]
            self._add(args)

    def _add(self, args: list[EncodableT]) -> None:
        self.patiently(lambda: self._add_durations_script(keys=[HISTORY_KEY], args=args))

    @override
    def durations(self, keys: list[str]) -> dict[str, list[float]]:
        """The kept seconds of each key that has any (`HMGET`)."""
        if not keys:
            return {}
        values = self.patiently(lambda: self._redis.hmget(HISTORY_KEY, keys))
        return {
            key: [float(entry[0]) for entry in json.loads(value)]
            for key, value in zip(keys, values, strict=True)
            if value is not None
        }

    @override
    def all_durations(self) -> dict[str, list[float]]:
        """Every key's kept seconds (`HSCAN`, 1,000 fields a step: Redis is never held long)."""

        def scan() -> dict[str, list[float]]:
            return {
                str(key): [float(entry[0]) for entry in json.loads(value)]
                for key, value in self._redis.hscan_iter(HISTORY_KEY, count=1000)
            }

        return self.patiently(scan)

    # --- budgets

    @override
    def set_budget(
        self, job: str, max_cost_usd: float | None, max_tokens: int | None, spent: Spend | None = None
    ) -> Budget:
        """Set the limits (and seed a lost ledger) in one script; the ledger."""
        seed = budget.spend_args(spent or Spend())
        limits = ["" if max_cost_usd is None else repr(float(max_cost_usd)),
                  "" if max_tokens is None else str(max_tokens)]  # fmt: skip
        keys = list(_budget_keys(job))
        self.patiently(lambda: self._set_budget_script(keys=keys, args=[*limits, *seed]))
        return self.budget(job)

    @override
    def budget(self, job: str) -> Budget:
        """The ledger and the started trials (two `HGETALL`)."""
        ledger, started = _budget_keys(job)
        return budget.from_hash(self._hash(ledger), self._hash(started))

    @override
    def start_within_budget(self, job: str, key: str) -> bool:
        """Let the trial start unless the budget is reached (one script)."""
        keys = list(_budget_keys(job))
        return bool(self.patiently(lambda: self._start_within_budget_script(keys=keys, args=[key])))

    # --- shares

    @override
    def register_share(self, job: str, share: shares.Share) -> None:
        """The job's Share in `sciencebench:shares` (`HSET`)."""
        self.patiently(lambda: self._redis.hset(shares.SHARES_KEY, job, share.model_dump_json()))

    @override
    def set_weight(self, field: str, weight: float | None) -> None:
        """An operator's weight (`HSET`), or none (`HDEL`)."""
        if weight is None:
            self.patiently(lambda: self._redis.hdel(shares.WEIGHTS_KEY, field))
        else:
            self.patiently(lambda: self._redis.hset(shares.WEIGHTS_KEY, field, repr(float(weight))))

    @override
    def share_table(self) -> tuple[dict[str, shares.Share], dict[str, float]]:
        """Every registered job and the operator's weights (two `HGETALL`)."""
        table = {job: shares.Share.model_validate_json(v) for job, v in self._hash(shares.SHARES_KEY).items()}
        return table, {field: float(v) for field, v in self._hash(shares.WEIGHTS_KEY).items()}

    @override
    def share_load(self, job: str) -> shares.Load:
        """The job's slots, sent set, held and parked trials (one pipeline)."""

        def look() -> list[Any]:
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.zcard(job_key(job, "slots"))
                pipe.scard(job_key(job, "share", "sent"))
                pipe.zcard(job_key(job, "held"))
                pipe.llen(job_key(job, "waiting"))
                return list(pipe.execute())

        running, sent, held, waiting = self.patiently(look)
        return shares.Load(running=int(running), sent=int(sent), waiting=int(held) + int(waiting))

    @override
    def choose_share(self, capacity: int) -> str | None:
        """`shares.choose` in one script (`shares.LUA_CHOOSE`)."""
        keys = [shares.SHARES_KEY, shares.WEIGHTS_KEY]
        value = self.patiently(lambda: self._choose_share_script(keys=keys, args=[capacity, f"{PREFIX}:"]))
        return str(value) if value else None

    @override
    def share_sent(self, job: str, key: str) -> None:
        """Add the trial to the job's sent set (`SADD`)."""
        self.patiently(lambda: self._redis.sadd(job_key(job, "share", "sent"), key))

    @override
    def share_started(self, job: str, key: str) -> None:
        """Take the trial off the job's sent set (`SREM`)."""
        self.patiently(lambda: self._redis.srem(job_key(job, "share", "sent"), key))

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

    @override
    def now(self) -> float:
        """The server's clock (`TIME`)."""
        seconds, micros = self.patiently(lambda: self._redis.time())
        return float(seconds) + float(micros) / 1e6

    @override
    def beat(self, host: str) -> None:
        """A worker host's heartbeat, stamped with the server's clock."""
        self.patiently(lambda: self._redis.hset(HOSTS_KEY, host, repr(self.now())))

    @override
    def pause_host(self, host: str, reason: str) -> None:
        """The host takes no trials now, and why."""
        self.patiently(lambda: self._redis.hset(PAUSED_KEY, host, reason))

    @override
    def resume_host(self, host: str) -> None:
        """The host takes trials again."""
        self.patiently(lambda: self._redis.hdel(PAUSED_KEY, host))

    @override
    def report_images(self, host: str, line: str) -> None:
        """The host's image-budget line."""
        self.patiently(lambda: self._redis.hset(IMAGES_KEY, host, line))

    @override
    def describe_host(self, host: str, kit: HostKit) -> None:
        """What the host brings to a job."""
        self.patiently(lambda: self._redis.hset(KIT_KEY, host, kit.model_dump_json()))

    @override
    def forget_host(self, host: str) -> None:
        """A worker host stopped on purpose."""
        keys = (HOSTS_KEY, PAUSED_KEY, IMAGES_KEY, KIT_KEY)
        self.patiently(lambda: [self._redis.hdel(key, host) for key in keys])

    @override
    def hosts(self) -> dict[str, HostStatus]:
        """Every worker host that beat and was not forgotten."""
        paused, images, kits = self._hash(PAUSED_KEY), self._hash(IMAGES_KEY), self._hash(KIT_KEY)
        return {
            host: HostStatus(
                seen_at=float(seen),
                paused=host in paused,
                reason=paused.get(host, ""),
                images=images.get(host, ""),
                kit=_kit(kits.get(host)),
            )
            for host, seen in self._hash(HOSTS_KEY).items()
        }


def _kit(raw: str | None) -> HostKit | None:
    """A stored HostKit; None when absent or not one (a host reporting what this version cannot read)."""
    if raw is None:
        return None
    try:
        return HostKit.model_validate_json(raw)
    except ValueError:
        return None
