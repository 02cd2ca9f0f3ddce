"""The job directory is its submitter's: nothing they do there while a trial runs reaches the worker's files.

Review findings: a try's scratch (the task snapshot Pier runs on, Pier's --config, Pier's job and trial
directories) lived in `<job>/.sciencebench/scratch/`, which the job's owner may rename or swap at any time
(renaming an entry needs no permission on the entry itself); and the worker's writes into the job directory
(trial directories, superseded copies, records, the summary) followed whatever links the owner planted. Each
test does what the owner can do with their own directory and asserts what must hold.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sciencebench.core.errors import WorkspaceError
from sciencebench.core.models import TrialRecord
from sciencebench.core.paths import JobPaths, open_job_dir, write_in_job
from sciencebench.core.settings import Settings
from sciencebench.login.options import SubmitOptions
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import Prepared, persist
from sciencebench.worker import journal, publish, stages
from sciencebench.worker.pier.agentconfig import write_agent_config
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit


def _job(tmp_path: Path) -> tuple[Prepared, JobPaths, Settings]:
    selection = make_selection(tmp_path / "sel", ["002"])
    prepared = prepare(SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="swap"))
    done = persist(prepared, build_run_record(prepared.job, prepared.trials[0], "redis://x", []))
    settings = Settings.from_env({"SCIENCEBENCH_STATE_DIR": str(tmp_path / "state")})
    return done, JobPaths(done.job.jobs_dir, done.job.job_name), settings


def _owner_replaces_everything(paths: JobPaths) -> None:
    """What the job's owner can do to `.sciencebench/` at any moment: rename it away and plant a tree."""
    os.rename(paths.meta_dir, paths.job_dir / ".sciencebench.theirs")
    paths.meta_dir.mkdir()
    (paths.meta_dir / "scratch").symlink_to("/")


def test_the_scratch_is_host_local_and_private(tmp_path: Path) -> None:
    done, paths, settings = _job(tmp_path)
    root = journal.scratch_root(settings, done.trials[0], "host")
    assert not root.is_relative_to(paths.job_dir)
    assert root.is_relative_to(settings.scratch_root)
    journal.private_dir(root.parent)
    assert (settings.scratch_root.stat().st_mode & 0o777) == 0o700


def test_a_scratch_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    scratch = tmp_path / "shared"
    scratch.mkdir(mode=0o777)
    scratch.chmod(0o777)
    with pytest.raises(WorkspaceError, match="no one else may write"):
        journal.private_dir(scratch)
    (tmp_path / "link").symlink_to(tmp_path / "state")
    (tmp_path / "state").mkdir(mode=0o700)
    with pytest.raises(WorkspaceError, match="worker's own account"):
        journal.private_dir(tmp_path / "link")


def test_the_snapshot_and_pier_config_stay_when_the_job_owner_swaps_their_directory(tmp_path: Path) -> None:
    done, paths, settings = _job(tmp_path)
    spec = done.trials[0]
    scratch = journal.scratch_root(settings, spec, "host") / "try-1"
    journal.private_dir(scratch.parent.parent)
    scratch.mkdir(parents=True)
    snapshot = stages._take_snapshot(spec, scratch, os.getuid())
    stages._check_workspace(spec, snapshot)
    config = write_agent_config(spec, done.job, scratch, os.getuid())
    written = config.read_text()
    _owner_replaces_everything(paths)
    # What Pier reads from here on (`--path`, `--config`) is what the worker checked and wrote.
    assert not (snapshot.path / "environment").is_symlink()
    assert (snapshot.path / "task.toml").read_bytes() == (done.trials[0].task_dir / "task.toml").read_bytes()
    assert config.read_text() == written


def test_publishing_follows_no_link_the_job_owner_planted(tmp_path: Path) -> None:
    done, paths, _ = _job(tmp_path)
    spec = done.trials[0]
    elsewhere = tmp_path / "someone-elses-dir"
    elsewhere.mkdir()
    # The owner links superseded/ and trials/ out of the job directory and names a "previous" run outside it.
    (paths.meta_dir / "superseded").symlink_to(elsewhere)
    paths.trials_dir.mkdir(exist_ok=True)
    record = TrialRecord(job_id=spec.job_id, job_name=spec.job_name, task_id=spec.task_id, attempt=1,
                         trial_dir="../../someone-elses-dir")  # fmt: skip
    paths.trial_record(spec.task_id, 1).write_text(record.model_dump_json())
    scratch = tmp_path / "scratch"
    trial = scratch / "task_002__abcdefg"
    (trial / "agent").mkdir(parents=True)
    (trial / "result.json").write_text("{}")
    earlier = scratch / "task_002__earlier"
    earlier.mkdir()
    tries = [stages.Try(record=record, pier_dir=earlier, retryable=False),
             stages.Try(record=record, pier_dir=trial, retryable=False)]  # fmt: skip
    with pytest.raises(OSError):  # superseded/ is a link: refused, nothing written through it
        publish.publish_dirs(paths, spec, tries)
    assert list(elsewhere.iterdir()) == []
    (paths.meta_dir / "superseded").unlink()
    publish.publish_dirs(paths, spec, tries)
    assert (paths.job_dir / "task_002__abcdefg" / "result.json").read_text() == "{}"
    assert (paths.meta_dir / "superseded" / "task_002__earlier").is_dir()
    assert list(elsewhere.iterdir()) == []


def test_records_and_the_summary_are_written_inside_the_job_directory_only(tmp_path: Path) -> None:
    _, paths, _ = _job(tmp_path)
    elsewhere = tmp_path / "another-job"
    elsewhere.mkdir()
    paths.trials_dir.rmdir() if paths.trials_dir.is_dir() else None
    paths.trials_dir.symlink_to(elsewhere)
    with pytest.raises(OSError):
        write_in_job(paths, Path(".sciencebench/trials/002-1.json"), json.dumps({}))
    assert list(elsewhere.iterdir()) == []
    # A link in place of the job directory itself is refused too.
    os.rename(paths.job_dir, tmp_path / "jobs" / "moved")
    paths.job_dir.symlink_to(elsewhere)
    with pytest.raises(OSError):
        os.close(open_job_dir(paths))
