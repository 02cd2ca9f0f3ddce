"""Job control, history and budgets in memory: cancel flags, unfit hosts, chords, durations, spend."""

from __future__ import annotations

import time
from typing import override

from sciencebench.coordination import shares
from sciencebench.coordination.budget import Budget, Budgets, Ledger, Spend
from sciencebench.coordination.history import SAMPLES
from sciencebench.coordination.keys import SHARES_KEY, WEIGHTS_KEY
from sciencebench.coordination.memory.base import MemoryBase
from sciencebench.coordination.protocol import HISTORY_KEY, JOBS_KEY, History, JobControl, Unfit, job_key


class MemoryJobs(MemoryBase, JobControl, History, Budgets):
    """`JobControl`, `History` and `Budgets`, by the rules the Redis scripts follow."""

    @override
    def open_dispatch(self, job: str, dispatch_id: str) -> None:
        with self._lock:
            self._values.setdefault(job_key(job, "dispatches"), set()).add(dispatch_id)

    @override
    def close_dispatch(self, job: str, dispatch_id: str) -> None:
        with self._lock:
            self._values.get(job_key(job, "dispatches"), set()).discard(dispatch_id)

    @override
    def open_dispatches(self, job: str) -> set[str]:
        with self._lock:
            return set(self._get(job_key(job, "dispatches")) or set())

    @override
    def cancel(self, job: str) -> None:
        with self._lock:
            self._put(job_key(job, "cancelled"), True)

    @override
    def uncancel(self, job: str) -> None:
        with self._lock:
            self._values.pop(job_key(job, "cancelled"), None)

    @override
    def is_cancelled(self, job: str) -> bool:
        with self._lock:
            return bool(self._get(job_key(job, "cancelled")))

    @override
    def mark_unfit(self, job: str, host: str, reason: str) -> None:
        with self._lock:
            self._values.setdefault(job_key(job, "unfit"), {})[host] = Unfit(reason=reason, at=time.time())

    @override
    def unfit_hosts(self, job: str) -> dict[str, Unfit]:
        with self._lock:
            return dict(self._get(job_key(job, "unfit")) or {})

    @override
    def retire(self, job: str, ttl_sec: int) -> None:
        with self._lock:
            self._values.get(JOBS_KEY, set()).discard(job)
            self._values.get(SHARES_KEY, {}).pop(job, None)
            self._values.get(WEIGHTS_KEY, {}).pop(shares.job_field(job), None)
            deadline = time.monotonic() + ttl_sec
            for name in [n for n in self._values if n.startswith(job_key(job, ""))]:
                self._expiry[name] = min(self._expiry.get(name, deadline), deadline)

    @override
    def add_durations(self, job: str, durations: dict[str, list[float]]) -> None:
        with self._lock:
            history: dict[str, list[tuple[float, str]]] = self._values.setdefault(HISTORY_KEY, {})
            for key, seconds in durations.items():
                kept = [entry for entry in history.get(key, []) if entry[1] != job]
                history[key] = (kept + [(s, job) for s in seconds])[-SAMPLES:]

    @override
    def durations(self, keys: list[str]) -> dict[str, list[float]]:
        with self._lock:
            history: dict[str, list[tuple[float, str]]] = self._values.get(HISTORY_KEY, {})
            return {key: [s for s, _ in history[key]] for key in keys if key in history}

    @override
    def all_durations(self) -> dict[str, list[float]]:
        with self._lock:
            history: dict[str, list[tuple[float, str]]] = self._values.get(HISTORY_KEY, {})
            return {key: [s for s, _ in entries] for key, entries in history.items()}

    @override
    def set_budget(
        self, job: str, max_cost_usd: float | None, max_tokens: int | None, spent: Spend | None = None
    ) -> Budget:
        with self._lock:
            fresh = self._get(job_key(job, "budget")) is None
            ledger = self._ledger(job)
            ledger.set_limits(max_cost_usd, max_tokens, spent, fresh, time.time())
            return ledger.snapshot()

    @override
    def budget(self, job: str) -> Budget:
        with self._lock:
            ledger: Ledger | None = self._get(job_key(job, "budget"))
            return ledger.snapshot() if ledger is not None else Budget()

    @override
    def start_within_budget(self, job: str, key: str) -> bool:
        with self._lock:
            return self._ledger(job).let_start(key, time.time())
