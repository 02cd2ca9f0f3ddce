"""Slots in memory: the job's --n-concurrent cap, trials waiting for a slot, trials held back."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import override

from sciencebench.coordination.history import stored_seconds
from sciencebench.coordination.memory.base import MemoryBase
from sciencebench.coordination.protocol import JOBS_KEY, Held, Leases, Slots, job_key, parking_token
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import Redispatch


@dataclass
class _Held:
    """A job's held trials (as the `held` keys over Redis): member -> expected seconds and payload."""

    window: int
    at: float = 0.0
    expected: dict[str, float] = field(default_factory=dict)
    payloads: dict[str, Redispatch] = field(default_factory=dict)
    tasks: dict[str, list[str]] = field(default_factory=dict)  # task id -> members, until measured
    probe: set[str] = field(default_factory=set)  # sent trial keys whose record would measure a task


def held_count(value: object) -> int:
    """How many trials a job's `held` value holds (none when it is not one)."""
    return len(value.expected) if isinstance(value, _Held) else 0


class MemorySlots(MemoryBase, Leases, Slots):
    """`Slots`: what the scripts `slot`, `wait`, `next_waiting` and `release_held` do over Redis."""

    @override
    def acquire_slot(self, job: str, key: str, cap: int, ttl_sec: float) -> bool:
        with self._lock:
            slots: dict[str, float] = self._values.setdefault(job_key(job, "slots"), {})
            now = time.monotonic()
            for holder in [h for h, expiry in slots.items() if expiry <= now]:
                del slots[holder]
            if key in slots or len(slots) < cap:
                slots[key] = now + ttl_sec
                return True
            return False

    @override
    def wait_for_slot(self, job: str, payload: Redispatch) -> None:
        with self._lock:
            waiting: dict[str, Redispatch] = self._values.setdefault(job_key(job, "waiting"), {})
            waiting[payload.trial.key] = payload  # a dict keeps the first place of a key

    def _guard(self, job: str, payload: Redispatch, guard_sec: float | None) -> None:
        """As `_GUARD` over Redis: a running entry and a parked lease for a held trial handed out."""
        if guard_sec is None:
            return
        key = payload.trial.key
        self.set_running(job, key, payload)
        name = job_key(job, "lease", key)
        if self._get(name) is None:
            self._values[name] = parking_token(payload.task_id)
            self._expiry[name] = time.monotonic() + max(guard_sec, 0.001)
        self._values.setdefault(JOBS_KEY, set()).add(job)

    @override
    def next_waiting(self, job: str, guard_sec: float) -> Redispatch | None:
        with self._lock:
            waiting: dict[str, Redispatch] = self._get(job_key(job, "waiting")) or {}
            if waiting:
                return waiting.pop(next(iter(waiting)))
            held: _Held | None = self._get(job_key(job, "held"))
            if held is None:
                return None
            for key in sorted(held.probe):  # sent trials that finished measure their task's held ones
                record = self._get(job_key(job, "result", key))
                if record is None:
                    continue
                held.probe.discard(key)
                task = TrialKey.parse(key).task_id
                seconds = stored_seconds(json.loads(record))
                if seconds is not None and task in held.tasks:
                    for member in held.tasks.pop(task):
                        if member in held.expected:
                            held.expected[member] = seconds
            if not held.expected:
                self._values.pop(job_key(job, "held"), None)
                return None
            member = min(held.expected, key=lambda m: (-held.expected[m], m))
            del held.expected[member]
            payload = held.payloads.pop(member)
            if payload.trial.task_id in held.tasks:
                held.probe.add(payload.trial.key)
            held.at = time.time()
            if not held.expected:
                self._values.pop(job_key(job, "held"), None)
            self._guard(job, payload, guard_sec)
            return payload

    @override
    def hold(self, job: str, held: list[Held], sent: list[str], window: int) -> None:
        if not held:
            return
        with self._lock:
            state: _Held = self._values.setdefault(job_key(job, "held"), _Held(window=window))
            state.window, state.at = window, time.time()
            for rank, item in enumerate(held):
                member = f"{rank:08d}/{item.payload.trial.key}"
                state.expected[member] = item.expected_sec
                state.payloads[member] = item.payload
                state.tasks.setdefault(item.payload.trial.task_id, []).append(member)
            state.probe |= {key for key in sent if TrialKey.parse(key).task_id in state.tasks}

    @override
    def release_held(self, job: str, guard_sec: float | None) -> list[Redispatch]:
        with self._lock:
            held: _Held | None = self._values.pop(job_key(job, "held"), None)
            if held is None:
                return []
            order = sorted(held.expected, key=lambda m: (-held.expected[m], m))
            payloads = [held.payloads[member] for member in order]
            for payload in payloads:
                self._guard(job, payload, guard_sec)
            return payloads

    @override
    def stalled_holds(self, idle_sec: float) -> dict[str, int]:
        with self._lock:
            now, stalled = time.time(), {}
            for job in sorted(self._values.get(JOBS_KEY, set())):
                held: _Held | None = self._get(job_key(job, "held"))
                if (
                    held is not None
                    and not self._values.get(job_key(job, "running"))
                    and not self._values.get(job_key(job, "waiting"))
                    and now - held.at >= idle_sec
                ):
                    stalled[job] = held.window
            return stalled
