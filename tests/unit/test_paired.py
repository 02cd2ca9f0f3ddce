"""paired.py: per-task outcomes, McNemar's exact p against hand-computed values, the bootstrap interval."""

from __future__ import annotations

import math
import random
import uuid
from typing import Any

import pytest

from sciencebench.core.models import TrialRecord
from sciencebench.core.paired import (
    INFRASTRUCTURE,
    NOT_STARTED,
    PROVIDER,
    JobOutcomes,
    bootstrap_interval,
    compare,
    mcnemar_exact,
    task_outcomes,
)

pytestmark = pytest.mark.unit

JOB = uuid.uuid4()


def _record(task_id: str, attempt: int = 1, reward: float | None = None, **fields: Any) -> TrialRecord:
    rewards = {"reward": reward} if reward is not None else None
    return TrialRecord(job_id=JOB, job_name="j", task_id=task_id, attempt=attempt, rewards=rewards, **fields)


def _outcomes(rewards: dict[str, float]) -> JobOutcomes:
    return task_outcomes(_record(task, reward=value) for task, value in rewards.items())


@pytest.mark.parametrize(
    ("b", "c", "expected"),
    [
        (0, 0, 1.0),  # no discordant pair
        (3, 3, 1.0),  # 2 * P[X <= 3], X ~ Bin(6, 1/2) = 2 * 42/64 > 1: capped at 1
        (5, 0, 0.0625),  # 2 * (1/2)^5
        (0, 5, 0.0625),  # symmetric
        (1, 9, 22 / 1024),  # 2 * (C(10,0) + C(10,1)) / 2^10
        (2, 8, 112 / 1024),  # 2 * (1 + 10 + 45) / 1024: R's binom.test(2, 10) gives 0.1094
        (1, 1, 1.0),  # 2 * 3/4 capped
        (0, 1, 1.0),  # 2 * 1/2
        (10, 30, 2 * sum(math.comb(40, i) for i in range(11)) / 2**40),
    ],
)
def test_mcnemar_exact_matches_the_binomial_tail(b: int, c: int, expected: float) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_of_many_pairs_stays_exact() -> None:
    # 2 * P[X <= 0], X ~ Bin(2000, 1/2): far below a float's smallest normal, computed without overflow.
    assert mcnemar_exact(0, 2000) == 0.0
    assert mcnemar_exact(500, 500) == 1.0


def test_bootstrap_of_one_value_is_that_value() -> None:
    assert bootstrap_interval([0.5]) == (0.5, 0.5)
    assert bootstrap_interval([0.0, 0.0, 0.0]) == (0.0, 0.0)


def test_bootstrap_is_reproducible_and_seeded() -> None:
    values = [1.0, 0.0, -1.0, 0.5, 0.0, 1.0, 0.0, 0.0]
    assert bootstrap_interval(values, seed=7) == bootstrap_interval(values, seed=7)
    low, high = bootstrap_interval(values)
    assert low <= sum(values) / len(values) <= high
    # Every resampled mean lies between the smallest and the largest value.
    assert -1.0 <= low <= high <= 1.0


def test_bootstrap_of_two_values_spans_their_means() -> None:
    # Means of 2 draws from {0, 1}: 0 (1/4), 0.5 (1/2), 1 (1/4); the 2.5% and 97.5% points are 0 and 1.
    assert bootstrap_interval([0.0, 1.0], resamples=4000) == (0.0, 1.0)


def test_bootstrap_interval_contains_the_true_difference() -> None:
    """Tasks B solves with probability 0.7 and A with 0.4: the interval holds the true 0.3 and not 0."""
    rng = random.Random(42)
    a = {f"{i:03d}": float(rng.random() < 0.4) for i in range(300)}
    b = {f"{i:03d}": float(rng.random() < 0.7) for i in range(300)}
    result = compare(_outcomes(a), _outcomes(b))
    assert result.interval is not None and result.mean_difference is not None
    low, high = result.interval
    assert low < 0.3 < high
    assert low > 0  # the difference is real
    assert low < result.mean_difference < high
    assert high - low < 0.25
    assert result.mcnemar_p < 1e-6


def test_bootstrap_needs_a_pair() -> None:
    with pytest.raises(ValueError, match="no paired tasks"):
        bootstrap_interval([])


def test_identical_jobs_differ_by_zero_with_p_one() -> None:
    rewards = {"001": 1.0, "002": 0.0, "003": 1.0, "004": 0.25}
    result = compare(_outcomes(rewards), _outcomes(rewards))
    assert result.n_paired == 4
    assert result.mean_difference == 0.0
    assert result.interval == (0.0, 0.0)
    assert result.mcnemar_p == 1.0
    assert result.pass_to_fail == result.fail_to_pass == result.only_in_a == result.only_in_b == []


def test_flips_each_way_and_tasks_of_one_job() -> None:
    a = _outcomes({"001": 1.0, "002": 0.0, "003": 1.0, "004": 0.0, "005": 1.0})
    b = _outcomes({"001": 0.0, "002": 1.0, "003": 1.0, "004": 1.0, "006": 1.0})
    result = compare(a, b)
    assert result.pass_to_fail == ["001"]
    assert result.fail_to_pass == ["002", "004"]
    assert (result.a_pass_b_fail, result.a_fail_b_pass) == (1, 2)
    assert result.mcnemar_p == 1.0  # 2 * P[X <= 1], X ~ Bin(3, 1/2) = 2 * 4/8
    assert result.only_in_a == ["005"] and result.only_in_b == ["006"]
    assert result.n_paired == 4
    assert result.mean_difference == pytest.approx((-1 + 1 + 0 + 1) / 4)


def test_a_task_is_the_mean_of_its_attempts_and_passes_only_at_one() -> None:
    records = [
        _record("001", 1, 1.0), _record("001", 2, 0.0),  # 0.5: not a pass
        _record("002", 1, 1.0), _record("002", 2, 1.0),  # 1.0: a pass
        _record("003", 1, None, exception_type="AgentTimeoutError", stage="harness"),  # no reward: 0
    ]  # fmt: skip
    tasks = task_outcomes(records).tasks
    assert (tasks["001"].mean_reward, tasks["001"].passed, tasks["001"].n_counted) == (0.5, False, 2)
    assert (tasks["002"].mean_reward, tasks["002"].passed) == (1.0, True)
    assert (tasks["003"].mean_reward, tasks["003"].passed) == (0.0, False)


def test_trials_that_are_not_the_models_are_left_out_and_counted() -> None:
    records = [
        _record("001", 1, 1.0),
        _record("001", 2, None, provider_status="429"),
        _record("002", 1, None, not_started="budget"),
        _record("003", 1, None, exception_type="PullError", stage="pull"),
        _record("003", 2, None, exception_type="Cancelled", stage="slot"),
        _record("004", 1, None, exception_type="PolicyViolation", stage="policy"),  # the task's: counted
        _record("004", 2, None, exception_type="CancelledError", stage="harness"),  # Pier's, on a cancel
    ]
    outcomes = task_outcomes(records)
    assert sorted(outcomes.tasks) == ["001", "004"]
    assert outcomes.tasks["001"].mean_reward == 1.0 and outcomes.tasks["001"].n_counted == 1
    assert outcomes.tasks["004"].n_counted == 1
    assert outcomes.excluded == {INFRASTRUCTURE: 3, NOT_STARTED: 1, PROVIDER: 1}
