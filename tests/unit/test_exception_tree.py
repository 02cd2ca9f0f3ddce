"""Every exception of the package is in the one tree, and its class decides whether a failure is tried again.

Pier records a failure by its class name (`result.json`'s `exception_info`); a
deterministic one of ours (raised inside Pier by the network policy) must not
be tried again under --max-retries, and must be recorded in its own stage.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest

import sciencebench
from sciencebench.core.errors import PolicyError, SciencebenchError, Stage
from sciencebench.core.failures import PIER_NOT_RETRIED
from sciencebench.core.settings import Settings
from sciencebench.login.options import SubmitOptions
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import persist
from sciencebench.worker import stages
from sciencebench.worker.context import WorkerContext
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit


class LateRefusal(PolicyError):
    """A deterministic refusal the policy may add one day: no list is edited for it."""


class FlakyLookup(PolicyError):
    """A policy failure another try may mend."""

    deterministic: ClassVar[bool] = False


def _package_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(sciencebench.__path__, "sciencebench."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        found += [
            value
            for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == info.name
        ]
    return found


def test_every_exception_of_the_package_is_in_the_tree_with_its_stage_and_determinism() -> None:
    classes = _package_exceptions()
    assert len(classes) > 20
    outside = sorted(cls.__qualname__ for cls in classes if not issubclass(cls, SciencebenchError))
    assert outside == []
    for cls in classes:
        assert isinstance(cls.deterministic, bool), cls  # type: ignore[attr-defined]
        assert isinstance(cls.stage, Stage), cls  # type: ignore[attr-defined]


def _trial_dir(tmp_path: Path, exception_type: str) -> Path:
    trial = tmp_path / "task_001__abc"
    trial.mkdir()
    result = {
        "task_name": "task_001",
        "trial_name": trial.name,
        "verifier_result": None,
        "exception_info": {"exception_type": exception_type, "exception_message": "no"},
    }
    (trial / "result.json").write_text(json.dumps(result))
    return trial


@pytest.mark.parametrize(
    ("exception_type", "stage", "retried"),
    [
        ("AgentImageMismatch", "policy", False),  # the bug: tried again under --max-retries
        ("PolicyViolation", "policy", False),
        ("LateRefusal", "policy", False),
        ("FlakyLookup", "policy", True),
        ("AgentTimeoutError", "harness", False),  # Pier's own: its RetryConfig does not retry it
        ("NonZeroAgentExitCodeError", "harness", True),
    ],
)
def test_a_failure_pier_recorded_is_retried_as_its_class_says(
    tmp_path: Path, exception_type: str, stage: str, retried: bool
) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    prepared = prepare(SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="j"))
    done = persist(prepared, build_run_record(prepared.job, prepared.trials[0], "redis://x", []))
    ctx = WorkerContext(coord=None, runtime=None, settings=Settings.from_env({}))  # type: ignore[arg-type]
    attempt = stages._collect(
        done.trials[0], ctx, _trial_dir(tmp_path, exception_type), datetime.now(UTC), {}
    )
    assert attempt.record.exception_type == exception_type
    assert attempt.record.stage == stage
    assert attempt.retryable is retried


def test_pier_s_own_deterministic_failures_are_the_ones_its_retry_config_excludes() -> None:
    from pier.models.job.config import RetryConfig

    assert RetryConfig().exclude_exceptions is not None
    assert RetryConfig().exclude_exceptions <= PIER_NOT_RETRIED
