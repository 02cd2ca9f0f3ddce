"""Pier's memory bound on the worker: the setting and option, what a try hands Pier, and how its end is told.

The setting (`SCIENCEBENCH_PIER_MEMORY`) and `worker --pier-memory` take a
size as the other limits do, 0 for unbounded, nothing below the floor; the
worker reports the bound with its kit. A try hands it to Pier; a Pier that
ended at it (`bounded.OUT_OF_MEMORY`) after it had started the trial makes
the trial's record an OutputLimitError, not tried again, its containers
removed; before, a HarnessError saying the bound is too small. Real
processes: tests/integration/test_pier_memory_bound.py; real Pier on the real
Engine: tests/docker/test_pier_memory.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.errors import SettingsError
from sciencebench.core.settings import DEFAULT_PIER_MEMORY, MIN_PIER_MEMORY, Settings
from sciencebench.worker.dispatch import Answer, counted
from sciencebench.worker.main import host_kit, pier_memory_line
from sciencebench.worker.pier import bounded
from sciencebench.worker.pier.process import PierRun
from tests.fixtures.hosts import PROXY_IMAGE
from tests.unit.test_trial_states import TASK_ID, _world

pytestmark = pytest.mark.unit


def test_the_bound_defaults_to_4g_and_reads_its_variable() -> None:
    assert Settings.from_env({}).pier_memory == DEFAULT_PIER_MEMORY == 4 << 30
    assert Settings.from_env({"SCIENCEBENCH_PIER_MEMORY": "1.5G"}).pier_memory == 3 << 29
    assert Settings.from_env({"SCIENCEBENCH_PIER_MEMORY": "0"}).pier_memory == 0  # unbounded
    assert MIN_PIER_MEMORY == 1 << 30


@pytest.mark.parametrize(("value", "says"), [("512M", "512.0 MiB is below 1.0 GiB"), ("lots", "not a size")])
def test_a_bad_bound_variable_is_a_settings_error_naming_it(value: str, says: str) -> None:
    with pytest.raises(SettingsError, match=f"SCIENCEBENCH_PIER_MEMORY: .*{says}"):
        Settings.from_env({"SCIENCEBENCH_PIER_MEMORY": value})


def _worker(monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[Any, list[Settings]]:
    from sciencebench.worker import main as worker_main

    seen: list[Settings] = []
    monkeypatch.setattr(worker_main, "run_worker", lambda **kw: seen.append(kw["settings"]))
    monkeypatch.setenv("SCIENCEBENCH_PROXY_IMAGE", PROXY_IMAGE)
    monkeypatch.setenv("SCIENCEBENCH_PIER_MEMORY", "2G")
    args = ["worker", "--jobs-root", "/srv/jobs", "--selection-root", "/srv/sel", *extra]
    return CliRunner().invoke(cli.main, args), seen


def test_the_worker_option_wins_over_the_variable_and_reaches_the_kit_and_the_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, seen = _worker(monkeypatch)
    assert result.exit_code == 0, result.output
    assert seen[0].pier_memory == 2 << 30  # the environment's
    assert pier_memory_line(seen[0]).endswith("(and each docker CLI it runs): data at most 2.0 GiB")
    result, seen = _worker(monkeypatch, "--pier-memory", "6G")
    assert result.exit_code == 0, result.output
    assert host_kit(seen[0]).pier_memory == 6 << 30
    result, seen = _worker(monkeypatch, "--pier-memory", "0")
    assert result.exit_code == 0, result.output
    assert host_kit(seen[0]).pier_memory == 0  # a 0 given counts: unbounded
    assert pier_memory_line(seen[0]).endswith("data unbounded")


@pytest.mark.parametrize(
    ("value", "says"),
    [("100M", "--pier-memory: 100.0 MiB is below 1.0 GiB"), ("lots", "--pier-memory: 'lots' is not a size")],
)
def test_a_bad_bound_option_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    result, seen = _worker(monkeypatch, "--pier-memory", value)
    assert result.exit_code == 2 and says in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output and seen == []


def test_worker_help_names_the_bound() -> None:
    said = CliRunner().invoke(cli.main, ["worker", "--help"]).output
    assert "--pier-memory SIZE" in said and "SCIENCEBENCH_PIER_MEMORY" in said


@dataclass
class BoundedPier:
    """Pier that ended at its memory bound: after making its trial directory (`started`), or before."""

    started: bool
    limits: list[int] = field(default_factory=list)

    def __call__(self, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path, timeout_sec: float,
                 should_stop: Callable[[], bool] = lambda: False, poll_sec: float = 0.5,
                 zygote_env: dict[str, str] | None = None, memory_limit: int = 0) -> PierRun:  # fmt: skip
        self.limits.append(memory_limit)
        if self.started:  # Pier had made the trial's directory and was reading what the agent left
            (cwd / "job" / "task_001__flooded" / "agent").mkdir(parents=True)
        said = "sciencebench: Pier went past its memory bound (4294967296 bytes of data); stopped"
        return PierRun(bounded.OUT_OF_MEMORY, duration_sec=1.0, timed_out=False, cancelled=False,
                       log_tail=said)  # fmt: skip


def test_pier_past_its_bound_makes_the_trial_an_output_limit_error_not_tried_again(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    world = _world(store, tmp_path, [None], max_retries=2)
    world.ctx.pier = pier = BoundedPier(started=True)
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    record = outcome.record
    assert record.exception_type == "OutputLimitError" and record.stage == "collect"
    assert record.exception_message == (
        "Pier went past its memory bound of 4.0 GiB (worker --pier-memory) on what the trial left, "
        "and was stopped"
    )
    assert record.tries == 1 and pier.limits == [DEFAULT_PIER_MEMORY]  # deterministic: not tried again
    assert world.stored() == record == world.record_file()
    assert world.runtime.cleaned == ["task_001__flooded"]  # its containers went
    counted(TASK_ID)
    assert not world.coord.is_leased(world.job, world.spec.key)


def test_pier_past_its_bound_before_the_trial_started_says_the_bound_is_too_small(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    world = _world(store, tmp_path, [None])
    world.ctx.pier = BoundedPier(started=False)
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    assert outcome.record.exception_type == "HarnessError" and outcome.record.stage == "harness"
    assert outcome.record.exception_message == (
        "Pier went past its memory bound of 4.0 GiB (worker --pier-memory) before it started the trial: "
        "the bound is too small"
    )
    counted(TASK_ID)
