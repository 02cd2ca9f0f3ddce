"""Slots over Redis: the job's --n-concurrent cap, trials waiting for a slot, trials held back."""

from __future__ import annotations

import json
from typing import Any, override

from redis.typing import EncodableT

from sciencebench.coordination import scripts
from sciencebench.coordination.keys import ClusterKeys, JobKeys
from sciencebench.coordination.protocol import JOBS_KEY, Held, Slots
from sciencebench.coordination.redis.base import OUTAGE_SEC, RedisBase, chunks
from sciencebench.core.capacity import Request
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import Redispatch


def _guard_ms(guard_sec: float) -> int:
    """A guard's park in milliseconds (at least 1: SET PX refuses 0)."""
    return max(int(guard_sec * 1000), 1)


class RedisSlots(RedisBase, Slots):
    """`Slots` (the scripts `slot`, `wait`, `next_waiting`, `release_held`; `hold` is one transaction)."""

    def __init__(self, url: str, outage_sec: float = OUTAGE_SEC) -> None:
        super().__init__(url, outage_sec)
        self._slot = self._script(scripts.SLOT)
        self._room = self._script(scripts.ROOM)
        self._wait = self._script(scripts.WAIT)
        self._next_waiting = self._script(scripts.NEXT_WAITING)
        self._release_held = self._script(scripts.RELEASE_HELD)

    @override
    def acquire_slot(self, job: str, key: str, cap: int, ttl_sec: float) -> bool:
        """Take (or refresh) one of the job's `cap` slots for `ttl_sec` (the server's clock)."""
        args: list[int | str] = [key, cap, int(ttl_sec * 1000)]
        return bool(self.patiently(lambda: self._slot(job, key, args)))

    @override
    def take_room(self, host: str, member: str, request: Request, capacity: Request, ttl_sec: float) -> bool:
        """Take (or refresh) `member`'s part of the host's capacity if it fits (one script)."""
        cpus, cap = repr(float(request.cpus)), repr(float(capacity.cpus))
        ttl = int(ttl_sec * 1000)
        args: list[str | int] = [member, cpus, request.memory_mb, cap, capacity.memory_mb, ttl]
        return bool(self.patiently(lambda: self._room("", "", args, host=host)))

    @override
    def free_room(self, host: str, member: str) -> None:
        """Drop `member`'s part of the host's capacity (one transaction)."""

        def free() -> None:
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.zrem(ClusterKeys.room(host), member)
                pipe.hdel(ClusterKeys.room_requests(host), member)
                pipe.execute()

        self.patiently(free)

    @override
    def room_used(self, hosts: list[str]) -> dict[str, tuple[Request, int]]:
        """Each host's parts whose lease has not lapsed, summed (one pipeline)."""
        if not hosts:
            return {}

        def look() -> list[Any]:
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.time()
                for host in hosts:
                    pipe.zrange(ClusterKeys.room(host), 0, -1, withscores=True)
                    pipe.hgetall(ClusterKeys.room_requests(host))
                return list(pipe.execute())

        found = self.patiently(look)
        seconds, micros = found[0]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        used: dict[str, tuple[Request, int]] = {}
        for i, host in enumerate(hosts):
            members, requests = found[1 + 2 * i], found[2 + 2 * i]
            parts = [str(requests[m]).split() for m, expiry in members if expiry > now_ms and m in requests]
            cpus = sum(float(part[0]) for part in parts)
            memory = sum(int(float(part[1])) for part in parts)
            used[host] = (Request(cpus=cpus, memory_mb=memory), len(parts))
        return used

    @override
    def wait_for_slot(self, job: str, payload: Redispatch) -> None:
        """Queue a parked trial once to be sent again when a slot frees (one script)."""
        args = [payload.trial.key, payload.model_dump_json()]
        self.patiently(lambda: self._wait(job, payload.trial.key, args))

    @override
    def next_waiting(self, job: str, guard_sec: float) -> Redispatch | None:
        """The longest-waiting parked trial, else the longest expected held one (guarded); one script."""
        keys = JobKeys(job)
        args: list[str | int] = [keys.result(""), job, keys.lease(""), _guard_ms(guard_sec)]
        value = self.patiently(lambda: self._next_waiting(job, "", args))
        return Redispatch.model_validate_json(str(value)) if value is not None else None

    @override
    def hold(self, job: str, held: list[Held], sent: list[str], window: int) -> None:
        """Store the held trials, their tasks, their requests and the probes in one transaction."""
        if not held:
            return
        named = scripts.store_keys(job)
        zset, payloads, tasks, probe, meta = (named[name] for name in scripts.HELD)
        scores: dict[str, float] = {}
        bodies: dict[str, str] = {}
        requests: dict[EncodableT, EncodableT] = {}
        by_task: dict[str, list[str]] = {}
        for rank, item in enumerate(held):
            member = f"{rank:08d}/{item.payload.trial.key}"
            scores[member] = -item.expected_sec
            bodies[member] = item.payload.model_dump_json()
            by_task.setdefault(item.payload.trial.task_id, []).append(member)
            trial = item.payload.trial
            requests[trial.key] = f"{float(trial.cpus)!r} {trial.memory_mb}"
        probes = [key for key in sent if TrialKey.parse(key).task_id in by_task]

        def store() -> None:
            with self._redis.pipeline(transaction=True) as pipe:
                for chunk in chunks(list(scores), 5000):
                    pipe.zadd(zset, {member: scores[member] for member in chunk})
                    mapping: dict[EncodableT, EncodableT] = {member: bodies[member] for member in chunk}
                    pipe.hset(payloads, mapping=mapping)
                listed: dict[EncodableT, EncodableT] = {t: json.dumps(m) for t, m in by_task.items()}
                pipe.hset(tasks, mapping=listed)
                pipe.hset(JobKeys(job).requests, mapping=requests)  # fair share counts what each asks
                if probes:
                    pipe.sadd(probe, *probes)
                pipe.hset(meta, mapping={"window": window, "at": self.now()})
                pipe.execute()

        self.patiently(store)

    @override
    def release_held(self, job: str, guard_sec: float | None) -> list[Redispatch]:
        """Every held trial, longest expected first, guarded unless dropped; the job holds none after."""
        args = [job, JobKeys(job).lease(""), "" if guard_sec is None else _guard_ms(guard_sec)]
        values = self.patiently(lambda: self._release_held(job, "", args))
        return [Redispatch.model_validate_json(str(value)) for value in values]

    @override
    def stalled_holds(self, idle_sec: float) -> dict[str, int]:
        """Jobs with held trials, none running or waiting, none handed out for `idle_sec`."""
        jobs = sorted(str(job) for job in self.patiently(lambda: self._redis.smembers(JOBS_KEY)))
        if not jobs:
            return {}

        def look() -> list[Any]:
            with self._redis.pipeline(transaction=False) as pipe:
                for keys in map(JobKeys, jobs):
                    pipe.exists(keys.held)
                    pipe.hlen(keys.running)
                    pipe.llen(keys.waiting)
                    pipe.hmget(keys.held_meta, ["window", "at"])
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
