"""A trial's outcome as read from Pier's `result.json`: what it spent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sciencebench.worker.pier.layout import read_trial_outcome

pytestmark = pytest.mark.unit


def _result(**fields: object) -> dict[str, object]:
    return {
        "trial_name": "task_001__abc",
        "task_name": "task_001",
        "agent_info": {"name": "codex", "model_info": {"name": "gpt-5"}},
        "verifier_result": {"rewards": {"reward": 1.0}},
        **fields,
    }


def test_the_outcome_carries_pier_s_token_and_cost_totals(tmp_path: Path) -> None:
    contexts = [{"n_input_tokens": 100, "n_output_tokens": 7, "cost_usd": 0.25},
                {"n_input_tokens": 50, "n_output_tokens": 3, "cost_usd": 0.5}]  # fmt: skip
    steps = [{"agent_result": context} for context in contexts]
    (tmp_path / "result.json").write_text(json.dumps(_result(step_results=steps)))
    outcome = read_trial_outcome(tmp_path)
    assert outcome.tokens == (150, None, 10, 0.75)
    assert outcome.rewards == {"reward": 1.0}


def test_a_trial_pier_could_not_price_still_counts_its_tokens(tmp_path: Path) -> None:
    agent = {"n_input_tokens": 9, "n_output_tokens": 4, "cost_usd": None}
    (tmp_path / "result.json").write_text(json.dumps(_result(agent_result=agent)))
    assert read_trial_outcome(tmp_path).tokens == (9, None, 4, None)


def test_a_result_pier_s_statistics_cannot_read_has_no_totals(tmp_path: Path) -> None:
    (tmp_path / "result.json").write_text('{"verifier_result": {"rewards": {"reward": 0.0}}}')
    outcome = read_trial_outcome(tmp_path)
    assert outcome.tokens == (None, None, None, None) and outcome.rewards == {"reward": 0.0}
