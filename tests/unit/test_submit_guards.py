"""Submit refuses what would break a job later: reused names, too-long trials."""

from __future__ import annotations

from pathlib import Path

import pytest

from sciencebench.core.errors import InputError, JobConflictError
from sciencebench.core.settings import VISIBILITY_TIMEOUT_FLOOR_SEC
from sciencebench.login.options import SubmitOptions
from sciencebench.login.submit import write_job_spec
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit


def _opts(tmp_path: Path, **kw: object) -> SubmitOptions:
    selection = tmp_path / "sel"
    if not selection.exists():
        make_selection(selection, ["002", "005"])
    return SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="j", **kw)  # type: ignore[arg-type]


def test_the_same_submit_again_continues_the_job(tmp_path: Path) -> None:
    first = prepare(_opts(tmp_path))
    write_job_spec(first.job)
    again = prepare(_opts(tmp_path, n_concurrent=3))  # how it runs may change
    assert again.resumed and again.job.job_id == first.job.job_id and again.job.n_concurrent == 3
    assert [t.key for t in again.trials] == [t.key for t in first.trials]  # no record yet: all run
    with pytest.raises(JobConflictError, match=r"with --n-attempts 1 in the job, 2 here; the same command"):
        prepare(_opts(tmp_path, n_attempts=2))


def test_a_dry_run_leaves_the_name_free(tmp_path: Path) -> None:
    prepare(_opts(tmp_path, dry_run=True))
    assert prepare(_opts(tmp_path)).job.job_name == "j"


def test_job_spec_keeps_each_task_definition_hash(tmp_path: Path) -> None:
    job = prepare(_opts(tmp_path)).job
    assert sorted(job.task_hashes) == ["002", "005"]
    assert all(len(h) == 64 for h in job.task_hashes.values())


def test_trials_longer_than_the_visibility_timeout_are_refused(tmp_path: Path) -> None:
    # 600 s agent timeout x 100 -> 60,000 s agent stage: 1.5x that exceeds the 6 h floor.
    with pytest.raises(InputError, match="SCIENCEBENCH_VISIBILITY_TIMEOUT="):
        prepare(_opts(tmp_path, agent_timeout_multiplier=100.0), VISIBILITY_TIMEOUT_FLOOR_SEC)
    prepared = prepare(_opts(tmp_path, agent_timeout_multiplier=100.0), 10**6)
    assert prepared.trials
