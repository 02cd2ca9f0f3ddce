"""A job budget's pure parts: what a record spent, and the lines `status` and the summary print."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from sciencebench.coordination.budget import BUDGET, Budget, Spend, budget_lines, spend_of, status_line
from sciencebench.core.models import TrialRecord

pytestmark = pytest.mark.unit

JOB = uuid.UUID("00000000-0000-4000-8000-000000000002")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _record(task: str, minute: int = 0, **fields: object) -> TrialRecord:
    return TrialRecord.model_validate(
        {"job_id": JOB, "job_name": "j", "task_id": task, "attempt": 1,
         "finished_at": T0 + timedelta(minutes=minute), **fields}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "spend"),
    [
        ({"n_input_tokens": 100, "n_output_tokens": 7, "cost_usd": 0.25}, Spend(tokens=107, cost_usd=0.25)),
        ({"n_input_tokens": 9, "n_output_tokens": None, "cost_usd": None}, Spend(tokens=9)),
        ({}, Spend()),
    ],
)
def test_a_record_s_spend_is_its_tokens_in_and_out_and_its_cost(
    fields: dict[str, object], spend: Spend
) -> None:
    assert spend_of(_record("001", **fields).model_dump_json()) == spend
    assert spend_of("not json") == Spend() and spend_of("[1]") == Spend()
    assert spend_of('{"n_input_tokens": -5, "n_output_tokens": "7", "cost_usd": true}') == Spend()


def test_the_summary_says_when_the_budget_stopped_the_job() -> None:
    records = [
        _record("001", 1, n_input_tokens=900, n_output_tokens=100, cost_usd=1.0),
        _record("002", 2, n_input_tokens=900, n_output_tokens=100, cost_usd=1.5, exception_type="X"),
        _record("003", 3, not_started=BUDGET),
        _record("004", 3, not_started=BUDGET),
    ]
    lines, skipped = budget_lines(records, capped_cost=True)
    assert lines == ["budget reached after 2 trials, 2 not started (spent 2000 tokens, $2.50)"]
    assert skipped == 2
    assert budget_lines(records[:2], capped_cost=True) == ([], 0)  # nothing left unstarted: no line


def test_only_tokens_can_be_capped_when_pier_could_not_price_the_first_trial() -> None:
    unpriced = [
        _record("002", 5, n_input_tokens=10, n_output_tokens=1, cost_usd=0.5),
        _record("001", 1, n_input_tokens=10, n_output_tokens=1),  # finished first, no price
        _record("003", 0),  # no tokens at all: not the first trial with tokens
    ]
    lines, _ = budget_lines(unpriced, capped_cost=True)
    assert lines == [
        "--max-cost: only tokens can be capped: Pier could not price task_001 #1, the first trial with "
        "tokens (a model Pier has no price for)"
    ]
    assert budget_lines(unpriced, capped_cost=False) == ([], 0)  # without --max-cost it does not matter


def test_status_shows_the_spend_against_each_limit() -> None:
    assert status_line(Budget(tokens=5, cost_usd=1.0)) is None  # no budget
    running = Budget(max_cost_usd=3.0, max_tokens=5000, cost_usd=0.0125, tokens=1200)
    assert status_line(running) == "budget: $0.0125 of --max-cost $3.00, 1200 of --max-tokens 5000 tokens"
    reached = Budget(max_tokens=1000, tokens=1200, first_priced=False, started_when_reached=2)
    assert status_line(reached) == (
        "budget: 1200 of --max-tokens 1000 tokens; reached after 2 started trial(s): no further trial starts"
    )
    unpriced = Budget(max_cost_usd=3.0, tokens=10, first_priced=False)
    assert status_line(unpriced) == (
        "budget: $0.00 of --max-cost $3.00; only tokens can be capped (Pier could not price the first "
        "trial with tokens)"
    )
