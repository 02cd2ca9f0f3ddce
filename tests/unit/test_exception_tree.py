"""Every exception of the package is in the one tree, and its class decides whether a failure is tried again.

Pier records a failure by its class name (`result.json`'s `exception_info`); a
deterministic one of ours (raised inside Pier by the network policy) must not
be tried again under --max-retries, and must be recorded in its own stage.
"""

from __future__ import annotations

import ast
import builtins
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest

import sciencebench
from sciencebench.core.errors import PolicyError, SciencebenchError, Stage
from sciencebench.core.failures import recorded_failure
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


def _package_classes() -> dict[str, list[str]]:
    """Every class the package defines (its source read, nothing imported): name -> its bases' names."""
    classes: dict[str, list[str]] = {}
    for path in Path(sciencebench.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base).rpartition(".")[2] for base in node.bases]
                classes[f"{path.stem}.{node.name}"] = bases
                classes.setdefault(node.name, bases)
    return classes


def test_every_exception_of_the_package_is_in_the_tree_with_its_stage_and_determinism() -> None:
    classes = _package_classes()
    builtin = {name for name, value in vars(builtins).items() if isinstance(value, type)
               and issubclass(value, BaseException)}  # fmt: skip

    def reaches(name: str, goal: set[str], seen: frozenset[str] = frozenset()) -> bool:
        if name.rpartition(".")[2] in goal:
            return True
        bases = classes.get(name, [])
        return any(base not in seen and reaches(base, goal, seen | {name}) for base in bases)

    exceptions = [name for name in classes if "." in name and reaches(name, builtin)]
    assert len(exceptions) > 20
    assert sorted(name for name in exceptions if not reaches(name, {"SciencebenchError"})) == []
    tree: list[type[SciencebenchError]] = [SciencebenchError, *_subclasses(SciencebenchError)]
    for cls in tree:
        assert isinstance(cls.deterministic, bool), cls
        assert isinstance(cls.stage, Stage), cls


def _subclasses(cls: type[SciencebenchError]) -> list[type[SciencebenchError]]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]


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

    excluded = RetryConfig().exclude_exceptions
    assert excluded
    for name in (*excluded, "CancelledError"):
        assert recorded_failure(name) == ("harness", True), name
