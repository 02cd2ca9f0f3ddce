"""Real Pier through the real chord on real workers, images pulled by digest.

The finished jobs are Pier's own: their job-level files load with Pier's
models and carry the statistics Pier computes from the real trials, and
`pier view` shows them as it shows a job `pier run` wrote.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import docker
import pytest
import redis

from sciencebench.dockerhost import naming
from sciencebench.login.selection import load_selection
from sciencebench.worker.docker import images
from tests.fixtures.pier_results import check_pier_job_files
from tests.fixtures.pier_viewer import check_job_as_pier_shows_it, check_trials_as_pier_shows_them, pier_view
from tests.fixtures.services import VENV_BIN, RedisServer, Worker

pytestmark = pytest.mark.docker


def _rows(job_dir: Path) -> dict[str, dict[str, str]]:
    with (job_dir / "summary.csv").open() as handle:
        return {row["task_id"]: row for row in csv.DictReader(handle)}


def _leftovers(client: docker.DockerClient, trials: list[str]) -> dict[str, list[str]]:
    """What the engine still holds that is named after one of these trials (their compose projects).

    Scoped to the test's own trials: the engine may be shared with other work running beside the test.
    """
    projects = [naming.compose_project_name(trial) for trial in trials]

    def ours(name: str) -> bool:
        return any(project in name for project in projects)

    return {
        # ignore_removed: another test's container may be gone between the listing and its inspect
        "containers": [c.name for c in client.containers.list(all=True, ignore_removed=True) if ours(c.name)],
        "networks": [n.name for n in client.networks.list() if ours(n.name)],
        "derived images": [t for i in client.images.list() for t in i.tags if ours(t)],
    }


def test_oracle_and_nop_through_workers(
    demo_selection: Path, docker_client: docker.DockerClient, redis_server: RedisServer,
    tmp_path: Path, state_dir: Path,
) -> None:  # fmt: skip
    redis.Redis.from_url(redis_server.url).flushdb()
    started = datetime.now(UTC).isoformat()  # the session's pull log holds other tests' pulls too
    selection = load_selection(demo_selection)
    for ref in selection.image_refs:  # force real pulls from the registry, by digest
        for name in (ref.split("@")[0], images.pinned_name(ref)):  # the tag, and an earlier digest pull
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_client.images.remove(name, force=True)
    env = dict(os.environ)
    env.update(SCIENCEBENCH_BROKER_URL=redis_server.url, SCIENCEBENCH_STATE_DIR=str(state_dir),
               SCIENCEBENCH_LEASE_SECONDS="10", LITELLM_LOCAL_MODEL_COST_MAP="True",
               PATH=f"{VENV_BIN}{os.pathsep}{env['PATH']}")  # fmt: skip
    # The workers serve the session's temp dir: the demo selection lives beside this test's jobs.
    serves = demo_selection.parents[1]
    workers = [Worker(f"d{i}", env, tmp_path, concurrency=1, serves=serves).start() for i in range(2)]
    try:
        for worker in workers:
            worker.wait_ready(timeout=120)
        jobs = tmp_path / "jobs"
        import subprocess

        def submit(agent: str, job: str, *extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(VENV_BIN / "sciencebench"), "submit", "--path", str(demo_selection), "--agent", agent,
                 "--jobs-dir", str(jobs), "--job-name", job, "--wait", *extra],
                env=env, capture_output=True, text=True, timeout=900,
            )  # fmt: skip

        oracle = submit("oracle", "oracle")
        assert oracle.returncode == 0, oracle.stdout + oracle.stderr
        rows = _rows(jobs / "oracle")
        assert rows["task_001"]["reward"] in ("1", "1.0")
        assert rows["task_002"]["reward"] in ("0", "0.0")
        assert rows["task_001"]["private_passed"] == "1"
        for row in rows.values():
            trial_dir = jobs / "oracle" / f"{row['task_id']}__{row['trial_id']}"
            assert (trial_dir / "artifacts" / "model.patch").stat().st_size > 0
            assert (trial_dir / "verifier" / "reward.txt").is_file()
            assert list(trial_dir.glob("network-policy-*.json")), "the policy record is missing"

        nop = submit("nop", "nop", "--task-id", "001")
        assert nop.returncode == 0, nop.stdout + nop.stderr
        nop_rows = _rows(jobs / "nop")
        assert nop_rows["task_001"]["reward"] in ("0", "0.0")
        nop_dir = jobs / "nop" / f"task_001__{nop_rows['task_001']['trial_id']}"
        assert (nop_dir / "artifacts" / "model.patch").read_bytes() == b""  # explicit empty patch

        # Pier's layout: the job-level files are Pier's, their statistics Pier's own of the real trials.
        result, config, trials = check_pier_job_files(jobs / "oracle")
        assert [a.name for a in config.agents] == ["oracle"] and len(trials) == 2
        assert result.stats.evals["oracle__adhoc"].metrics == [{"mean": 0.5}]
        check_pier_job_files(jobs / "nop")
        # ... and Pier's viewer shows both jobs and their trials as summary.csv has them.
        with pier_view(jobs, env, tmp_path / "pier-view.log") as viewer:
            for job, agent in (("oracle", "oracle"), ("nop", "nop")):
                check_job_as_pier_shows_it(viewer, jobs / job, [agent])
                check_trials_as_pier_shows_them(viewer, jobs / job, agent)

        pulls = [json.loads(line) for line in (state_dir / "pulls.jsonl").read_text().splitlines()]
        pulled = sorted(p["ref"] for p in pulls if "event" not in p and p["finished_at"] >= started)
        assert pulled == sorted(selection.image_refs)  # each removed image pulled again, once
        trials = [f"{row['task_id']}__{row['trial_id']}" for row in [*rows.values(), *nop_rows.values()]]
        assert _leftovers(docker_client, trials) == {"containers": [], "networks": [], "derived images": []}
        for ref in selection.image_refs:  # pinned task images are kept (pulled by digest: untagged)
            docker_client.images.get(images.pinned_name(ref))
    finally:
        for worker in workers:
            worker.stop()
        shutil.rmtree(tmp_path / "jobs", ignore_errors=True)
