"""worker.pier.agentconfig: agent keywords reach Pier in a private file, off command lines and records."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from sciencebench.coordination.records import forget_agent_env
from sciencebench.core.agent_kwargs import REDACTED
from sciencebench.core.errors import JobConflictError, RefusedError, SecretsMismatchError
from sciencebench.core.models import EnvFile
from sciencebench.core.pier_argv import render_argv
from sciencebench.login.options import SubmitOptions
from sciencebench.login.retry import failed_trials
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import Prepared, persist
from sciencebench.worker.pier.agentconfig import (
    CONFIG_NAME,
    load_secret_kwargs,
    redact_pier_files,
    write_agent_config,
)
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit

CANARY = "sk-canary-KWARG-3e8b1d"


def _persisted(tmp_path: Path, **kw: Any) -> Prepared:
    selection = make_selection(tmp_path / "sel", ["002"])
    prepared = prepare(SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="ak", **kw))
    return persist(prepared, build_run_record(prepared.job, prepared.trials[0], "redis://x", []))


def test_secret_keywords_travel_in_a_private_file_not_in_job_json(tmp_path: Path) -> None:
    done = _persisted(tmp_path, agent="claude-code", agent_kwargs=[f"api_key={CANARY}", "max_turns=5"])
    identity = done.job.agent_kwargs_file
    assert identity is not None
    assert stat.S_IMODE(identity.path.stat().st_mode) == 0o600
    assert json.loads(identity.path.read_text()) == {"api_key": CANARY}
    job_json = (tmp_path / "jobs" / "ak" / ".sciencebench" / "job.json").read_text()
    assert CANARY not in job_json
    assert done.job.agent.agent_kwargs == {"api_key": REDACTED, "max_turns": "5"}
    assert load_secret_kwargs(done.job, os.getuid()) == {"api_key": CANARY}


def test_the_config_file_is_private_and_holds_the_values_the_argv_does_not(tmp_path: Path) -> None:
    done = _persisted(tmp_path, agent="claude-code", agent_kwargs=[f"api_key={CANARY}", "max_turns=5"])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = write_agent_config(done.trials[0], done.job, scratch, os.getuid())
    assert path == scratch / CONFIG_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (agent,) = json.loads(path.read_text())["agents"]
    assert agent["kwargs"] == {"api_key": CANARY, "max_turns": 5}
    assert agent["name"] == "claude-code"
    argv = render_argv(done.job, done.trials[0], scratch, "job", agent_config=path)
    assert argv[-2:] == ["--config", str(path)]
    assert not any(CANARY in arg or "max_turns" in arg for arg in argv)
    with pytest.raises(FileExistsError):  # created exclusively: a planted file is never reused
        write_agent_config(done.trials[0], done.job, scratch, os.getuid())


def test_a_changed_or_misplaced_kwargs_file_is_refused(tmp_path: Path) -> None:
    done = _persisted(tmp_path, agent="claude-code", agent_kwargs=[f"api_key={CANARY}"])
    identity = done.job.agent_kwargs_file
    assert identity is not None
    identity.path.write_text(json.dumps({"api_key": "other"}))
    with pytest.raises(SecretsMismatchError, match="changed since submit"):
        load_secret_kwargs(done.job, os.getuid())
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    moved = done.job.model_copy(update={"agent_kwargs_file": EnvFile(path=elsewhere, sha256="0" * 64)})
    with pytest.raises(RefusedError, match="is not in"):
        load_secret_kwargs(moved, os.getuid())
    missing = done.job.model_copy(update={"agent_kwargs_file": None})
    with pytest.raises(SecretsMismatchError, match="no file with its value"):
        load_secret_kwargs(missing, os.getuid())


def test_another_accounts_kwargs_file_is_refused(tmp_path: Path) -> None:
    """A worker running as root reads the file only when the job directory's owner owns it."""
    if os.getuid() != 0:
        pytest.skip("giving a file to another account needs root")
    done = _persisted(tmp_path, agent="claude-code", agent_kwargs=[f"api_key={CANARY}"])
    identity = done.job.agent_kwargs_file
    assert identity is not None
    os.chown(identity.path, 12345, -1)
    with pytest.raises(RefusedError, match=r"belongs to another account \(uid 12345\)"):
        load_secret_kwargs(done.job, os.getuid())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(RefusedError, match="belongs to another account"):
        write_agent_config(done.trials[0], done.job, scratch, os.getuid())
    assert not (scratch / CONFIG_NAME).exists()


def test_a_kwargs_file_that_links_to_another_jobs_is_refused(tmp_path: Path) -> None:
    """A second account makes its own kwargs file a link to another's and copies that file's SHA-256."""
    victim = _persisted(tmp_path / "victim", agent="claude-code", agent_kwargs=[f"api_key={CANARY}"])
    thief = _persisted(tmp_path / "thief", agent="claude-code", agent_kwargs=["api_key=mine"])
    stolen, own = victim.job.agent_kwargs_file, thief.job.agent_kwargs_file
    assert stolen is not None and own is not None
    own.path.unlink()
    own.path.symlink_to(stolen.path)
    forged = thief.job.model_copy(update={"agent_kwargs_file": EnvFile(path=own.path, sha256=stolen.sha256)})
    with pytest.raises(RefusedError, match="is a symbolic link"):
        load_secret_kwargs(forged, os.getuid())


def test_pier_files_are_redacted_after_the_run(tmp_path: Path) -> None:
    agent = {
        "name": "claude-code",
        "kwargs": {"api_key": CANARY, "max_thinking_tokens": 16000, "max_turns": 5},
    }
    job_dir = tmp_path / "job"
    trial = job_dir / "task_002__abcdefg"
    trial.mkdir(parents=True)
    (job_dir / "config.json").write_text(json.dumps({"agents": [agent]}))
    (trial / "config.json").write_text(json.dumps({"agent": agent, "trial_name": "task_002__abcdefg"}))
    (trial / "result.json").write_text(json.dumps({"config": {"agent": agent}, "verifier_result": None}))
    redact_pier_files(job_dir, [trial])
    expected = {"api_key": REDACTED, "max_thinking_tokens": REDACTED, "max_turns": 5}
    assert json.loads((job_dir / "config.json").read_text())["agents"][0]["kwargs"] == expected
    assert json.loads((trial / "config.json").read_text())["agent"]["kwargs"] == expected
    result = json.loads((trial / "result.json").read_text())
    assert result["config"]["agent"]["kwargs"] == expected and result["verifier_result"] is None
    for path in (job_dir / "config.json", trial / "config.json", trial / "result.json"):
        assert CANARY not in path.read_text()


def test_the_kwargs_file_is_deleted_when_the_job_ends(tmp_path: Path) -> None:
    done = _persisted(tmp_path, agent="claude-code", agent_kwargs=[f"api_key={CANARY}"])
    identity = done.job.agent_kwargs_file
    assert identity is not None and identity.path.is_file()
    forget_agent_env(done.job)
    assert not identity.path.exists()


def test_retry_of_an_ended_job_whose_kwargs_are_gone_asks_for_a_new_submit(tmp_path: Path) -> None:
    done = _persisted(tmp_path, agent="claude-code", agent_kwargs=[f"api_key={CANARY}"])
    forget_agent_env(done.job)
    with pytest.raises(JobConflictError, match="--agent-kwarg values, which were deleted when it ended"):
        failed_trials(done.job)
