"""A worker runs only its own harness, on paths it serves, for the job its submit wrote.

Real Redis, real `sciencebench worker` processes (the fake Pier as their own
Pier). The attacker here holds the broker (sends a message) or writes on the
shared filesystem (writes a job.json); a marker file shows whether their
script ever ran.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from sciencebench.coordination.celery_app import create_app
from sciencebench.core.models import JobSpec, TrialSpec
from sciencebench.core.settings import Settings
from sciencebench.core.wire import RUN_TRIAL
from tests.fixtures.services import VENV_BIN
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration


def _script(tmp: Path) -> tuple[Path, Path]:
    """An attacker's executable that leaves a marker (and the worker's environment) when it runs."""
    marker = tmp / "marker"
    script = tmp / "x.sh"
    script.write_text(f"#!/bin/sh\nenv > {marker}\n")
    script.chmod(0o755)
    return script, marker


def _send(cluster: Cluster, trial: dict[str, Any]) -> dict[str, Any]:
    """Send one run_trial message as an attacker holding the broker would; the worker's answer."""
    app = create_app(Settings.from_env(cluster.env))
    result = app.send_task(RUN_TRIAL, args=[trial])
    answer = result.get(timeout=60)
    assert isinstance(answer, dict)
    return answer


def _submitted(cluster: Cluster, name: str, behaviours: dict[str, dict[str, Any]] | None = None) -> JobSpec:
    path = cluster.selection(behaviours or {"001": {"reward": 1.0}})
    done = cluster.submit(path, name)
    assert done.returncode == 0, done.stderr
    return JobSpec.model_validate_json((cluster.jobs_dir / name / ".sciencebench" / "job.json").read_bytes())


def _trial(job: JobSpec, **changes: Any) -> dict[str, Any]:
    task_id = job.task_ids[0]
    spec = TrialSpec(
        job_id=job.job_id, job_name=job.job_name, jobs_dir=job.jobs_dir, task_id=task_id, attempt=2,
        task_dir=job.selection_path / f"task_{task_id}", task_toml_sha256=job.task_hashes[task_id],
        image_refs=[], expected_sec=30.0,
    )  # fmt: skip
    return {**spec.model_dump(mode="json"), **changes}


def test_a_forged_message_outside_the_roots_runs_nothing(  # type: ignore[no-untyped-def]
    cluster: Cluster, tmp_path_factory
) -> None:
    cluster.start_workers(1)
    attacker = tmp_path_factory.mktemp("attacker")
    script, marker = _script(attacker)
    job = _submitted(cluster, "real")
    # A job.json of the attacker's own, in a jobs dir no worker serves, naming their script as Pier.
    forged = job.model_copy(update={"jobs_dir": attacker / "jobs", "pier_bin": str(script)})
    (attacker / "jobs" / job.job_name / ".sciencebench").mkdir(parents=True)
    (attacker / "jobs" / job.job_name / ".sciencebench" / "job.json").write_text(forged.model_dump_json())
    answer = _send(cluster, _trial(forged, jobs_dir=str(attacker / "jobs")))
    assert answer["exception_type"] == "UnfitError"
    assert "outside the jobs roots this host serves" in answer["exception_message"]
    assert not marker.exists()


def test_a_forged_job_spec_cannot_choose_pier_environment_or_agent(
    cluster: Cluster, tmp_path_factory
) -> None:  # type: ignore[no-untyped-def]
    cluster.start_workers(1)
    script, marker = _script(tmp_path_factory.mktemp("attacker"))
    job = _submitted(cluster, "victim")
    spec_path = cluster.jobs_dir / "victim" / ".sciencebench" / "job.json"
    # A writer on the shared filesystem swaps the harness, the environment class and the agent.
    forged = job.model_copy(update={"pier_bin": str(script), "environment_import_path": "x:Y"})
    spec_path.write_text(forged.model_dump_json())
    answer = _send(cluster, _trial(job))
    assert answer["exception_type"] is None, answer  # the worker's own (fake) Pier ran it
    assert not marker.exists()
    argv = cluster.pier_runs()[-1]["argv"]
    assert "sciencebench.network.environment:IsolatedDockerEnvironment" in argv and "x:Y" not in argv
    agent = job.agent.model_copy(
        update={"agent": None, "agent_import_path": "definitely_not_installed:Agent"}
    )
    spec_path.write_text(job.model_copy(update={"agent": agent}).model_dump_json())
    refused = _send(cluster, _trial(job, attempt=3))
    assert refused["exception_type"] == "RefusedError"
    assert "is not installed on this worker" in refused["exception_message"]
    assert len(cluster.pier_runs()) == 2  # the submit's trial and the forged spec's first one


def test_a_forged_job_spec_reads_no_worker_file_and_pulls_no_other_image(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cluster.start_workers(1)
    job = _submitted(cluster, "forged")
    meta = cluster.jobs_dir / "forged" / ".sciencebench"
    kwargs = {**job.agent.agent_kwargs, "config_toml_file": "/etc/shadow"}
    (meta / "job.json").write_text(
        job.model_copy(
            update={"agent": job.agent.model_copy(update={"agent_kwargs": kwargs})}
        ).model_dump_json()
    )
    reads = _send(cluster, _trial(job))
    assert reads["exception_type"] == "RefusedError" and "config_toml_file" in reads["exception_message"]
    (meta / "job.json").write_text(job.model_dump_json())
    stray = "127.0.0.1:1/elsewhere@sha256:" + "0" * 64
    pulls = _send(cluster, _trial(job, attempt=3, image_refs=[stray]))
    assert pulls["exception_type"] == "RefusedError", pulls
    assert "is not one of the job's images" in pulls["exception_message"]
    outside = tmp_path_factory.mktemp("outside")
    shutil.rmtree(meta / "superseded", ignore_errors=True)
    (meta / "superseded").symlink_to(outside)  # the worker would move trial directories there
    escapes = _send(cluster, _trial(job, attempt=4))
    assert escapes["exception_type"] == "RefusedError" and "symbolic link" in escapes["exception_message"]
    assert list(outside.iterdir()) == []
    assert len(cluster.pier_runs()) == 1  # the submit's own trial only


def test_a_message_naming_a_task_outside_its_selection_is_refused(cluster: Cluster) -> None:
    cluster.start_workers(1)
    job = _submitted(cluster, "escape")
    elsewhere = cluster.root / "elsewhere" / "task_001"
    shutil.copytree(job.selection_path / "task_001", elsewhere)
    answer = _send(cluster, _trial(job, task_dir=str(elsewhere)))
    assert answer["exception_type"] == "RefusedError"
    assert "is not task_001 of the job's selection" in answer["exception_message"]
    assert len(cluster.pier_runs()) == 1


def test_a_message_of_another_submit_is_not_run(cluster: Cluster) -> None:
    cluster.start_workers(1)
    job = _submitted(cluster, "mine")
    answer = _send(cluster, _trial(job, job_id=str(uuid.uuid4())))
    assert answer["exception_type"] == "UnfitError"
    assert "belongs to another submit" in answer["exception_message"]


def test_concurrent_submits_of_one_name_one_wins(cluster: Cluster) -> None:
    cluster.start_workers(1)
    path = cluster.selection({"001": {"reward": 1.0}})
    argv = [str(VENV_BIN / "sciencebench"), "submit", "--path", str(path),
            "--jobs-dir", str(cluster.jobs_dir), "--job-name", "race"]  # fmt: skip
    job_dir = cluster.jobs_dir / "race"
    for _ in range(3):
        procs = [subprocess.Popen(argv, env=cluster.env, cwd=cluster.root, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
        outputs = [p.communicate(timeout=120) for p in procs]
        assert sorted(p.returncode for p in procs) == [0, 2], outputs
        loser = next(err for p, (_, err) in zip(procs, outputs, strict=True) if p.returncode == 2)
        assert "--job-name race" in loser and "Traceback" not in loser
        job = JobSpec.model_validate_json((job_dir / ".sciencebench" / "job.json").read_bytes())
        deadline = time.monotonic() + 60
        while not (job_dir / "summary.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert json.loads((job_dir / "summary.json").read_text())["trial_count"] == 1
        assert redis.Redis.from_url(cluster.redis.url).keys(f"sciencebench:{job.job_id}:*")
        shutil.rmtree(job_dir)


def test_a_resubmit_after_deleting_the_job_runs_every_trial(cluster: Cluster) -> None:
    cluster.start_workers(2)
    path = cluster.selection({"001": {"reward": 1.0}, "002": {"reward": 1.0}})
    assert cluster.submit(path, "again").returncode == 0
    shutil.rmtree(cluster.jobs_dir / "again")
    second = cluster.submit(path, "again")
    assert second.returncode == 0, second.stderr
    assert len(cluster.pier_runs()) == 4
    assert json.loads((cluster.jobs_dir / "again" / "summary.json").read_text())["trial_count"] == 2


def test_same_name_jobs_in_two_jobs_dirs_share_nothing(cluster: Cluster) -> None:
    cluster.start_workers(2)
    path = cluster.selection({"001": {"reward": 1.0}})
    other_jobs = cluster.root / "other-user-jobs"
    first = cluster.submit(path, "smoke")
    args = ["submit", "--path", str(path), "--agent", "nop", "--jobs-dir", str(other_jobs),
            "--job-name", "smoke", "--wait"]  # fmt: skip
    second = cluster.cli(*args)
    assert (first.returncode, second.returncode) == (0, 0), second.stderr
    assert len(cluster.pier_runs()) == 2
    ids = {
        JobSpec.model_validate_json((root / "smoke" / ".sciencebench" / "job.json").read_bytes()).job_id
        for root in (cluster.jobs_dir, other_jobs)
    }
    assert len(ids) == 2


def test_the_agent_env_file_is_deleted_when_the_job_ends(cluster: Cluster) -> None:
    cluster.start_workers(1)
    path = cluster.selection({"001": {"reward": 1.0}})
    done = cluster.submit(path, "secret", "--agent-env", "EXTRA_TOKEN=sk-canary-del-0042")
    assert done.returncode == 0, done.stderr
    job = JobSpec.model_validate_json(
        (cluster.jobs_dir / "secret" / ".sciencebench" / "job.json").read_bytes()
    )
    assert job.agent_env_file is not None and job.agent_env_file.path.name == f"{job.job_id}.agent-env.json"
    assert not job.agent_env_file.path.exists()
    assert list((path / ".sciencebench" / "secrets").iterdir()) == []
    again = cluster.cli("retry", "secret", "--failed", "--jobs-dir", str(cluster.jobs_dir))
    assert again.returncode == 0  # nothing errored: nothing to resend
