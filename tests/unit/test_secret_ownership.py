"""A worker reads a job's files and secrets only when the job directory's owner owns them.

`admission.load_owned_job` takes the owner from `<jobs dir>/<job name>` and
wants `.sciencebench/` and `job.json` to be that account's;
`secrets.load_secrets` wants the env file and the `--agent-env` file to be
that account's too, checked on the descriptor it reads. Root hands the files
to other uids (no account needed for a uid); the key check on the worker is
the login node's allowlist again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from sciencebench.core.envfile import EnvFile
from sciencebench.core.errors import RefusedError
from sciencebench.core.models import AgentPlan, JobSpec
from sciencebench.core.paths import JobPaths
from sciencebench.worker.admission import load_owned_job
from sciencebench.worker.secrets import load_secrets

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(os.geteuid() != 0, reason="giving files to other uids needs root"),
]

ALICE, BOB = 54_321, 54_322
CANARY = "sk-canary-owner-3b1d"


def _identity(path: Path, text: str, uid: int) -> EnvFile:
    path.write_text(text)
    os.chown(path, uid, -1)
    return EnvFile(path=path, sha256=hashlib.sha256(text.encode()).hexdigest())


def _job(tmp_path: Path, **fields: object) -> JobSpec:
    agent = AgentPlan(harness="nop", agent="nop", agent_import_path=None, models=[], agent_kwargs={},
                      agent_env_names=[], provider=None, gateways=[])  # fmt: skip
    return JobSpec(job_name="j", jobs_dir=tmp_path / "jobs", selection_path=tmp_path, selection_sha256="0",
                   task_ids=[], allow_restricted_licenses=False, image_refs=[], agent=agent,
                   **fields)  # type: ignore[arg-type]  # fmt: skip


def test_the_owners_own_files_are_read(tmp_path: Path) -> None:
    env = _identity(tmp_path / "alice.env", f"OPENAI_API_KEY={CANARY}\n", ALICE)
    agent_env = _identity(tmp_path / "a.json", json.dumps({"HF_TOKEN": CANARY}), ALICE)
    values = load_secrets(_job(tmp_path, env_file=env, agent_env_file=agent_env), ALICE)
    assert values == {"OPENAI_API_KEY": CANARY, "HF_TOKEN": CANARY}


@pytest.mark.parametrize("which", ["env file", "--agent-env file"])
def test_another_accounts_file_is_refused_by_its_name(tmp_path: Path, which: str) -> None:
    other = _identity(tmp_path / "alice.secret", f"OPENAI_API_KEY={CANARY}\n", ALICE)
    if which == "--agent-env file":
        other = _identity(tmp_path / "alice.secret", json.dumps({"OPENAI_API_KEY": CANARY}), ALICE)
    job = _job(tmp_path, **({"env_file": other} if which == "env file" else {"agent_env_file": other}))
    with pytest.raises(RefusedError) as refused:
        load_secrets(job, BOB)  # bob's job directory, alice's file: its hash is right
    message = str(refused.value)
    assert message.startswith(f"refused: {which} alice.secret belongs to another account (uid {ALICE})")
    assert f"(uid {BOB})" in message and str(tmp_path) not in message and CANARY not in message


def test_a_symlink_to_the_owners_file_is_refused(tmp_path: Path) -> None:
    real = _identity(tmp_path / "real.env", f"OPENAI_API_KEY={CANARY}\n", ALICE)
    link = tmp_path / "link.env"
    link.symlink_to(real.path)
    os.lchown(link, ALICE, -1)
    with pytest.raises(RefusedError, match=r"^refused: env file link\.env is a symbolic link$"):
        load_secrets(_job(tmp_path, env_file=real.model_copy(update={"path": link})), ALICE)


def test_a_key_no_agent_reads_is_refused_on_the_worker(tmp_path: Path) -> None:
    env = _identity(tmp_path / "p.env", f"OPENAI_API_KEY={CANARY}\nKRB5_CONFIG=/x\n", ALICE)
    with pytest.raises(RefusedError, match=r"^refused: KRB5_CONFIG: not a key agents read"):
        load_secrets(_job(tmp_path, env_file=env), ALICE)


def _job_dir(tmp_path: Path, owners: tuple[int, int, int]) -> JobPaths:
    job = _job(tmp_path)
    paths = JobPaths(job.jobs_dir, job.job_name)
    paths.meta_dir.mkdir(parents=True)
    paths.job_spec.write_text(job.model_dump_json())
    for path, uid in zip((paths.job_dir, paths.meta_dir, paths.job_spec), owners, strict=True):
        os.chown(path, uid, -1)
    return paths


def test_the_job_is_its_directorys_owners(tmp_path: Path) -> None:
    job, owner = load_owned_job(_job_dir(tmp_path, (ALICE, ALICE, ALICE)))
    assert (job.job_name, owner) == ("j", ALICE)


@pytest.mark.parametrize(
    ("owners", "named"),
    [((ALICE, ALICE, BOB), ".sciencebench/job.json"), ((ALICE, BOB, BOB), "j/.sciencebench")],
)
def test_a_job_spec_of_another_account_in_the_directory_is_refused(
    tmp_path: Path, owners: tuple[int, int, int], named: str
) -> None:
    # Bob, writing in alice's (group-writable) job directory, replaces her job.json or .sciencebench/.
    with pytest.raises(RefusedError, match=rf"^{named} belongs to another account \(uid {BOB}\)"):
        load_owned_job(_job_dir(tmp_path, owners))


def test_a_symlinked_job_spec_is_refused(tmp_path: Path) -> None:
    paths = _job_dir(tmp_path, (ALICE, ALICE, ALICE))
    moved = tmp_path / "elsewhere.json"
    paths.job_spec.rename(moved)
    paths.job_spec.symlink_to(moved)
    with pytest.raises(RefusedError, match="symbolic link"):
        load_owned_job(paths)
