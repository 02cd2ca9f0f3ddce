"""The board and fair share in memory: trial states, worker hosts, the shares of the cluster's slots."""

from __future__ import annotations

import time
from typing import override

from sciencebench.coordination import shares
from sciencebench.coordination.keys import SHARES_KEY, WEIGHTS_KEY
from sciencebench.coordination.memory.base import MemoryBase
from sciencebench.coordination.memory.holds import held_count
from sciencebench.coordination.protocol import JOBS_KEY, Board, HostKit, HostStatus, JobControl, job_key
from sciencebench.coordination.shares import Shares
from sciencebench.core.models import Redispatch, TrialState, TrialStatus


class MemoryBoard(MemoryBase, JobControl, Board, Shares):
    """`Board` and `Shares` (`choose_share` is `shares.choose`, the twin of `lua/share_choose.lua`)."""

    @override
    def register_share(self, job: str, share: shares.Share) -> None:
        with self._lock:
            self._values.setdefault(SHARES_KEY, {})[job] = share

    @override
    def set_weight(self, field: str, weight: float | None) -> None:
        with self._lock:
            weights: dict[str, float] = self._values.setdefault(WEIGHTS_KEY, {})
            if weight is None:
                weights.pop(field, None)
            else:
                weights[field] = float(weight)

    @override
    def share_table(self) -> tuple[dict[str, shares.Share], dict[str, float]]:
        with self._lock:
            return dict(self._values.get(SHARES_KEY, {})), dict(self._values.get(WEIGHTS_KEY, {}))

    @override
    def share_load(self, job: str) -> shares.Load:
        with self._lock:
            waiting = held_count(self._get(job_key(job, "held")))
            waiting += len(self._get(job_key(job, "waiting")) or {})
            return shares.Load(
                running=len(self._get(job_key(job, "slots")) or {}),
                sent=len(self._get(job_key(job, "share", "sent")) or set()),
                waiting=waiting,
            )

    @override
    def choose_share(self, capacity: int) -> str | None:
        with self._lock:
            table, weights = self.share_table()
            loads = {job: self.share_load(job) for job in table}
            for job in [j for j in table if self.is_cancelled(j)]:  # it occupies, but waits for nothing
                loads[job] = shares.Load(running=loads[job].running, sent=loads[job].sent)
            return shares.choose(table, weights, loads, capacity)

    @override
    def share_sent(self, job: str, key: str) -> None:
        with self._lock:
            self._values.setdefault(job_key(job, "share", "sent"), set()).add(key)

    @override
    def share_started(self, job: str, key: str) -> None:
        with self._lock:
            self._values.get(job_key(job, "share", "sent"), set()).discard(key)

    # --- what placement reads (`memory.placement.MemoryPlacementStore`), as its script over Redis

    def live_jobs(self) -> set[str]:
        """The jobs with live state (`sciencebench:jobs`)."""
        with self._lock:
            return set(self._values.get(JOBS_KEY, set()))

    def running_entries(self, job: str) -> dict[str, Redispatch]:
        """The job's running entries (trial key -> payload)."""
        with self._lock:
            return dict(self._values.get(job_key(job, "running"), {}))

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
    def beat(self, host: str) -> None:
        with self._lock:
            self._seen[host] = time.time()

    @override
    def pause_host(self, host: str, reason: str) -> None:
        with self._lock:
            self._paused[host] = reason

    @override
    def resume_host(self, host: str) -> None:
        with self._lock:
            self._paused.pop(host, None)

    @override
    def report_images(self, host: str, line: str) -> None:
        with self._lock:
            self._images[host] = line

    @override
    def describe_host(self, host: str, kit: HostKit) -> None:
        with self._lock:
            self._kits[host] = kit

    @override
    def forget_host(self, host: str) -> None:
        with self._lock:
            self._seen.pop(host, None)
            self._paused.pop(host, None)
            self._images.pop(host, None)
            self._kits.pop(host, None)

    @override
    def hosts(self) -> dict[str, HostStatus]:
        with self._lock:
            return {
                host: HostStatus(
                    seen_at=seen,
                    paused=host in self._paused,
                    reason=self._paused.get(host, ""),
                    images=self._images.get(host, ""),
                    kit=self._kits.get(host),
                )
                for host, seen in self._seen.items()
            }
