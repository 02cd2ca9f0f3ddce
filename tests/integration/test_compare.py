"""`compare` pairs two real jobs task by task; `summarize` never calls a job with missing trials complete.

The jobs are real `submit --local` runs (the fake Pier) of two selections of
the same task ids, so of the same selection hash, whose tasks end otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.services import FAKE_PIER, VENV_BIN
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

BASE = {"001": {"reward": 1.0}, "002": {"reward": 0.0}, "003": {"reward": 1.0}, "004": {"reward": 0.0},
        "005": {"exception": "AgentTimeoutError"}}  # fmt: skip
# 001 pass -> fail; 002 and 004 fail -> pass; 003 passes in both; 005 fails in both.
NEW = {**BASE, "001": {"reward": 0.0}, "002": {"reward": 1.0}, "004": {"reward": 1.0}}


def _local(cluster: Cluster, path: Path, job: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """`submit --local` with no broker, as a user on one machine runs it."""
    argv = [str(VENV_BIN / "sciencebench"), "submit", "--local", "--path", str(path), "--agent", "nop",
            "--jobs-dir", str(cluster.jobs_dir), "--job-name", job, "--n-attempts", "2",
            "--n-concurrent", "4", "--pier-bin", str(FAKE_PIER), *extra]  # fmt: skip
    env = {k: v for k, v in cluster.env.items() if k != "SCIENCEBENCH_BROKER_URL"}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def _sciencebench(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**cluster.env, "COLUMNS": "200"}
    env.pop("SCIENCEBENCH_BROKER_URL")
    return subprocess.run([sys.executable, "-m", "sciencebench", *args], env=env, cwd=cluster.root,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _compare_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    done = _sciencebench(cluster, "compare", *args, "--jobs-dir", str(cluster.jobs_dir), "--json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_compare_pairs_two_real_jobs(cluster: Cluster) -> None:
    base = _local(cluster, cluster.selection(BASE, root=cluster.root / "sel-base"), "base")
    new = _local(cluster, cluster.selection(NEW, root=cluster.root / "sel-new"), "new")
    assert base.returncode == new.returncode == 1, base.stderr + new.stderr  # 005 errored in both

    report = _compare_json(cluster, "base", "new")
    assert report["schema"] == "sciencebench.compare/1"
    assert report["same_selection"] is True
    assert report["pass_to_fail"] == ["001"] and report["fail_to_pass"] == ["002", "004"]
    assert (report["a_pass_b_fail"], report["a_fail_b_pass"]) == (1, 2)
    assert report["mcnemar_p"] == 1.0  # 2 * P[X <= 1], X ~ Bin(3, 1/2)
    assert report["n_paired"] == 5
    assert report["mean_difference"] == pytest.approx((-1 + 1 + 0 + 1 + 0) / 5)
    low, high = report["interval"]
    assert low <= report["mean_difference"] <= high
    assert (report["resamples"], report["seed"], report["confidence"]) == (10000, 0, 0.95)
    assert report["only_in_a"] == report["only_in_b"] == []
    for side, name, passed in (("a", "base", 2), ("b", "new", 3)):
        job = report[side]
        assert (job["job_name"], job["n_tasks"], job["n_trials_planned"]) == (name, 5, 10)
        assert (job["n_tasks_counted"], job["n_passed"], job["missing_trials"]) == (5, passed, 0)
        assert job["excluded_trials"] == {} and job["agent"] == "nop"
        assert job["job_dir"] == str(cluster.jobs_dir / name)
    assert [t["task_id"] for t in report["tasks"]] == ["001", "002", "003", "004", "005"]
    assert report["tasks"][0] == {"task_id": "001", "a_mean": 1.0, "b_mean": 0.0, "a_passed": True,
                                  "b_passed": False, "difference": -1.0}  # fmt: skip
    # The same again gives the same numbers (a seeded bootstrap), and by job directory too.
    again = _compare_json(cluster, str(cluster.jobs_dir / "base"), str(cluster.jobs_dir / "new"))
    assert again == report

    # A job against itself: no difference, p = 1.
    same = _compare_json(cluster, "base", "base")
    assert (same["mean_difference"], same["interval"], same["mcnemar_p"]) == (0.0, [0.0, 0.0], 1.0)

    table = _sciencebench(cluster, "compare", "base", "new", "--jobs-dir", str(cluster.jobs_dir))
    assert table.returncode == 0, table.stderr
    flips = [[cell.strip() for cell in line.split("│") if cell.strip()]
             for line in table.stdout.splitlines() if "->" in line and "task_" in line]  # fmt: skip
    assert flips == [
        ["task_001", "1.000", "0.000", "pass -> fail"],
        ["task_002", "0.000", "1.000", "fail -> pass"],
        ["task_004", "0.000", "1.000", "fail -> pass"],
    ]
    assert "paired on 5 task(s): mean reward B - A +0.200 (95% bootstrap interval" in table.stdout
    assert "1 pass -> fail, 2 fail -> pass; McNemar exact p = 1" in table.stdout

    # A trial record gone: the task still counts on its other attempt; the trial is counted missing.
    (cluster.jobs_dir / "new" / ".sciencebench" / "trials" / "004-1.json").unlink()
    gone = _compare_json(cluster, "base", "new")
    assert gone["b"]["missing_trials"] == 1 and gone["fail_to_pass"] == ["002", "004"]
    table = _sciencebench(cluster, "compare", "base", "new", "--jobs-dir", str(cluster.jobs_dir))
    assert "incomplete: B (new): 1 of 10 trials have no record" in table.stdout


def test_compare_refuses_jobs_of_different_selections(cluster: Cluster) -> None:
    path = cluster.selection(BASE)
    assert _local(cluster, path, "all").returncode == 1
    assert _local(cluster, path, "some", "--task-id", "001-003").returncode == 0
    args = ("compare", "all", "some", "--jobs-dir", str(cluster.jobs_dir))
    refused = _sciencebench(cluster, *args, "--json")
    assert refused.returncode == 2 and refused.stdout == ""
    (line,) = refused.stderr.splitlines()
    assert line.startswith("sciencebench: error: all and some ran different selections (sha256 ")
    assert "--allow-different-selection" in line

    allowed = _sciencebench(cluster, *args, "--json", "--allow-different-selection")
    assert allowed.returncode == 0, allowed.stderr
    report = json.loads(allowed.stdout)
    assert report["same_selection"] is False
    assert report["n_paired"] == 3 and report["only_in_a"] == ["004", "005"] and report["only_in_b"] == []
    assert report["mean_difference"] == 0.0 and report["mcnemar_p"] == 1.0

    unknown = _sciencebench(cluster, "compare", "all", "nosuch", "--jobs-dir", str(cluster.jobs_dir))
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1 and "nosuch" in unknown.stderr


def test_summarize_calls_a_job_with_a_missing_record_incomplete(cluster: Cluster) -> None:
    path = cluster.selection({"001": {"reward": 1.0}, "002": {"reward": 1.0}})
    assert _local(cluster, path, "gaps").returncode == 0
    args = ("summarize", "--job-name", "gaps", "--jobs-dir", str(cluster.jobs_dir))
    whole = _sciencebench(cluster, *args)
    assert whole.returncode == 0 and "incomplete" not in whole.stdout, whole.stdout + whole.stderr
    assert json.loads((cluster.jobs_dir / "gaps" / "summary.json").read_text())["missing_trials"] == []

    (cluster.jobs_dir / "gaps" / ".sciencebench" / "trials" / "002-2.json").unlink()
    done = _sciencebench(cluster, *args)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gaps: 3 trial(s), 1 with no record: incomplete" in done.stdout
    assert "incomplete: 1 of 4 trials have no record" in done.stdout
    assert "missing: 1 trial(s) have no record: task_002 #2" in done.stderr
    summary = json.loads((cluster.jobs_dir / "gaps" / "summary.json").read_text())
    assert summary["missing_trials"] == ["002#2"] and summary["trial_count"] == 3
    # summary.csv keeps the original's columns and rows: the missing trial is in summary.json only.
    csv_lines = (cluster.jobs_dir / "gaps" / "summary.csv").read_text().splitlines()
    assert csv_lines[0].split(",")[:3] == ["task_id", "trial_id", "reward"] and len(csv_lines) == 4
