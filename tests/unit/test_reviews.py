"""The worker's review cache: once per task hash and listing, never skipped for a changed task."""

from __future__ import annotations

from pathlib import Path

import pytest

from sciencebench.core import taskreview
from sciencebench.worker import reviews

pytestmark = pytest.mark.unit


def _task(path: Path) -> Path:
    (path / "environment").mkdir(parents=True)
    (path / "task.toml").write_text('version = "1.0"\n')
    return path


def test_review_is_cached_by_hash_and_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def counting(task_dir: Path) -> taskreview.TaskReview:
        calls.append(task_dir)
        return taskreview.review_task_dir(task_dir)

    monkeypatch.setattr(reviews, "review_task_dir", counting)
    monkeypatch.setattr(reviews, "_reviews", type(reviews._reviews)())
    first, second = _task(tmp_path / "a" / "task_001"), _task(tmp_path / "b" / "task_001")
    assert reviews.reviewed(first, "h1").problems == ()
    assert reviews.reviewed(second, "h1").problems == ()  # another snapshot of the same task
    assert calls == [first]
    assert reviews.reviewed(first, "h2").problems == ()  # another task hash
    assert len(calls) == 2
    # Same hash, one entry more (a file the hash does not cover): reviewed again, and refused.
    (second / "environment" / ".env").write_text("X=1\n")
    problems = reviews.reviewed(second, "h1").problems
    assert len(calls) == 3
    assert problems and ".env" in problems[0]
