"""The coordination contract in memory, for the embedded mode (`submit --local`, no Redis)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, override

from sciencebench.coordination import shares
from sciencebench.coordination.budget import Budget, Ledger, Spend, spend_of
from sciencebench.coordination.history import SAMPLES, measured_seconds
from sciencebench.coordination.protocol import (
    HISTORY_KEY,
    JOBS_KEY,
    PREFIX,
    Claim,
    Coordinator,
    Held,
    HostKit,
    HostStatus,
    Start,
    Unfit,
    job_key,
    parking_token,
)
from sciencebench.core.models import Redispatch, TrialState, TrialStatus


@dataclass
class _Held:
    """A job's held trials (as the `held` keys over Redis): member -> expected seconds and payload."""

    window: int
    at: float = 0.0
    expected: dict[str, float] = field(default_factory=dict)
    payloads: dict[str, Redispatch] = field(default_factory=dict)
    tasks: dict[str, list[str]] = field(default_factory=dict)  # task id -> members, until measured
    probe: set[str] = field(default_factory=set)  # sent trial keys whose record would measure a task


class MemoryCoordinator(Coordinator):
    """The same contract in one process, for `submit --local` (no Redis).

    A lease, slot or lock expires on the monotonic clock. Running trials are
    tracked as over Redis, though in one process no host is ever lost.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: `start` composes claim, flag and slot
        self._values: dict[str, Any] = {}
        self._expiry: dict[str, float] = {}
        self._seen: dict[str, float] = {}
        self._paused: dict[str, str] = {}
        self._kits: dict[str, HostKit] = {}
        self._images: dict[str, str] = {}

    def _get(self, name: str) -> Any:
        expiry = self._expiry.get(name)
        if expiry is not None and expiry <= time.monotonic():
            self._values.pop(name, None)
            self._expiry.pop(name, None)
        return self._values.get(name)

    def _put(self, name: str, value: Any) -> None:
        """A plain write, as Redis `SET`: the key keeps no earlier expiry."""
        self._values[name] = value
        self._expiry.pop(name, None)

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

    @override
    def claim(self, job: str, key: str, owner: str, ttl_sec: float, parked: str = "") -> Claim:
        with self._lock:
            if self._get(job_key(job, "result", key)) is not None:
                return Claim.ANSWERED
            name = job_key(job, "lease", key)
            holder = self._get(name)
            if holder is not None and (not parked or holder != parked):
                return Claim.HELD
            self._values.setdefault(JOBS_KEY, set()).add(job)
            self._values[name] = owner
            self._expiry[name] = time.monotonic() + ttl_sec
            return Claim.CLAIMED

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
            claim = self.claim(job, key, owner, ttl_sec, parked=parked)
            if claim is not Claim.CLAIMED:
                return Start(claim=claim)
            if running is not None:
                self.set_running(job, key, running)
            if self.is_cancelled(job):
                return Start(claim=claim, cancelled=True)
            ledger = self._ledger(job)
            if ledger.is_reached():
                return Start(claim=claim, over_budget=True)
            slot = self.acquire_slot(job, key, cap, ttl_sec)
            if slot:
                ledger.let_start(key, time.time())
            return Start(claim=claim, slot=slot)

    def _ledger(self, job: str) -> Ledger:
        """The job's budget ledger, made when missing."""
        name = job_key(job, "budget")
        ledger: Ledger | None = self._get(name)
        if ledger is None:
            ledger = Ledger()
            self._put(name, ledger)
        return ledger

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

    @override
    def run_started(self, job: str, key: str, payload: Redispatch | None, host: str) -> None:
        if payload is not None:
            self.set_running(job, key, payload)
        self.set_state(job, key, TrialState.RUNNING, host)

    @override
    def release(self, job: str, key: str, owner: str) -> None:
        with self._lock:
            name = job_key(job, "lease", key)
            if self._get(name) == owner:
                self._values.pop(name, None)
                self._expiry.pop(name, None)

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
            if not self._rightful(job, key, owner):
                return False
            self._values.get(job_key(job, "slots"), {}).pop(key, None)
            self._values.get(job_key(job, "running"), {}).pop(key, None)
            lease = job_key(job, "lease", key)
            if self._get(lease) == owner:
                self._values.pop(lease, None)
                self._expiry.pop(lease, None)
            return True

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
                task = key.partition("#")[0]
                seconds = measured_seconds(json.loads(record))
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
            state.probe |= {key for key in sent if key.partition("#")[0] in state.tasks}

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

    @override
    def register_share(self, job: str, share: shares.Share) -> None:
        with self._lock:
            self._values.setdefault(shares.SHARES_KEY, {})[job] = share

    @override
    def set_weight(self, field: str, weight: float | None) -> None:
        with self._lock:
            weights: dict[str, float] = self._values.setdefault(shares.WEIGHTS_KEY, {})
            if weight is None:
                weights.pop(field, None)
            else:
                weights[field] = float(weight)

    @override
    def share_table(self) -> tuple[dict[str, shares.Share], dict[str, float]]:
        with self._lock:
            return dict(self._values.get(shares.SHARES_KEY, {})), dict(
                self._values.get(shares.WEIGHTS_KEY, {})
            )

    @override
    def share_load(self, job: str) -> shares.Load:
        with self._lock:
            held: _Held | None = self._get(job_key(job, "held"))
            waiting = len(held.expected) if held is not None else 0
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

    # --- what placement reads (`coordination.placement.MemoryPlacementStore`), as its script over Redis

    def live_jobs(self) -> set[str]:
        """The jobs with live state (`sciencebench:jobs`)."""
        with self._lock:
            return set(self._values.get(JOBS_KEY, set()))

    def running_entries(self, job: str) -> dict[str, Redispatch]:
        """The job's running entries (trial key -> payload)."""
        with self._lock:
            return dict(self._values.get(job_key(job, "running"), {}))

    def share_sent_keys(self, job: str) -> set[str]:
        """The job's trials fair share sent that have not started."""
        with self._lock:
            return set(self._get(job_key(job, "share", "sent")) or set())

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
            self._values.get(shares.SHARES_KEY, {}).pop(job, None)
            self._values.get(shares.WEIGHTS_KEY, {}).pop(shares.job_field(job), None)
            deadline = time.monotonic() + ttl_sec
            for name in [n for n in self._values if n.startswith(job_key(job, ""))]:
                self._expiry[name] = min(self._expiry.get(name, deadline), deadline)

    @override
    def now(self) -> float:
        return time.time()

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
            self._put(lock, True)
            self._expiry[lock] = time.monotonic() + ttl_sec
            return True

    @override
    def unlock(self, name: str) -> None:
        with self._lock:
            lock = f"{PREFIX}:lock:{name}"
            self._values.pop(lock, None)
            self._expiry.pop(lock, None)
