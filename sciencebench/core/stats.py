"""The numbers a job reports: at its end (`job_numbers`), and on the way (`Spend`, `finish_in`).

Pure: the inputs are the trial records and the trials as Pier's statistics
read them (`core.piertrial.PierTrial`), so the finalizer, `summarize` and
`--local` compute the same numbers, and `summary.json` keeps them
(`stats`). Mean reward and pass@k are Pier's, over the *scored* trials only
(a provider failure or a trial never started is not the model's); what
each number is: `job_numbers`. The ETA (`finish_in`) places the waiting
trials, longest first, on the first slot to free.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from sciencebench.core.models import TrialRecord
from sciencebench.core.pierjob import eval_metrics, pass_at_k
from sciencebench.core.piertrial import Number, PierTrial


class EvalNumbers(BaseModel):
    """One agent and model (Pier's eval key): Pier's statistics over its scored trials."""

    model_config = ConfigDict(frozen=True)

    key: str  # Pier's `stats.evals` key: agent__model__dataset
    agent: str
    model: str | None
    n_trials: int  # scored trials
    n_with_rewards: int
    n_errors: int  # scored trials that ended with an exception
    metrics: dict[str, Number]  # Pier's Mean: {"mean": x}, or one mean per reward key
    pass_at_k: dict[int, float]


class Spend(BaseModel):
    """What trials spent, as Pier totals it per trial; None where no trial reported any."""

    model_config = ConfigDict(frozen=True)

    n_trials: int = 0  # trials looked at
    n_input_tokens: int | None = None
    n_output_tokens: int | None = None
    cost_usd: float | None = None
    n_priced: int = 0  # trials Pier gave a cost
    n_with_tokens: int = 0  # trials Pier gave token counts

    @classmethod
    def of(cls, records: Iterable[TrialRecord]) -> Spend:
        """The sums over `records`."""
        n = n_priced = n_with_tokens = 0
        n_input: int | None = None
        n_output: int | None = None
        cost: float | None = None
        for record in records:
            n += 1
            if record.n_input_tokens is not None:
                n_input = (n_input or 0) + record.n_input_tokens
            if record.n_output_tokens is not None:
                n_output = (n_output or 0) + record.n_output_tokens
            if record.n_input_tokens is not None or record.n_output_tokens is not None:
                n_with_tokens += 1
            if record.cost_usd is not None:
                cost = (cost or 0.0) + record.cost_usd
                n_priced += 1
        return cls(
            n_trials=n, n_input_tokens=n_input, n_output_tokens=n_output, cost_usd=cost,
            n_priced=n_priced, n_with_tokens=n_with_tokens,
        )  # fmt: skip


class TimeNumbers(BaseModel):
    """Wall time and how well the job's slots were used."""

    model_config = ConfigDict(frozen=True)

    wall_sec: float | None  # first trial start to last trial finish
    busy_sec: float  # the trials' durations, summed
    slots: int  # the job's --n-concurrent
    utilisation: float | None  # busy / (wall x slots)
    peak_running: int  # the most trials that ran at once


class JobNumbers(BaseModel):
    """Everything a finished (or partly finished) job reports under its table."""

    model_config = ConfigDict(frozen=True)

    n_trials: int
    n_scored: int
    evals: list[EvalNumbers]
    # Provider failures, by the gateway's answer (`TrialRecord.provider_status`: "429", "reset", ...).
    provider_errors: dict[str, int] = Field(default_factory=dict)
    # Registry failures past the registry deadline, by its answer (`TrialRecord.registry_status`).
    registry_errors: dict[str, int] = Field(default_factory=dict)
    # Trials never started, by why (`TrialRecord.not_started`: "budget", ...).
    not_started: dict[str, int] = Field(default_factory=dict)
    # Scored trials that failed, by failure class.
    errors: dict[str, int] = Field(default_factory=dict)
    spend: Spend
    time: TimeNumbers

    @property
    def n_provider_errors(self) -> int:
        """Trials a model provider failed."""
        return sum(self.provider_errors.values())

    @property
    def n_registry_errors(self) -> int:
        """Trials whose images a registry would not give before the registry deadline."""
        return sum(self.registry_errors.values())

    @property
    def n_not_started(self) -> int:
        """Trials that never started."""
        return sum(self.not_started.values())


def _eval_numbers(key: str, trials: list[PierTrial], n_errors: int) -> EvalNumbers:
    first = trials[0]
    metrics = next(iter(eval_metrics(key, [t.rewards for t in trials])), {})
    return EvalNumbers(
        key=key,
        agent=first.agent_name,
        model=first.model_name,
        n_trials=len(trials),
        n_with_rewards=sum(t.rewards is not None for t in trials),
        n_errors=n_errors,
        metrics=metrics,
        pass_at_k=pass_at_k(trials),
    )


def _time_numbers(records: Sequence[TrialRecord], slots: int) -> TimeNumbers:
    spans = [
        (r.started_at.timestamp(), r.finished_at.timestamp())
        for r in records
        if r.started_at is not None and r.finished_at is not None and r.finished_at >= r.started_at
    ]
    if not spans:
        return TimeNumbers(wall_sec=None, busy_sec=0.0, slots=slots, utilisation=None, peak_running=0)
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    busy = sum(end - start for start, end in spans)
    # A sweep over starts (+1) and ends (-1); an end at the instant of a start comes first.
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    utilisation = busy / (wall * slots) if wall > 0 else None
    return TimeNumbers(wall_sec=wall, busy_sec=busy, slots=slots, utilisation=utilisation, peak_running=peak)


def job_numbers(
    records: Sequence[TrialRecord], trials: Sequence[PierTrial], classes: Sequence[str], slots: int
) -> JobNumbers:
    """The job's numbers from its records, their trials as Pier reads them, and their failure classes.

    `trials` and `classes` are aligned with `records` (`core.pierjob.pier_trials`,
    `core.summary.failure_class`); `slots` is the job's `--n-concurrent`.

    evals        per agent and model (Pier's `stats.evals` keys): mean reward
                 and pass@k exactly as Pier computes them (`core.pierjob.eval_metrics`,
                 `core.pierjob.pass_at_k`), over the *scored* trials only:
                 a provider or registry failure or a trial never started (`TrialRecord.scored`
                 False) is not the model's, and is counted apart
    errors       the scored trials' failure classes (exception types, MissingPatch)
    spend        Pier's token and cost totals summed over the records; how many
                 trials Pier could price
    time         wall time (first start to last finish), the trials' summed
                 durations, the job's slots (`--n-concurrent`), utilisation =
                 summed durations / (wall time x slots), and the most trials seen
                 running at once
    """
    provider: Counter[str] = Counter()
    registry: Counter[str] = Counter()
    not_started: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    grouped: dict[str, list[PierTrial]] = {}
    n_errors: Counter[str] = Counter()
    for record, trial, failure in zip(records, trials, classes, strict=True):
        if record.provider_status is not None:
            provider[record.provider_status] += 1
            continue
        if record.registry_status is not None:
            registry[record.registry_status] += 1
            continue
        if record.not_started is not None:
            not_started[record.not_started] += 1
            continue
        grouped.setdefault(trial.eval_key, []).append(trial)
        n_errors[trial.eval_key] += trial.exception_type is not None
        if failure:
            errors[failure] += 1
    return JobNumbers(
        n_trials=len(records),
        n_scored=sum(len(t) for t in grouped.values()),
        evals=[_eval_numbers(key, group, n_errors[key]) for key, group in grouped.items()],
        provider_errors=dict(provider.most_common()),
        registry_errors=dict(registry.most_common()),
        not_started=dict(not_started.most_common()),
        errors=dict(errors.most_common()),
        spend=Spend.of(records),
        time=_time_numbers(records, slots),
    )


def finish_in(running_left: Sequence[float], waiting: Sequence[float], slots: int) -> float:
    """Seconds until the last trial ends: running trials' time left, waiting ones placed on `slots`.

    Each waiting trial (longest first, as the scheduler sends them) starts
    on the slot that frees first. More trials running than `slots` (the
    cluster shrank) each keep their own slot until they end.
    """
    free = [max(left, 0.0) for left in running_left]
    free += [0.0] * max(slots - len(free), 0)
    if not free:
        free = [0.0]
    heapq.heapify(free)
    for expected in sorted(waiting, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + max(expected, 0.0))
    return max(free)


def duration_text(seconds: float) -> str:
    """`42s`, `3m05s`, `2h07m`."""
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def spend_text(spend: Spend) -> str:
    """`12,345 input + 678 output tokens, $1.2300 (118 of 120 trials priced)`."""
    if spend.n_with_tokens == 0 and spend.n_priced == 0:
        return f"no token or cost totals from Pier ({spend.n_trials} trial(s))"
    tokens = f"{spend.n_input_tokens or 0:,} input + {spend.n_output_tokens or 0:,} output tokens"
    if spend.cost_usd is None:
        return f"{tokens}; no cost (Pier priced none of {spend.n_trials} trial(s): tokens only)"
    return f"{tokens}, ${spend.cost_usd:.4f} ({spend.n_priced} of {spend.n_trials} trial(s) priced)"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} x{n}" for name, n in counts.items())


def _eval_line(numbers: EvalNumbers) -> str:
    name = numbers.agent + (f" ({numbers.model})" if numbers.model else "")
    parts = [f"{numbers.n_trials} scored trial(s), {numbers.n_errors} with exceptions"]
    parts += [
        f"{'mean reward' if key == 'mean' else f'mean {key}'} {value:.3f}"
        for key, value in numbers.metrics.items()
    ]
    parts += [f"pass@{k} {value:.3f}" for k, value in sorted(numbers.pass_at_k.items())]
    return f"{name}: " + "; ".join(parts)


def report_lines(numbers: JobNumbers) -> list[str]:
    """The lines printed under a job's table (see `docs/operations.md`, "What a job reports")."""
    lines = [_eval_line(e) for e in numbers.evals] or ["no scored trials"]
    if numbers.provider_errors:
        counts = _counts(numbers.provider_errors)
        lines.append(f"provider errors: {numbers.n_provider_errors} (not in the mean; {counts})")
    if numbers.registry_errors:
        counts = _counts(numbers.registry_errors)
        lines.append(f"registry errors: {numbers.n_registry_errors} (not in the mean; {counts})")
    if numbers.not_started:
        lines.append(f"not started: {numbers.n_not_started} ({_counts(numbers.not_started)})")
    if numbers.errors:
        lines.append(f"errors: {sum(numbers.errors.values())} (" + _counts(numbers.errors) + ")")
    lines.append("spend: " + spend_text(numbers.spend))
    t = numbers.time
    if t.wall_sec is not None:
        used = f"{t.utilisation:.0%}" if t.utilisation is not None else "n/a"
        lines.append(
            f"wall time {duration_text(t.wall_sec)}; slot utilisation {used} (trials busy "
            f"{duration_text(t.busy_sec)} over {t.slots} slot(s); at most {t.peak_running} ran at once)"
        )
    return lines
