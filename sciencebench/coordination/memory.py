"""The coordination contract in memory, for the embedded mode (`submit --local`, no Redis)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, override

from sciencebench.coordination.protocol import JOBS_KEY, PREFIX, Coordinator, job_key
from sciencebench.core.models import Redispatch, TrialState, TrialStatus


class MemoryCoordinator(Coordinator):
    """The same contract in one process, for `submit --local` (no Redis).

    A lease, slot or lock expires on the monotonic clock. Running trials are
    tracked as over Redis, though in one process no host is ever lost.
    """

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

    @override
    def get_result(self, job: str, key: str) -> str | None:
        with self._lock:
            value = self._get(job_key(job, "result", key))
            return str(value) if value is not None else None

    @override
    def store_result(self, job: str, key: str, record_json: str) -> None:
        with self._lock:
            self._values[job_key(job, "result", key)] = record_json

    @override
    def clear_result(self, job: str, key: str) -> None:
        with self._lock:
            self._values.pop(job_key(job, "result", key), None)
            self._values.pop(job_key(job, "counted", key), None)

    @override
    def mark_counted(self, job: str, key: str) -> None:
        with self._lock:
            self._values[job_key(job, "counted", key)] = True

    @override
    def is_counted(self, job: str, key: str) -> bool:
        with self._lock:
            return bool(self._get(job_key(job, "counted", key)))

    @override
    def claim(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        with self._lock:
            self._values.setdefault(JOBS_KEY, set()).add(job)
            name = job_key(job, "lease", key)
            if self._get(name) is not None:
                return False
            self._values[name] = owner
            self._expiry[name] = time.monotonic() + ttl_sec
            return True

    @override
    def renew(self, job: str, key: str, owner: str, ttl_sec: float) -> bool:
        with self._lock:
            name = job_key(job, "lease", key)
            holder = self._get(name)
            if holder not in (owner, None):
                return False
            # As over Redis: a lease that lapsed with nobody taking it is re-created.
            self._values[name] = owner
            self._expiry[name] = time.monotonic() + ttl_sec
            return True

    @override
    def release(self, job: str, key: str, owner: str) -> None:
        with self._lock:
            name = job_key(job, "lease", key)
            if self._get(name) == owner:
                self._values.pop(name, None)
                self._expiry.pop(name, None)

    @override
    def set_running(self, job: str, key: str, payload: Redispatch) -> None:
        with self._lock:
            self._values.setdefault(JOBS_KEY, set()).add(job)
            self._values.setdefault(job_key(job, "running"), {})[key] = payload

    @override
    def clear_running(self, job: str, key: str) -> None:
        with self._lock:
            self._values.get(job_key(job, "running"), {}).pop(key, None)

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
    def release_slot(self, job: str, key: str) -> None:
        with self._lock:
            self._values.get(job_key(job, "slots"), {}).pop(key, None)

    @override
    def set_state(self, job: str, key: str, state: TrialState, host: str) -> None:
        with self._lock:
            states = self._values.setdefault(job_key(job, "state"), {})
            states[key] = TrialStatus(state=state, host=host, at=time.time())

    @override
    def set_states(self, job: str, keys: list[str], state: TrialState) -> None:
        for key in keys:
            self.set_state(job, key, state, "")

    @override
    def states(self, job: str) -> dict[str, TrialStatus]:
        with self._lock:
            return dict(self._get(job_key(job, "state")) or {})

    @override
    def cancel(self, job: str) -> None:
        with self._lock:
            self._values[job_key(job, "cancelled")] = True

    @override
    def uncancel(self, job: str) -> None:
        with self._lock:
            self._values.pop(job_key(job, "cancelled"), None)

    @override
    def is_cancelled(self, job: str) -> bool:
        with self._lock:
            return bool(self._get(job_key(job, "cancelled")))

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
    def retire(self, job: str, ttl_sec: int) -> None:
        with self._lock:
            self._values.get(JOBS_KEY, set()).discard(job)
            deadline = time.monotonic() + ttl_sec
            for name in [n for n in self._values if n.startswith(job_key(job, ""))]:
                self._expiry[name] = min(self._expiry.get(name, deadline), deadline)

    @property
    @override
    def recovered_at(self) -> float:
        return float("-inf")  # no broker, no outage

    @override
    def patiently[T](self, fn: Callable[[], T]) -> T:
        return fn()

    @override
    def try_lock(self, name: str, ttl_sec: float) -> bool:
        with self._lock:
            lock = f"{PREFIX}:lock:{name}"
            if self._get(lock) is not None:
                return False
            self._values[lock] = True
            self._expiry[lock] = time.monotonic() + ttl_sec
            return True
