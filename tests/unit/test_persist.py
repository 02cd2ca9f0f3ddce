"""Recording a submit is all or nothing: a failure leaves the selection and jobs dir as they were."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path

import pytest

from sciencebench.core.envfile import EnvFile
from sciencebench.core.errors import InputError
from sciencebench.core.paths import JobPaths
from sciencebench.login.options import SubmitOptions
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import Prepared, persist, persisted
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit

CANARY = "sk-canary-persist-7c1"


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def _prepared(tmp_path: Path, jobs: str = "jobs") -> tuple[Prepared, dict[str, object]]:
    selection = tmp_path / "sel"
    if not selection.exists():
        make_selection(selection, ["001"])
    opts = SubmitOptions(path=selection, jobs_dir=tmp_path / jobs / "deep", job_name="j",
                         agent_env=[f"X_TOKEN={CANARY}"])  # type: ignore[arg-type]  # fmt: skip
    prepared = prepare(opts)
    return prepared, build_run_record(prepared.job, prepared.trials[0], "redis://x", prepared.secret_values)


def test_a_run_record_that_cannot_be_written_leaves_nothing(tmp_path: Path) -> None:
    prepared, record = _prepared(tmp_path)
    (tmp_path / "sel" / "batch-run.json").mkdir()  # the last step fails
    before = _tree(tmp_path)
    with pytest.raises(InputError, match=r"cannot write .*batch-run\.json") as caught:
        persist(prepared, record)
    assert CANARY not in str(caught.value)
    assert _tree(tmp_path) == before  # no job dir, no jobs dir, no secrets file or directory


def test_a_failure_after_recording_undoes_it_and_restores_the_run_record(tmp_path: Path) -> None:
    first, record = _prepared(tmp_path, "jobs1")
    persist(first, record)  # an earlier job's run record is in the selection
    before = _tree(tmp_path)
    second, record = _prepared(tmp_path, "jobs2")
    with pytest.raises(RuntimeError, match="broker gone"), persisted(second, record) as done:
        assert done.job.agent_env_file is not None and done.job.agent_env_file.path.is_file()
        raise RuntimeError("broker gone")  # e.g. sending the trials failed
    assert _tree(tmp_path) == before


def test_the_agent_env_file_is_the_jobs_own(tmp_path: Path) -> None:
    first, record = _prepared(tmp_path, "jobs1")
    second, _ = _prepared(tmp_path, "jobs2")  # the same job name in another jobs dir
    a, b = persist(first, record).job, persist(second, record).job
    assert a.agent_env_file is not None and b.agent_env_file is not None
    assert a.agent_env_file.path.name == f"{a.job_id}.agent-env.json"
    assert a.agent_env_file.path != b.agent_env_file.path
    assert a.agent_env_file.path.stat().st_mode & 0o777 == 0o600
    assert CANARY in a.agent_env_file.path.read_text()


def test_job_files_that_name_secret_hashes_are_not_world_readable(tmp_path: Path) -> None:
    # job.json names the env file's and the --agent-env file's SHA-256: a path and hash another
    # user could replay in a job of their own. Whatever the umask, others cannot read it.
    env_file = tmp_path / "p.env"
    env_file.write_text(f"OPENAI_API_KEY={CANARY}-env\n")
    prepared, record = _prepared(tmp_path)
    prepared = replace(prepared, job=prepared.job.model_copy(
        update={"env_file": EnvFile(path=env_file, sha256=hashlib.sha256(env_file.read_bytes()).hexdigest())}
    ))  # fmt: skip
    old = os.umask(0)
    try:
        job = persist(prepared, record).job
    finally:
        os.umask(old)
    spec = JobPaths(job.jobs_dir, job.job_name).job_spec
    assert job.env_file is not None and job.env_file.sha256 in spec.read_text()
    assert spec.stat().st_mode & 0o777 == 0o640
    assert job.agent_env_file is not None and job.agent_env_file.path.stat().st_mode & 0o777 == 0o600
    for path in (p for p in job.job_dir.rglob("*") if p.is_file() and p.stat().st_mode & 0o004):
        text = path.read_text()
        assert job.env_file.sha256 not in text and job.agent_env_file.sha256 not in text, path
