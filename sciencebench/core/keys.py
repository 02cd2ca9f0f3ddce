"""A trial's key within its job: `<task id>#<attempt>` (`002#1`), the one parser and formatter.

The coordination store, the chord's answers and `status` name trials by
this string; people see `TrialKey.label` (`task_002 #1`).
"""

from __future__ import annotations

from typing import NamedTuple

SEPARATOR = "#"


class TrialKey(NamedTuple):
    """A task id and an attempt (from 1); `str()` is the key, `TrialKey.parse` reads one back."""

    task_id: str
    attempt: int

    @classmethod
    def parse(cls, key: str) -> TrialKey:
        """The task id and attempt of `002#1`. Raises ValueError for a string that is not a trial key."""
        task_id, separator, attempt = key.partition(SEPARATOR)
        if not separator or not task_id or not attempt.isdigit():
            raise ValueError(f"not a trial key: {key!r}")
        return cls(task_id, int(attempt))

    def __str__(self) -> str:
        """The key: `002#1`."""
        return f"{self.task_id}{SEPARATOR}{self.attempt}"

    @property
    def label(self) -> str:
        """What people see (Flower, status, `missing:`): `task_002 #1`."""
        return f"task_{self.task_id} {SEPARATOR}{self.attempt}"

    @property
    def task_name(self) -> str:
        """The key under the task directory's name: `task_002#1` (a trial without a directory, a message)."""
        return f"task_{self}"
