"""Flaky tasks: a task whose reward differs across the attempts of one agent and model.

Pure: the inputs are trial records, so `summarize` (summary.json's
`flaky_tasks`) and `report` name the same tasks. Only counted attempts take
part, as in `core.paired`: a trial a model provider or the cluster failed, or
one never started, says nothing about the task (`paired.excluded_class`); a
counted trial without rewards counts 0, as Pier's mean does. A job runs one
agent, so within a job the attempts of one agent and model are those of one
`--model`.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from sciencebench.core.models import TrialRecord
from sciencebench.core.paired import excluded_class


class FlakyTask(BaseModel):
    """A task whose counted attempts of one model got different rewards, in attempt order."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    model: str | None
    attempts: list[int]
    rewards: list[float]

    @property
    def label(self) -> str:
        """`task_002 (gpt-x): 1, 0, 1` (the model only where the job named one)."""
        model = f" ({self.model})" if self.model else ""
        return f"task_{self.task_id}{model}: " + ", ".join(f"{reward:g}" for reward in self.rewards)


def flaky_tasks(records: Iterable[TrialRecord]) -> list[FlakyTask]:
    """The flaky tasks among `records`, by task then model: two or more counted attempts, not all equal."""
    attempts: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for record in records:
        if excluded_class(record) is None:
            group = (record.task_id, record.model or "")
            attempts.setdefault(group, []).append((record.attempt, record.reward or 0.0))
    flaky = []
    for (task_id, model), pairs in sorted(attempts.items()):
        pairs.sort()
        if len({reward for _, reward in pairs}) > 1:
            flaky.append(
                FlakyTask(
                    task_id=task_id,
                    model=model or None,
                    attempts=[attempt for attempt, _ in pairs],
                    rewards=[reward for _, reward in pairs],
                )
            )
    return flaky


def flaky_lines(flaky: list[FlakyTask], shown: int = 20) -> list[str]:
    """What `summarize` prints first: how many tasks are flaky and which (the first `shown`); none: []."""
    if not flaky:
        return []
    lines = [f"flaky: {len(flaky)} task(s) whose reward differs across attempts (attempt order):"]
    lines += [f"  {task.label}" for task in flaky[:shown]]
    if len(flaky) > shown:
        lines.append(f"  and {len(flaky) - shown} more (summary.json: flaky_tasks)")
    return lines
