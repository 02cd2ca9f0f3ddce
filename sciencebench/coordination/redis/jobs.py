"""Job control, history and budgets over Redis: cancel flags, unfit hosts, chords, durations, spend."""

from __future__ import annotations

import json
from typing import override

from redis.typing import EncodableT

from sciencebench.coordination import budget, scripts, shares
from sciencebench.coordination.budget import Budget, Budgets, Spend
from sciencebench.coordination.history import SAMPLES
from sciencebench.coordination.keys import SHARES_KEY, WEIGHTS_KEY, JobKeys
from sciencebench.coordination.protocol import HISTORY_KEY, JOBS_KEY, History, JobControl, Unfit
from sciencebench.coordination.redis.base import OUTAGE_SEC, RedisBase, chunks


class RedisJobs(RedisBase, JobControl, History, Budgets):
    """`JobControl`, `History`, `Budgets` (scripts `add_durations`, `set_budget`, `start_within_budget`)."""

    def __init__(self, url: str, outage_sec: float = OUTAGE_SEC) -> None:
        super().__init__(url, outage_sec)
        self._add_durations = self._script(scripts.ADD_DURATIONS)
        self._set_budget = self._script(scripts.SET_BUDGET)
        self._start_within_budget = self._script(scripts.START_WITHIN_BUDGET)

    @override
    def open_dispatch(self, job: str, dispatch_id: str) -> None:
        """Add the chord to the job's open ones (`SADD`)."""
        self.patiently(lambda: self._redis.sadd(JobKeys(job).dispatches, dispatch_id))

    @override
    def close_dispatch(self, job: str, dispatch_id: str) -> None:
        """Remove the chord from the job's open ones (`SREM`)."""
        self.patiently(lambda: self._redis.srem(JobKeys(job).dispatches, dispatch_id))

    @override
    def open_dispatches(self, job: str) -> set[str]:
        """The job's open chords (`SMEMBERS`)."""
        return {str(d) for d in self.patiently(lambda: self._redis.smembers(JobKeys(job).dispatches))}

    @override
    def cancel(self, job: str) -> None:
        """Set the job's cancel flag."""
        self.patiently(lambda: self._redis.set(JobKeys(job).cancelled, "1"))

    @override
    def uncancel(self, job: str) -> None:
        """Clear the job's cancel flag."""
        self.patiently(lambda: self._redis.delete(JobKeys(job).cancelled))

    @override
    def is_cancelled(self, job: str) -> bool:
        """Whether the job's cancel flag is set."""
        return bool(self.patiently(lambda: self._redis.exists(JobKeys(job).cancelled)))

    @override
    def mark_unfit(self, job: str, host: str, reason: str) -> None:
        """Remember that `host` could not serve the job just now, and why."""
        value = Unfit(reason=reason, at=self.now()).model_dump_json()
        self.patiently(lambda: self._redis.hset(JobKeys(job).unfit, host, value))

    @override
    def unfit_hosts(self, job: str) -> dict[str, Unfit]:
        """Hosts that found they could not serve the job, with why and when."""
        return {
            host: Unfit.model_validate_json(value) for host, value in self._hash(JobKeys(job).unfit).items()
        }

    @override
    def retire(self, job: str, ttl_sec: int) -> None:
        """A finished job: watchdogs stop scanning it; its keys expire after `ttl_sec`.

        `EXPIRE LT` never lengthens a shorter life: a live lease still lapses
        on time (a key without a TTL counts as infinite, so it gets one).
        """

        def expire_all() -> None:
            self._redis.srem(JOBS_KEY, job)
            self._redis.hdel(SHARES_KEY, job)
            self._redis.hdel(WEIGHTS_KEY, shares.job_field(job))
            with self._redis.pipeline(transaction=False) as pipe:
                for name in self._redis.scan_iter(match=JobKeys(job).pattern(), count=1000):
                    pipe.expire(name, ttl_sec, lt=True)
                pipe.execute()

        self.patiently(expire_all)

    @override
    def add_durations(self, job: str, durations: dict[str, list[float]]) -> None:
        """Add the job's measured seconds to `sciencebench:history` (one script per 1,000 keys)."""
        for chunk in chunks(sorted(durations.items()), 1000):
            args: list[EncodableT] = [job, SAMPLES]
            for key, seconds in chunk:
                args += [key, json.dumps(seconds)]
            self._add(args)

    def _add(self, args: list[EncodableT]) -> None:
        self.patiently(lambda: self._add_durations("", "", args))

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

    @override
    def set_budget(
        self, job: str, max_cost_usd: float | None, max_tokens: int | None, spent: Spend | None = None
    ) -> Budget:
        """Set the limits (and seed a lost ledger) in one script; the ledger."""
        seed = budget.spend_args(spent or Spend())
        limits = ["" if max_cost_usd is None else repr(float(max_cost_usd)),
                  "" if max_tokens is None else str(max_tokens)]  # fmt: skip
        self.patiently(lambda: self._set_budget(job, "", [*limits, *seed]))
        return self.budget(job)

    @override
    def budget(self, job: str) -> Budget:
        """The ledger and the started trials (two `HGETALL`)."""
        keys = JobKeys(job)
        ledger, started = keys.budget, keys.budget_started
        return budget.from_hash(self._hash(ledger), self._hash(started))

    @override
    def start_within_budget(self, job: str, key: str) -> bool:
        """Let the trial start unless the budget is reached (one script)."""
        return bool(self.patiently(lambda: self._start_within_budget(job, key, [key])))
