"""The one process's store every part of `MemoryCoordinator` shares: values that expire, one lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sciencebench.coordination.budget import Ledger
from sciencebench.coordination.protocol import HostKit, job_key


class MemoryBase:
    """Values by Redis key name (`coordination.protocol`), each with an optional expiry (monotonic clock)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: `start` composes claim, flag and slot
        self._values: dict[str, Any] = {}
        self._expiry: dict[str, float] = {}
        self._seen: dict[str, float] = {}
        self._paused: dict[str, str] = {}
        self._kits: dict[str, HostKit] = {}
        self._images: dict[str, str] = {}

    def _get(self, name: str) -> Any:
        """The value of `name` unless it expired (then forgotten), as Redis `GET`."""
        expiry = self._expiry.get(name)
        if expiry is not None and expiry <= time.monotonic():
            self._values.pop(name, None)
            self._expiry.pop(name, None)
        return self._values.get(name)

    def _put(self, name: str, value: Any) -> None:
        """A plain write, as Redis `SET`: the key keeps no earlier expiry."""
        self._values[name] = value
        self._expiry.pop(name, None)

    def _ledger(self, job: str) -> Ledger:
        """The job's budget ledger, made when missing."""
        name = job_key(job, "budget")
        ledger: Ledger | None = self._get(name)
        if ledger is None:
            ledger = Ledger()
            self._put(name, ledger)
        return ledger

    @property
    def recovered_at(self) -> float:
        """No broker, no outage: -inf."""
        return float("-inf")  # no broker, no outage

    def patiently[T](self, fn: Callable[[], T]) -> T:
        """Run `fn`: there is no outage to wait out."""
        return fn()

    def now(self) -> float:
        """The process's clock (epoch seconds): the one clock in one process."""
        return time.time()
