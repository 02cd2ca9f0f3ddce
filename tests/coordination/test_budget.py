"""The job budget's part of the coordination contract (`coordination.budget`).

Runs against `RedisCoordinator` on the session's embedded store (the `coord`
fixture of the conformance suite).
"""

from __future__ import annotations

import threading

import pytest

from sciencebench.coordination.budget import Spend
from sciencebench.coordination.protocol import Claim, Coordinator
from sciencebench.core.models import TrialRecord
from tests.coordination import test_conformance
from tests.fixtures.leases import claim as _claim

JOB_ID = test_conformance.JOB_ID
coord = test_conformance.coord  # the conformance suite's fixture
pytestmark = pytest.mark.unit


def _record(key: str, tokens: tuple[int | None, int | None] = (None, None), cost: float | None = None) -> str:
    task_id, _, attempt = key.partition("#")
    return TrialRecord(
        job_id=JOB_ID, job_name="j", task_id=task_id, attempt=int(attempt),
        n_input_tokens=tokens[0], n_output_tokens=tokens[1], cost_usd=cost,
    ).model_dump_json()  # fmt: skip


def _run(coord: Coordinator, key: str, tokens: tuple[int | None, int | None], cost: float | None) -> bool:
    """Start a trial (cap 8) and commit its record; whether it was let start."""
    start = coord.start("j", key, f"owner-{key}", 30, 8)
    assert start.claim is Claim.CLAIMED
    if start.over_budget:
        assert not start.slot
        return False
    assert start.slot
    assert coord.commit_result("j", key, f"owner-{key}", _record(key, tokens, cost))
    coord.finish("j", key, f"owner-{key}")
    return True


def test_a_commit_adds_its_record_s_spend_in_the_same_step(coord: Coordinator) -> None:
    assert coord.budget("j").tokens == 0 and coord.budget("j").trials == 0
    assert _claim(coord, "j", "001#1", "a", 30) is Claim.CLAIMED
    assert not coord.commit_result("j", "001#1", "b", _record("001#1", (100, 7), 0.25))  # not b's trial
    assert coord.budget("j").trials == 0
    assert coord.commit_result("j", "001#1", "a", _record("001#1", (100, 7), 0.25))
    assert not coord.commit_result("j", "001#1", "a", _record("001#1", (100, 7), 0.25))  # one record
    ledger = coord.budget("j")
    assert (ledger.tokens, ledger.cost_usd, ledger.trials, ledger.first_priced) == (107, 0.25, 1, True)
    assert coord.budget("other").trials == 0
    # A record without totals (a trial that never reached Pier) spends nothing.
    assert _run(coord, "002#1", (None, None), None)
    assert coord.budget("j").trials == 1
    # No limits: a job is never refused, and its starts are not noted.
    assert not coord.budget("j").limited and coord.budget("j").started == {}


def test_commits_from_many_hosts_at_once_lose_no_spend(coord: Coordinator) -> None:
    def commit_many(worker: int) -> None:
        for i in range(25):
            key = f"{worker:03d}#{i + 1}"
            assert _claim(coord, "j", key, "o", 30) is Claim.CLAIMED
            assert coord.commit_result("j", key, "o", _record(key, (2, 1), 0.01))

    threads = [threading.Thread(target=commit_many, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ledger = coord.budget("j")
    assert (ledger.tokens, ledger.trials) == (600, 200)
    assert ledger.cost_usd == pytest.approx(2.0, abs=1e-9)


def test_no_trial_starts_once_the_cost_is_reached_and_a_new_budget_continues(coord: Coordinator) -> None:
    ledger = coord.set_budget("j", 1.0, None)
    assert ledger.limited and not ledger.reached and ledger.reached_at is None
    assert _run(coord, "001#1", (10, 1), 0.5)
    assert _run(coord, "002#1", (10, 1), 0.5)  # reaches $1.00 exactly: a budget reached
    reached = coord.budget("j")
    assert reached.reached and reached.reached_at is not None and reached.started_when_reached == 2
    assert set(reached.started) == {"001#1", "002#1"}
    assert reached.started["001#1"] <= reached.started["002#1"] <= reached.reached_at
    # The next trial is claimed (so it can be answered) but takes no slot and is not started.
    start = coord.start("j", "003#1", "c", 30, 1)
    assert start.claim is Claim.CLAIMED and start.over_budget and not start.slot
    assert coord.acquire_slot("j", "999#1", 1, 30)  # the refused trial holds no slot
    assert not coord.start_within_budget("j", "003#1")
    assert "003#1" not in coord.budget("j").started
    # A higher budget lets trials start again; the spend so far still counts.
    ledger = coord.set_budget("j", 1.5, None)
    assert not ledger.reached and ledger.reached_at is None and ledger.cost_usd == pytest.approx(1.0)
    assert coord.start_within_budget("j", "003#1")
    assert "003#1" in coord.budget("j").started
    # A budget the spend has reached already is reached at once.
    assert coord.set_budget("j", 0.75, None).reached_at is not None


def test_tokens_are_capped_and_a_trial_pier_could_not_price_counts_them(coord: Coordinator) -> None:
    coord.set_budget("j", 5.0, 100)
    assert _run(coord, "001#1", (50, 10), None)  # no price: tokens only
    ledger = coord.budget("j")
    assert (ledger.tokens, ledger.cost_usd, ledger.unpriced, ledger.first_priced) == (60, 0.0, 1, False)
    assert ledger.only_tokens and not ledger.reached
    assert _run(coord, "002#1", (30, 10), 0.1)  # 100 tokens: reached on tokens, not on cost
    ledger = coord.budget("j")
    assert ledger.reached and ledger.first_priced is False and ledger.unpriced == 1
    assert ledger.cost_usd == pytest.approx(0.1)
    assert not _run(coord, "003#1", (1, 1), 0.0)


def test_a_budget_set_again_seeds_only_a_ledger_the_store_lost(coord: Coordinator) -> None:
    seeded = coord.set_budget("j", 10.0, None, Spend(tokens=50, cost_usd=2.0))
    assert (seeded.tokens, seeded.cost_usd, seeded.max_cost_usd) == (50, 2.0, 10.0)
    kept = coord.set_budget("j", None, 70, Spend(tokens=999, cost_usd=99.0))
    assert (kept.tokens, kept.cost_usd, kept.max_cost_usd, kept.max_tokens) == (50, 2.0, None, 70)
    assert _run(coord, "001#1", (20, 0), None)
    assert coord.budget("j").reached
