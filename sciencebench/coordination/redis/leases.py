"""Results and leases over Redis: one record per trial, fenced leases, running entries, locks."""

from __future__ import annotations

import time
from typing import override

from sciencebench.coordination import budget, scripts
from sciencebench.coordination.keys import ClusterKeys, JobKeys
from sciencebench.coordination.protocol import JOBS_KEY, Claim, Leases, Results, Start
from sciencebench.coordination.redis.base import OUTAGE_SEC, RedisBase
from sciencebench.core.models import Redispatch, TrialState, TrialStatus


class RedisLeases(RedisBase, Results, Leases):
    """`Results` and `Leases` (the scripts `park`, `renew`, `commit`, `start`, `finish`, `take_orphan`)."""

    def __init__(self, url: str, outage_sec: float = OUTAGE_SEC) -> None:
        super().__init__(url, outage_sec)
        self._park = self._script(scripts.PARK)
        self._renew = self._script(scripts.RENEW)
        self._commit = self._script(scripts.COMMIT)
        self._start = self._script(scripts.START)
        self._finish = self._script(scripts.FINISH)
        self._take_orphan = self._script(scripts.TAKE_ORPHAN)

    @override
    def get_result(self, job: str, key: str) -> str | None:
        """The stored TrialRecord JSON of a trial, or None."""
        value = self.patiently(lambda: self._redis.get(JobKeys(job).result(key)))
        return str(value) if value is not None else None

    @override
    def store_result(self, job: str, key: str, record_json: str) -> bool:
        """Store a trial's record unless it has one (`SET NX`)."""
        return bool(self.patiently(lambda: self._redis.set(JobKeys(job).result(key), record_json, nx=True)))

    @override
    def clear_result(self, job: str, key: str) -> None:
        """Forget a trial's record and its counted mark."""
        keys = JobKeys(job)
        self.patiently(lambda: self._redis.delete(keys.result(key), keys.counted(key)))

    @override
    def mark_counted(self, job: str, key: str) -> None:
        """Remember that the chord counted this trial."""
        self.patiently(lambda: self._redis.set(JobKeys(job).counted(key), "1"))

    @override
    def is_counted(self, job: str, key: str) -> bool:
        """Whether the chord has counted this trial."""
        return bool(self.patiently(lambda: self._redis.exists(JobKeys(job).counted(key))))

    @override
    def park(self, job: str, key: str, token: str, ttl_sec: float) -> bool:
        """Hold the lease under `token` unless a live process holds it or the chord counted the trial."""
        args: list[int | str] = [token, int(ttl_sec * 1000), job]
        return bool(self.patiently(lambda: self._park(job, key, args)))

    @override
    def renew(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        """Extend `owner`'s lease while it is the trial's rightful holder (see `_RIGHTFUL`)."""
        args: list[int | str] = [owner, int(ttl_sec * 1000), key]
        return bool(self.patiently(lambda: self._renew(job, key, args)))

    @override
    def commit_result(
        self, job: str, key: str, owner: str, record_json: str, status: TrialStatus | None = None
    ) -> bool:
        """Store the record (and `status`) if `owner` is rightful and the trial has none (one script)."""
        args = [owner, record_json, key, status.model_dump_json() if status else "",
                *budget.spend_args(budget.spend_of(record_json))]  # fmt: skip
        return bool(self.patiently(lambda: self._commit(job, key, args)))

    @override
    def start(
        self, job: str, key: str, owner: str, ttl_sec: float, cap: int, parked: str = "",
        running: Redispatch | None = None,
    ) -> Start:  # fmt: skip
        """Claim (with the running entry), then the cancel flag and a slot, in one script (`Leases.start`)."""
        entry = running.model_dump_json() if running is not None else ""
        args: list[int | str] = [owner, int(ttl_sec * 1000), job, parked, key, cap, entry]
        claim, cancelled, slot, over = self.patiently(lambda: self._start(job, key, args))
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
                    pipe.hset(JobKeys(job).running, key, payload.model_dump_json())
                pipe.hset(JobKeys(job).state, key, status)
                pipe.execute()

        self.patiently(send)

    @override
    def set_running(self, job: str, key: str, payload: Redispatch) -> None:
        """Record how to re-send a trial that is running now."""
        self.patiently(lambda: self._redis.hset(JobKeys(job).running, key, payload.model_dump_json()))

    @override
    def is_leased(self, job: str, key: str) -> bool:
        """Whether anyone holds the trial's lease now (`EXISTS`)."""
        return bool(self.patiently(lambda: self._redis.exists(JobKeys(job).lease(key))))

    @override
    def finish(self, job: str, key: str, owner: str) -> bool:
        """Give back slot, running entry and lease while `owner` is rightful (one script)."""
        return bool(self.patiently(lambda: self._finish(job, key, [owner, key, "all"])))

    @override
    def free_slot(self, job: str, key: str, owner: str) -> bool:
        """Give back the slot while `owner` is rightful; lease and running entry stay (`finish`'s script)."""
        return bool(self.patiently(lambda: self._finish(job, key, [owner, key, "slot"])))

    @override
    def take_orphan(self, job: str, key: str) -> bool:
        """Clear the running entry if the lease is still absent (one script)."""
        return bool(self.patiently(lambda: self._take_orphan(job, key, [key])))

    @override
    def orphaned(self) -> list[tuple[str, str, Redispatch]]:
        """Running trials whose lease expired: their host is gone."""
        found = []
        for job in self.patiently(lambda: self._redis.smembers(JOBS_KEY)):
            job_keys = JobKeys(str(job))
            running = self._hash(job_keys.running)
            if not running:
                continue
            keys = list(running)
            leases = self._mget([job_keys.lease(key) for key in keys])
            for key, lease in zip(keys, leases, strict=True):
                if lease is None:
                    found.append((str(job), key, Redispatch.model_validate_json(running[key])))
        return found

    @override
    def try_lock(self, name: str, ttl_sec: float) -> bool:
        """A short-lived lock `name` (`SET NX PX`); False when someone holds it."""
        lock = ClusterKeys.lock(name)
        return bool(self.patiently(lambda: self._redis.set(lock, "1", nx=True, px=int(ttl_sec * 1000))))

    @override
    def unlock(self, name: str) -> None:
        """Release the lock `name` (`DEL`)."""
        self.patiently(lambda: self._redis.delete(ClusterKeys.lock(name)))
