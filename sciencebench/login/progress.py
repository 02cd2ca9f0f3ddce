"""A running job's live numbers: trials done/running/waiting, what they spent so far, an ETA.

`status` and the progress line of `submit --wait` show them (`Watcher.poll`;
what each number is: `Live`). A dry run's expected duration and cost come
from `expected_job`.
"""

from __future__ import annotations

import statistics
import time
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from sciencebench.coordination.history import estimates
from sciencebench.coordination.protocol import Coordinator
from sciencebench.coordination.shares import cluster_slots
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import JobSpec, TrialRecord, TrialSpec, TrialState, TrialStatus
from sciencebench.core.paths import SelectionPaths
from sciencebench.core.stats import Spend, duration_text, finish_in, spend_text
from sciencebench.login.plan import expected_seconds, expected_trial_seconds
from sciencebench.login.taskspec import DEFAULT_AGENT_TIMEOUT_SEC, TaskToml

FINISHED = (TrialState.DONE, TrialState.FAILED)


@dataclass(frozen=True)
class Live:
    """A job's trials by where they are, their spend so far, and when the last should end.

    spend      Pier's token and cost totals of the committed records in the
               store (each read once: a record does not change)
    ETA        `core.stats.finish_in`: each running trial's expected seconds
               minus how long it has run, the waiting ones' expected seconds,
               placed on the job's slots = min(--n-concurrent, the live
               cluster's slots) (`live_slots`; --n-concurrent when no worker
               answers the question)
    expected   per task, the first known of: what this job's own finished
               trials of the task measured (their median), the store's history
               of the task (`coordination.history.estimates`, as the scheduler
               orders trials), what this job's finished trials measured across
               tasks (their median), the task's timeouts (agent + verifier +
               build, the bound the scheduler starts from)
    """

    done: int
    failed: int
    running: int
    waiting: int  # queued, waiting for a slot, or held back: not started yet
    spend: Spend
    slots: int  # the job's slots now: min(--n-concurrent, live slots)
    live_slots: int | None  # the live cluster's slots; None when not asked or nobody answered
    eta_sec: float | None  # None when nothing is known of a remaining trial's duration
    sources: dict[str, int] = field(default_factory=dict)  # where the remaining trials' estimates came from
    provider_errors: dict[str, int] = field(
        default_factory=dict
    )  # finished trials a provider failed, by status
    not_started: dict[str, int] = field(default_factory=dict)  # finished trials that never started, by why
    registry_errors: dict[str, int] = field(default_factory=dict)  # finished trials a registry failed

    @property
    def remaining(self) -> int:
        """Trials not finished yet."""
        return self.running + self.waiting


def live_slots(coord: Coordinator, lease_seconds: float) -> int | None:
    """The trial slots of the live, unpaused worker hosts, as each reported them to the store.

    None when no live host reported any. Read from the store (no broadcast
    to the workers), so `status` answers at once.
    """
    return cluster_slots(coord, lease_seconds) or None


def timeout_bound(job: JobSpec, task_id: str) -> float | None:
    """The longest a trial of the task may run by its `task.toml` (as `login.plan.expand`).

    None when the file cannot be read.
    """
    path = SelectionPaths(job.selection_path).task_dir(task_id) / "task.toml"
    try:
        parsed = TaskToml.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError):
        return None
    return expected_trial_seconds(
        parsed.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT_SEC,
        parsed.verifier.timeout_sec,
        parsed.environment.build_timeout_sec,
        job.agent_timeout_multiplier,
        job.verifier_timeout_multiplier,
    )


class Watcher:
    """Reads a job's live numbers from the store; keeps what does not change between polls."""

    def __init__(self, coord: Coordinator, job: JobSpec, keys: Sequence[str]) -> None:
        """Watch the trials `keys` of `job`."""
        self.coord, self.job, self.keys = coord, job, list(keys)
        self._records: dict[str, TrialRecord] = {}
        self._history: dict[str, float] | None = None
        self._bounds: dict[str, float | None] = {}

    def _record(self, key: str) -> TrialRecord | None:
        if key not in self._records:
            stored = self.coord.get_result(self.job.job_key, key)
            if stored is None:
                return None
            try:
                self._records[key] = TrialRecord.model_validate_json(stored)
            except ValueError:
                return None
        return self._records[key]

    def _unshown(self, key: str) -> TrialState:
        """The state of a trial the board does not show: finished when it has a record, else queued."""
        record = self._record(key)
        if record is None:
            return TrialState.QUEUED
        return TrialState.FAILED if record.errored else TrialState.DONE

    def _expected(self, task_id: str, own: dict[str, list[float]], across: float | None) -> tuple[float, str]:
        if task_id in own:
            return statistics.median(own[task_id]), "this job's trials of the task"
        if self._history is None:
            self._history = estimates(self.coord, self.job)
        if task_id in self._history:
            return self._history[task_id], "history"
        if across is not None:
            return across, "this job's other tasks"
        if task_id not in self._bounds:
            self._bounds[task_id] = timeout_bound(self.job, task_id)
        bound = self._bounds[task_id]
        return (bound, "timeouts") if bound is not None else (0.0, "unknown")

    def poll(self, slots_now: int | None = None, now: float | None = None) -> Live:
        """The numbers now; `slots_now` the live cluster's slots (`live_slots`), None when unknown."""
        now = time.time() if now is None else now
        states = self.coord.states(self.job.job_key)
        finished: list[TrialRecord] = []
        running: list[tuple[str, TrialStatus]] = []
        waiting: list[str] = []
        n_done = n_failed = 0
        for key in self.keys:
            status = states.get(key)
            state = status.state if status else self._unshown(key)
            if state in FINISHED:
                n_done += state is TrialState.DONE
                n_failed += state is TrialState.FAILED
                if (record := self._record(key)) is not None:
                    finished.append(record)
            elif state is TrialState.RUNNING and status is not None:
                running.append((key, status))
            else:
                waiting.append(key)
        own: dict[str, list[float]] = {}
        for record in finished:
            if not record.scored:  # a provider or registry failure, a trial never started: no task measured
                continue
            seconds = record.measured_sec
            if seconds is not None:
                own.setdefault(record.task_id, []).append(seconds)
        measured = [s for values in own.values() for s in values]
        across = statistics.median(measured) if measured else None
        sources: dict[str, int] = {}
        running_left, waiting_sec = [], []
        for key, status in running:
            expected, source = self._expected(TrialKey.parse(key).task_id, own, across)
            running_left.append(expected - max(now - status.at, 0.0))
            sources[source] = sources.get(source, 0) + 1
        for key in waiting:
            expected, source = self._expected(TrialKey.parse(key).task_id, own, across)
            waiting_sec.append(expected)
            sources[source] = sources.get(source, 0) + 1
        cap = self.job.n_concurrent
        slots = min(cap, slots_now) if slots_now else cap
        eta = None if "unknown" in sources else finish_in(running_left, waiting_sec, slots)
        return Live(
            done=n_done, failed=n_failed, running=len(running), waiting=len(waiting),
            spend=Spend.of(finished), slots=slots, live_slots=slots_now, eta_sec=eta, sources=sources,
            provider_errors=dict(Counter(r.provider_status for r in finished if r.provider_status)),
            not_started=dict(Counter(r.not_started for r in finished if r.not_started)),
            registry_errors=dict(Counter(r.registry_status for r in finished if r.registry_status)),
        )  # fmt: skip


def _short_count(n: int | None) -> str:
    n = n or 0
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else str(n)


def progress_detail(live: Live) -> str:
    """The progress line of `submit --wait`: counts, spend so far, ETA."""
    parts = [f"done {live.done}  failed {live.failed}  running {live.running}  waiting {live.waiting}"]
    spend = live.spend
    if spend.n_with_tokens:
        parts.append(f"tokens {_short_count(spend.n_input_tokens)}/{_short_count(spend.n_output_tokens)}")
    if spend.cost_usd is not None:
        parts.append(f"${spend.cost_usd:.2f}")
    if live.remaining:
        parts.append(f"ETA {duration_text(live.eta_sec)}" if live.eta_sec is not None else "ETA ?")
    return "  ".join(parts)


def status_lines(live: Live, n_concurrent: int) -> list[str]:
    """What `status` prints under its table: counts, spend so far, the ETA and what it rests on."""
    lines = [
        f"trials: done {live.done}, failed {live.failed}, running {live.running}, waiting {live.waiting}",
        "spend so far: " + spend_text(live.spend),
    ]
    for name, counts in (("provider errors", live.provider_errors), ("registry errors", live.registry_errors),
                         ("not started", live.not_started)):  # fmt: skip
        if counts:
            shown = ", ".join(f"{what} x{n}" for what, n in sorted(counts.items()))
            lines.append(f"{name}: {sum(counts.values())} (not in the mean; {shown})")
    if not live.remaining:
        lines.append("ETA: every trial has finished")
        return lines
    cluster = (
        f"live cluster {live.live_slots} slot(s), --n-concurrent {n_concurrent}"
        if live.live_slots is not None
        else f"--n-concurrent {n_concurrent}; no live host reported its slots"
    )
    basis = ", ".join(f"{n} by {source}" for source, n in sorted(live.sources.items()))
    if live.eta_sec is None:
        lines.append(f"ETA: unknown ({basis})")
    else:
        lines.append(
            f"ETA: {duration_text(live.eta_sec)} ({live.running} running, {live.waiting} waiting on "
            f"{live.slots} slot(s): {cluster}; expected durations: {basis})"
        )
    return lines


@dataclass(frozen=True)
class Expected:
    """What a submit expects of a job before it runs: its duration on some slots."""

    seconds: float
    slots: int
    n_trials: int
    n_from_history: int  # trials whose task has history; the rest go by their timeouts
    cost_usd: float | None = None  # the trials with cost history, summed; None when none has
    n_with_cost: int = 0


def expected_job(
    trials: Sequence[TrialSpec], measured: dict[str, float], slots: int, costs: dict[str, float] | None = None
) -> Expected:
    """The job's expected duration: its trials (history, else timeouts) placed on `slots` longest first.

    `costs` (task id -> dollars, `coordination.costs.cost_estimates`): its expected cost.
    """
    seconds = [expected_seconds(trial, measured) for trial in trials]
    priced = [costs[trial.task_id] for trial in trials if costs and trial.task_id in costs]
    return Expected(
        seconds=finish_in([], seconds, slots),
        slots=slots,
        n_trials=len(trials),
        n_from_history=sum(trial.task_id in measured for trial in trials),
        cost_usd=sum(priced) if priced else None,
        n_with_cost=len(priced),
    )


def expected_lines(
    expected: Expected,
    n_concurrent: int,
    slots_seen: int | None,
    why_not: str = "no live host reported its slots",
) -> list[str]:
    """What `submit --dry-run` prints of the expected duration and cost.

    `slots_seen` None: the live cluster's slots are unknown, for the reason `why_not`.
    """
    if slots_seen is None:
        where = f"on --n-concurrent {n_concurrent} slot(s) ({why_not})"
    else:
        where = f"on {expected.slots} slot(s) (live cluster {slots_seen}, --n-concurrent {n_concurrent})"
    basis = (
        f"{expected.n_from_history} of {expected.n_trials} trial(s) by history, the rest by their timeouts"
    )
    if expected.cost_usd is None:
        cost = "expected cost: no cost history"
    else:
        unknown = expected.n_trials - expected.n_with_cost
        rest = f"; {unknown} trial(s) without cost history not counted" if unknown else ""
        cost = (
            f"expected cost: ${expected.cost_usd:.2f} ({expected.n_with_cost} trial(s) by cost history{rest})"
        )
    return [f"expected duration: {duration_text(expected.seconds)} {where}; {basis}", cost]
