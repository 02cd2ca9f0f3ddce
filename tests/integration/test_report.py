"""`report` on real jobs, opened in a real headless Chromium: no console error, no request, charts drawn.

The jobs are real `submit --local` runs (the fake Pier, no broker) of two
selections of the same task ids, one task flaky (its attempts get 1 then 0),
one paid for, one failing; then the job files turn hostile (a task id, a model
and an agent name of markup and quotes), as a job's owner or its trials could
write them. The page is loaded from its file by Chromium over the DevTools
protocol (`tests/fixtures/chromium.py`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sciencebench.report.page import PALETTE
from tests.fixtures.chromium import Box, Image, open_page
from tests.fixtures.services import FAKE_PIER, VENV_BIN
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

HOSTILE = '<img src=x onerror=alert(1)><script>alert("x")</script>\''
CHARTS = ("chart-mean-reward", "chart-pass-at-k", "chart-cost", "chart-duration")


def _local(cluster: Cluster, path: Path, job: str) -> subprocess.CompletedProcess[str]:
    """`submit --local` with no broker, as a user on one machine runs it."""
    argv = [str(VENV_BIN / "sciencebench"), "submit", "--local", "--path", str(path), "--agent", "nop",
            "--jobs-dir", str(cluster.jobs_dir), "--job-name", job, "--n-attempts", "2",
            "--n-concurrent", "4", "--pier-bin", str(FAKE_PIER)]  # fmt: skip
    env = {k: v for k, v in cluster.env.items() if k != "SCIENCEBENCH_BROKER_URL"}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def _sciencebench(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in cluster.env.items() if k != "SCIENCEBENCH_BROKER_URL"}
    return subprocess.run([sys.executable, "-m", "sciencebench", *args], env=env, cwd=cluster.root,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _behaviours(cluster: Cluster, reward_002: float) -> dict[str, dict[str, Any]]:
    spend = {"n_input_tokens": 900, "n_output_tokens": 100, "cost_usd": 0.5}
    return {
        "001": {"reward": 1.0, "spend": spend},
        "002": {"reward": reward_002},
        "003": {"rewards_in_turn": [1.0, 0.0], "counter": str(cluster.root / f"turns-{reward_002}")},
        "004": {"exception": "AgentTimeoutError"},
    }


def _turn_hostile(job_dir: Path) -> None:
    """An agent name, a task id and a model of markup and quotes in the job's own files."""
    spec_path = job_dir / ".sciencebench" / "job.json"
    spec = json.loads(spec_path.read_text())
    spec["agent"].update(agent=HOSTILE, models=[HOSTILE])
    spec_path.write_text(json.dumps(spec))
    for record_path in (job_dir / ".sciencebench" / "trials").glob("*.json"):
        record = json.loads(record_path.read_text())
        record["model"] = HOSTILE
        if record_path.name == "002-1.json":
            record["task_id"] = HOSTILE
        record_path.write_text(json.dumps(record))


def _inked(image: Image, box: Box, colour: str) -> int:
    """How many pixels in `box` are `colour` (give or take anti-aliasing)."""
    want = tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    count = 0
    for y in range(int(box.y), min(int(box.y + box.height), image.height)):
        for x in range(int(box.x), min(int(box.x + box.width), image.width)):
            if all(abs(a - b) <= 8 for a, b in zip(image.pixel(x, y), want, strict=True)):
                count += 1
    return count


def test_report_of_real_jobs_renders_offline_in_chromium(cluster: Cluster) -> None:
    for job, reward in (("base", 0.0), ("new", 1.0)):
        path = cluster.selection(_behaviours(cluster, reward), root=cluster.root / f"sel-{job}")
        done = _local(cluster, path, job)
        assert done.returncode == 1, done.stdout + done.stderr  # 004 errored
        # The job's end names the flaky task before its table, as summarize does.
        assert done.stdout.index("flaky: 1 task(s)") < done.stdout.index(f"{job}: 8 trial(s)"), done.stdout
        # summarize names the flaky task before anything else, and summary.json keeps it.
        summary = _sciencebench(cluster, "summarize", "--job-name", job, "--jobs-dir", str(cluster.jobs_dir))
        assert summary.stdout.splitlines()[:2] == [
            "flaky: 1 task(s) whose reward differs across attempts (attempt order):",
            "  task_003: 1, 0",
        ], summary.stdout
        flaky = json.loads((cluster.jobs_dir / job / "summary.json").read_text())["flaky_tasks"]
        assert flaky == [{"task_id": "003", "model": None, "attempts": [1, 2], "rewards": [1.0, 0.0]}]
    _turn_hostile(cluster.jobs_dir / "new")

    out = cluster.root / "report.html"
    done = _sciencebench(cluster, "report", "base", str(cluster.jobs_dir / "new"), "--out", str(out),
                         "--jobs-dir", str(cluster.jobs_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"report: {out} (2 job(s), 2 column(s), 2 flaky task(s))\n"
    html = out.read_text()
    assert HOSTILE not in html and "<script" not in html and "<img" not in html

    page = open_page(out, ["svg.chart", *(f"#{chart}" for chart in CHARTS), "script", "img", "#flaky"])
    assert page.console_errors == []
    assert page.requests == [out.resolve().as_uri()]  # the file itself, nothing else
    assert page.elements["script"] == page.elements["img"] == 0  # the hostile markup stayed text
    assert page.elements["#flaky"] == 1 and page.elements["svg.chart"] == len(CHARTS)
    # The flaky tasks come first: their box is above every chart's.
    flaky_box = page.boxes["#flaky"][0]
    assert page.screenshot is not None
    for chart in CHARTS:
        (box,) = page.boxes[f"#{chart}"]
        assert box.width > 300 and box.height > 40 and box.y > flaky_box.y, (chart, box)
        # Drawn: the first column's bars are on the screenshot, inside the chart's box.
        assert _inked(page.screenshot, box, PALETTE[0]) > 200, chart

    # Bad input: one line, exit 2, nothing written.
    missing = cluster.root / "missing.html"
    refused = _sciencebench(cluster, "report", "base", "nosuch", "--out", str(missing),
                            "--jobs-dir", str(cluster.jobs_dir))  # fmt: skip
    assert refused.returncode == 2 and refused.stdout == "" and not missing.exists()
    assert refused.stderr.count("\n") == 1 and "nosuch" in refused.stderr
