"""Recording a submit is all or nothing: a failure leaves the selection and jobs dir as they were."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sciencebench.core.errors import InputError
from sciencebench.login.options import SubmitOptions
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import Prepared, persist, persisted, prepare
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
