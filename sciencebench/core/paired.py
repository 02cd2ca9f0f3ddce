"""Two jobs compared task by task: per-task outcomes, flips, a bootstrap interval, McNemar's exact test.

Pure: the inputs are trial records (`task_outcomes`), so `sciencebench compare`
and its tests compute the same numbers. A task's outcome is its mean reward
over its *counted* attempts (a trial without rewards counts 0, as Pier's
mean); trials that are not the model's (`excluded_class`) are left out and
counted apart. A task passes when that mean is at least `PASS_REWARD`. What
each number is: `compare`.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from sciencebench.core.errors import Stage
from sciencebench.core.models import TrialRecord
from sciencebench.core.pierjob import CANCELLED_TYPES

# A task passes when its mean reward over attempts reaches this (every attempt solved, with 0/1 rewards).
PASS_REWARD = 1.0
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
SCHEMA = "sciencebench.compare/1"
# Excluded trials, by class: a model provider failed them, they never started, or the cluster did.
PROVIDER = "provider_error"
NOT_STARTED = "not_started"
INFRASTRUCTURE = "infrastructure"
# Stages before the agent ran, where a failure is the cluster's (a host, a pull, a slot); and cancels.
INFRASTRUCTURE_STAGES = frozenset(
    {Stage.ADMISSION, Stage.PREFLIGHT, Stage.SLOT, Stage.WORKSPACE, Stage.SECRETS, Stage.PULL, Stage.WORKER}
)


def excluded_class(record: TrialRecord) -> str | None:
    """Why a trial does not count for the model (`PROVIDER`, `NOT_STARTED`, `INFRASTRUCTURE`), else None."""
    if record.provider_status is not None:
        return PROVIDER
    if record.not_started is not None:
        return NOT_STARTED
    if record.exception_type in CANCELLED_TYPES:  # ours, or Pier's when a cancel stopped its run
        return INFRASTRUCTURE
    if record.exception_type is not None and record.stage in INFRASTRUCTURE_STAGES:
        return INFRASTRUCTURE
    return None


class TaskOutcome(BaseModel):
    """One task of one job: its mean reward over its counted attempts, and whether it passed."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    n_counted: int
    mean_reward: float
    passed: bool


class JobOutcomes(BaseModel):
    """A job's tasks with at least one counted trial, and the trials left out, by class."""

    model_config = ConfigDict(frozen=True)

    tasks: dict[str, TaskOutcome]
    excluded: dict[str, int] = Field(default_factory=dict)


def task_outcomes(records: Iterable[TrialRecord]) -> JobOutcomes:
    """Each task's outcome over its counted trials; the excluded trials counted by class."""
    rewards: dict[str, list[float]] = {}
    excluded: Counter[str] = Counter()
    for record in records:
        why = excluded_class(record)
        if why is not None:
            excluded[why] += 1
            continue
        rewards.setdefault(record.task_id, []).append(record.reward or 0.0)
    tasks = {}
    for task_id, values in sorted(rewards.items()):
        mean = math.fsum(values) / len(values)
        tasks[task_id] = TaskOutcome(
            task_id=task_id, n_counted=len(values), mean_reward=mean, passed=mean >= PASS_REWARD
        )
    return JobOutcomes(tasks=tasks, excluded=dict(sorted(excluded.items())))


def mcnemar_exact(b: int, c: int) -> float:
    """McNemar's exact two-sided p-value for `b` and `c` discordant pairs (1.0 when there are none).

    Under the null each discordant pair goes either way with probability 1/2:
    p = min(1, 2 * P[X <= min(b, c)]) for X ~ Binomial(b + c, 1/2), summed exactly.
    """
    n = b + c
    if n == 0:
        return 1.0
    tail = Fraction(sum(math.comb(n, i) for i in range(min(b, c) + 1)), 2**n)
    return float(min(Fraction(1), 2 * tail))


def bootstrap_interval(
    differences: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """The percentile bootstrap interval (`CONFIDENCE`) of the mean of paired `differences`.

    `resamples` means of len(differences) draws with replacement, from
    `random.Random(seed)` (the same inputs give the same interval); the bounds
    are the sorted means at 2.5% and 97.5%. Raises ValueError on no differences.
    """
    if not differences:
        raise ValueError("no paired tasks")
    rng = random.Random(seed)  # noqa: S311 (a reproducible resample, not a secret)
    n = len(differences)
    means = sorted(math.fsum(rng.choices(differences, k=n)) / n for _ in range(resamples))
    cut = min(round(resamples * (1 - CONFIDENCE) / 2), (resamples - 1) // 2)  # means left out each side
    return means[cut], means[resamples - 1 - cut]


class PairedTask(BaseModel):
    """A task both jobs counted: each job's mean reward and pass, and B's mean minus A's."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    a_mean: float
    b_mean: float
    a_passed: bool
    b_passed: bool
    difference: float


class Comparison(BaseModel):
    """What two jobs' outcomes say side by side (B against A); the `--json` of `compare` adds the jobs.

    n_paired            tasks both jobs counted
    mean_difference     mean over paired tasks of B's mean reward minus A's (None: no pair)
    interval            its percentile bootstrap interval (`bootstrap_interval`)
    a_pass_b_fail       discordant pairs one way (pass -> fail) ...
    a_fail_b_pass       ... and the other (fail -> pass)
    mcnemar_p           McNemar's exact two-sided p-value on them (`mcnemar_exact`)
    pass_to_fail, fail_to_pass   those tasks, by id
    only_in_a, only_in_b         tasks one job counted and the other did not (not paired)
    """

    model_config = ConfigDict(frozen=True)

    n_paired: int
    mean_difference: float | None
    interval: tuple[float, float] | None
    confidence: float = CONFIDENCE
    resamples: int = BOOTSTRAP_RESAMPLES
    seed: int = BOOTSTRAP_SEED
    pass_reward: float = PASS_REWARD
    a_pass_b_fail: int
    a_fail_b_pass: int
    mcnemar_p: float
    pass_to_fail: list[str]
    fail_to_pass: list[str]
    only_in_a: list[str]
    only_in_b: list[str]
    tasks: list[PairedTask]


def _pair(a: TaskOutcome, b: TaskOutcome) -> PairedTask:
    return PairedTask(
        task_id=a.task_id,
        a_mean=a.mean_reward,
        b_mean=b.mean_reward,
        a_passed=a.passed,
        b_passed=b.passed,
        difference=b.mean_reward - a.mean_reward,
    )


def compare(a: JobOutcomes, b: JobOutcomes, seed: int = BOOTSTRAP_SEED) -> Comparison:
    """B against A, on the tasks both counted (see `Comparison`)."""
    paired = [_pair(a.tasks[task], b.tasks[task]) for task in sorted(a.tasks.keys() & b.tasks.keys())]
    differences = [task.difference for task in paired]
    pass_to_fail = [t.task_id for t in paired if t.a_passed and not t.b_passed]
    fail_to_pass = [t.task_id for t in paired if t.b_passed and not t.a_passed]
    return Comparison(
        n_paired=len(paired),
        mean_difference=math.fsum(differences) / len(paired) if paired else None,
        interval=bootstrap_interval(differences, seed=seed) if paired else None,
        seed=seed,
        a_pass_b_fail=len(pass_to_fail),
        a_fail_b_pass=len(fail_to_pass),
        mcnemar_p=mcnemar_exact(len(pass_to_fail), len(fail_to_pass)),
        pass_to_fail=pass_to_fail,
        fail_to_pass=fail_to_pass,
        only_in_a=sorted(a.tasks.keys() - b.tasks.keys()),
        only_in_b=sorted(b.tasks.keys() - a.tasks.keys()),
        tasks=paired,
    )
