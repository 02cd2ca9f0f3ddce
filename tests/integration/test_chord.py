"""The distributed path end to end: real Redis, real workers, fake Pier."""

from __future__ import annotations

import csv
import json
import time

import pytest

from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration


def _summary(cluster: Cluster, job: str) -> list[dict[str, str]]:
    with (cluster.jobs_dir / job / "summary.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_chord_finalizes_with_failed_trials(cluster: Cluster) -> None:
    cluster.start_workers(2, concurrency=2)
    path = cluster.selection({
        "001": {"sleep_sec": 0.5, "reward": 1.0},
        "002": {"sleep_sec": 0.5, "reward": 0.0},
        "003": {"sleep_sec": 0.5, "exception": "AgentTimeoutError"},
        "004": {"sleep_sec": 0.2, "crash": True},
    })  # fmt: skip
    done = cluster.submit(path, "mixed")
    assert done.returncode == 1, done.stderr
    rows = {row["task_id"]: row for row in _summary(cluster, "mixed")}
    assert set(rows) == {"task_001", "task_002", "task_003", "task_004"}
    assert rows["task_001"]["reward"] == "1.0" and rows["task_001"]["failure_class"] == ""
    assert rows["task_002"]["reward"] == "0.0"
    assert rows["task_003"]["failure_class"] == "AgentTimeoutError"
    assert rows["task_004"]["failure_class"] == "CollectError"
    result = json.loads((cluster.jobs_dir / "mixed" / "result.json").read_text())
    assert result["n_total_trials"] == 4
    assert result["stats"]["n_errored_trials"] == 2
    # Pier's own layout: <jobs-dir>/<job>/<task>__<trial>/ with the verifier files.
    trial_dir = cluster.jobs_dir / "mixed" / f"task_001__{rows['task_001']['trial_id']}"
    assert (trial_dir / "verifier" / "reward.json").is_file()
    assert (trial_dir / "result.json").is_file()


def test_all_passing_job_exits_zero_and_summarize_reproduces(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=2)
    path = cluster.selection(
        {"001": {"reward": 1.0}, "002": {"reward": 0.5}},
    )
    done = cluster.submit(path, "ok", "--n-attempts", "2")
    assert done.returncode == 0, done.stderr
    job_dir = cluster.jobs_dir / "ok"
    before = {name: (job_dir / name).read_text() for name in ("result.json", "summary.json", "summary.csv")}
    for name in before:
        (job_dir / name).unlink()
    again = cluster.cli("summarize", "--jobs-dir", str(cluster.jobs_dir), "--job-name", "ok")
    assert again.returncode == 0, again.stderr
    assert (job_dir / "summary.csv").read_text() == before["summary.csv"]
    old, new = json.loads(before["summary.json"]), json.loads((job_dir / "summary.json").read_text())
    assert old["rows"] == new["rows"] and old["trial_count"] == new["trial_count"] == 4
    old, new = json.loads(before["result.json"]), json.loads((job_dir / "result.json").read_text())
    old.pop("updated_at"), new.pop("updated_at")
    assert old == new


def test_concurrency_cap_is_cluster_wide(cluster: Cluster) -> None:
    cluster.start_workers(2, concurrency=2)
    path = cluster.selection({f"{i:03d}": {"sleep_sec": 1.5} for i in range(1, 7)})
    done = cluster.submit(path, "capped", "--n-concurrent", "2")
    assert done.returncode == 0, done.stderr
    runs = cluster.pier_runs()
    assert len(runs) == 6
    # Sample the fake Pier intervals every 10 ms: never more than 2 at once.
    start = min(r["start"] for r in runs)
    end = max(r["end"] for r in runs)
    peak = 0
    t = start
    while t <= end:
        peak = max(peak, sum(r["start"] <= t < r["end"] for r in runs))
        t += 0.01
    assert peak == 2


def test_longest_trials_go_out_first(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=1)
    path = cluster.selection(
        {"001": {}, "002": {}, "003": {}}, agent_timeout_sec={"002": 900.0, "003": 700.0}
    )
    done = cluster.submit(path, "ordered")
    assert done.returncode == 0, done.stderr
    assert [r["task"] for r in cluster.pier_runs()] == ["task_002", "task_003", "task_001"]


def test_redelivered_message_yields_one_result(cluster: Cluster) -> None:
    from sciencebench.coordination.celery_app import create_app
    from sciencebench.core.settings import Settings

    cluster.start_workers(1, concurrency=1)
    path = cluster.selection({"001": {"reward": 1.0}})
    done = cluster.submit(path, "once")
    assert done.returncode == 0, done.stderr
    record_path = cluster.jobs_dir / "once" / ".sciencebench" / "trials" / "001-1.json"
    record = record_path.read_text()
    spec = json.loads((cluster.jobs_dir / "once" / ".sciencebench" / "job.json").read_text())
    trial = {"job_name": "once", "jobs_dir": spec["jobs_dir"], "task_id": "001", "attempt": 1,
             "task_dir": str(path / "task_001"), "task_toml_sha256": "x", "image_refs": [],
             "expected_sec": 1.0}  # fmt: skip
    app = create_app(Settings.from_env(cluster.env))
    # The same message delivered again (as after a visibility timeout).
    result = app.send_task("sciencebench.run_trial", args=[trial])
    deadline = time.monotonic() + 30
    while result.state == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.2)
        if "Ignored" in (cluster.workers[0].log_path.read_text()):
            break
    time.sleep(1)
    assert len(cluster.pier_runs()) == 1
    assert record_path.read_text() == record
