"""Results and leases in memory: one record per trial, fenced leases, running entries, locks."""

from __future__ import annotations

import time
from typing import override

from sciencebench.coordination.budget import spend_of
from sciencebench.coordination.memory.base import MemoryBase
from sciencebench.coordination.protocol import (
    JOBS_KEY,
    PREFIX,
    Board,
    Claim,
    JobControl,
    Leases,
    Results,
    Slots,
    Start,
    job_key,
)
from sciencebench.core.models import Redispatch, TrialState, TrialStatus


class MemoryLeases(MemoryBase, Results, Leases, Slots, JobControl, Board):
    """`Results` and `Leases` (`start` also reads the cancel flag and takes a slot, as over Redis)."""

    @override
    def get_result(self, job: str, key: str) -> str | None:
        with self._lock:
            value = self._get(job_key(job, "result", key))
            return str(value) if value is not None else None

    @override
    def store_result(self, job: str, key: str, record_json: str) -> bool:
        with self._lock:
            name = job_key(job, "result", key)
            if self._get(name) is not None:
                return False
            self._put(name, record_json)
            return True

    @override
    def clear_result(self, job: str, key: str) -> None:
        with self._lock:
            self._values.pop(job_key(job, "result", key), None)
            self._values.pop(job_key(job, "counted", key), None)

    @override
    def mark_counted(self, job: str, key: str) -> None:
        with self._lock:
            self._put(job_key(job, "counted", key), True)

    @override
    def is_counted(self, job: str, key: str) -> bool:
        with self._lock:
            return bool(self._get(job_key(job, "counted", key)))

    def _claim(self, job: str, key: str, owner: str, ttl_sec: float, parked: str) -> Claim:
        """As `start.lua`'s claim: the lease unless the chord counted the trial or a live holder has it."""
        with self._lock:
            recorded = self._get(job_key(job, "result", key)) is not None
            if recorded and self._get(job_key(job, "counted", key)):
                return Claim.ANSWERED
            name = job_key(job, "lease", key)
            holder = self._get(name)
            if holder is not None and (not parked or holder != parked):
                return Claim.HELD
            self._values.setdefault(JOBS_KEY, set()).add(job)
            self._values[name] = owner
            self._expiry[name] = time.monotonic() + ttl_sec
            return Claim.RECORDED if recorded else Claim.CLAIMED

    @override
    def park(self, job: str, key: str, token: str, ttl_sec: float) -> bool:
        with self._lock:
            name = job_key(job, "lease", key)
            if self._get(name) not in (None, token) or self._get(job_key(job, "counted", key)):
                return False
            self._values.setdefault(JOBS_KEY, set()).add(job)
            self._values[name] = token
            self._expiry[name] = time.monotonic() + ttl_sec
            return True

    def _rightful(self, job: str, key: str, owner: str) -> bool:
        """As over Redis: the holder, or a lapsed holder its running entry still names."""
        holder = self._get(job_key(job, "lease", key))
        if holder is not None:
            return bool(holder == owner)
        entry = self._values.get(job_key(job, "running"), {}).get(key)
        return entry is not None and entry.owner == owner

    @override
    def renew(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        with self._lock:
            if not self._rightful(job, key, owner):
                return False
            name = job_key(job, "lease", key)
            self._values[name] = owner
            self._expiry[name] = time.monotonic() + ttl_sec
            return True

    @override
    def commit_result(
        self, job: str, key: str, owner: str, record_json: str, status: TrialStatus | None = None
    ) -> bool:
        with self._lock:
            name = job_key(job, "result", key)
            if self._get(name) is not None or not self._rightful(job, key, owner):
                return False
            self._put(name, record_json)
            if status is not None:
                self._values.setdefault(job_key(job, "state"), {})[key] = status
            self._ledger(job).add(spend_of(record_json), time.time())
            return True

    @override
    def start(
        self, job: str, key: str, owner: str, ttl_sec: float, cap: int, parked: str = "",
        running: Redispatch | None = None,
    ) -> Start:  # fmt: skip
        with self._lock:  # one step, as the script over Redis
            claim = self._claim(job, key, owner, ttl_sec, parked)
            if claim in (Claim.CLAIMED, Claim.RECORDED) and running is not None:
                self.set_running(job, key, running)
            if claim is not Claim.CLAIMED:
                return Start(claim=claim)
            if self.is_cancelled(job):
                return Start(claim=claim, cancelled=True)
            ledger = self._ledger(job)
            if ledger.is_reached():
                return Start(claim=claim, over_budget=True)
            slot = self.acquire_slot(job, key, cap, ttl_sec)
            if slot:
                ledger.let_start(key, time.time())
            return Start(claim=claim, slot=slot)

    @override
    def run_started(self, job: str, key: str, payload: Redispatch | None, host: str) -> None:
        if payload is not None:
            self.set_running(job, key, payload)
        self.set_state(job, key, TrialState.RUNNING, host)

    @override
    def is_leased(self, job: str, key: str) -> bool:
        with self._lock:
            return self._get(job_key(job, "lease", key)) is not None

    @override
    def set_running(self, job: str, key: str, payload: Redispatch) -> None:
        with self._lock:
            self._values.setdefault(job_key(job, "running"), {})[key] = payload

    @override
    def finish(self, job: str, key: str, owner: str) -> bool:
        with self._lock:
            if not self.free_slot(job, key, owner):
                return False
            self._values.get(job_key(job, "running"), {}).pop(key, None)
            lease = job_key(job, "lease", key)
            if self._get(lease) == owner:
                self._values.pop(lease, None)
                self._expiry.pop(lease, None)
            return True

    @override
    def free_slot(self, job: str, key: str, owner: str) -> bool:
        with self._lock:
            if not self._rightful(job, key, owner):
                return False
            self._values.get(job_key(job, "slots"), {}).pop(key, None)
            return True

    @override
    def take_orphan(self, job: str, key: str) -> bool:
        with self._lock:
            if self._get(job_key(job, "lease", key)) is not None:
                return False
            return self._values.get(job_key(job, "running"), {}).pop(key, None) is not None

    @override
    def orphaned(self) -> list[tuple[str, str, Redispatch]]:
        with self._lock:
            found = []
            for job in sorted(self._values.get(JOBS_KEY, set())):
                for key, payload in self._values.get(job_key(job, "running"), {}).items():
                    if self._get(job_key(job, "lease", key)) is None:
                        found.append((job, key, payload))
            return found

    @override
    def try_lock(self, name: str, ttl_sec: float) -> bool:
        with self._lock:
            lock = f"{PREFIX}:lock:{name}"
            if self._get(lock) is not None:
                return False
            self._put(lock, True)
            self._expiry[lock] = time.monotonic() + ttl_sec
            return True

    @override
    def unlock(self, name: str) -> None:
        with self._lock:
            lock = f"{PREFIX}:lock:{name}"
            self._values.pop(lock, None)
            self._expiry.pop(lock, None)
