"""Item 10, the campaign: two users' jobs on 4 simulated hosts, placed vs unplaced, in one run.

    .venv/bin/python -m bench.campaign          the figure alone (about 3 minutes), printed as JSON
    .venv/bin/python -m bench.run --only 10     the same inside the benchmark (full run only)

Each simulated host is a `sciencebench worker` (2 slots, the fake Pier) on
its own Docker Engine and image store (`tests/fixtures/engines.py`), pulling
from the loopback registry: pulls are real pulls of real layers. The
selection has 8 tasks, each with its own image; the images' sizes keep the
relative sizes of a SWE-bench-family selection's task images (a 1:8 spread,
scaled down to 16-128 MB) and the tasks' durations are heavy-tailed
(log-normal, a fixed seed). Job A (user alice, 4 attempts: 32 trials) is
submitted first, job B (user bob, 1 attempt: 8 trials) `B_DELAY_SEC` later,
both with `--n-concurrent 8` (the cluster's slots).

The same campaign runs twice on fresh Engines: placed (both jobs submitted
with `--placement`) and unplaced (the same submits without it: fair share
on, every trial to the shared queue). Per half: makespan (A's submit to the
last trial's end) over the bound max(longest pull + its trial, (all trials'
durations + one pull of each image) / slots), a pull's time being the
fastest measured pull of that image in this run; the images each host
pulled (its pull log); job B's wait (its submit to its first trial's start,
the start of the fake Pier).
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import sb
from bench.harness import REPO, Harness
from bench.params import Params
from bench.report import Findings, Outcome
from tests.fixtures.engines import Engine, private_engines
from tests.fixtures.registry import Published
from tests.fixtures.services import FAKE_PIER, VENV_BIN, Worker

HOSTS = 4
SLOTS = 2
IMAGE_MB = (16, 24, 32, 40, 56, 72, 96, 128)  # tasks 001 .. 008
ATTEMPTS = {"camp-a": 4, "camp-b": 1}
USERS = {"camp-a": "alice", "camp-b": "bob"}
B_DELAY_SEC = 5.0
SEED = 3
DURATION_MEDIAN_SEC = 4.0
DURATION_SIGMA = 1.0
DURATION_CAP_SEC = 30.0
HALVES = ("placed", "unplaced")
DB = {"placed": 3, "unplaced": 4}


def durations() -> dict[str, float]:
    """Each task's fake Pier duration: log-normal, fixed seed, capped."""
    rng = random.Random(SEED)
    return {
        f"{i + 1:03d}": round(
            min(DURATION_CAP_SEC, DURATION_MEDIAN_SEC * rng.lognormvariate(0, DURATION_SIGMA)), 2
        )
        for i in range(len(IMAGE_MB))
    }


@dataclass
class Half:
    """One half of the campaign: its work directory, Engines, workers and what its fake Pier logged."""

    name: str
    work: Path
    engines: list[Engine]
    workers: list[Worker]

    @property
    def log(self) -> Path:
        return self.work / "fake-pier.jsonl"


def _env(h: Harness, half: str, engine: Engine | None = None, user: str | None = None) -> dict[str, str]:
    log = str(h.work / half / "fake-pier.jsonl")
    env = h.env(DB[half], FAKE_PIER_LOG=log, SCIENCEBENCH_PIER_ENV="FAKE_PIER_LOG")
    if engine is not None:
        env.update(engine.env())
    if user is not None:
        env.update(USER=user, LOGNAME=user)
    return env


def _submit(h: Harness, half: str, path: Path, job: str) -> subprocess.Popen[bytes]:
    # The unplaced half is the same submit without `--placement`: every trial to the shared queue.
    argv = [str(VENV_BIN / "sciencebench"), "submit", "--path", str(path), "--agent", "nop",
            "--jobs-dir", str(h.work / half / "jobs"), "--job-name", job, "--wait",
            "--n-attempts", str(ATTEMPTS[job]), "--n-concurrent", str(HOSTS * SLOTS),
            *(["--placement"] if half == "placed" else [])]  # fmt: skip
    out = (h.work / half / f"{job}.submit.log").open("wb")
    return subprocess.Popen(argv, env=_env(h, half, user=USERS[job]), cwd=REPO, stdout=out,
                            stderr=subprocess.STDOUT)  # fmt: skip


def _wall(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def run_half(h: Harness, half: str, path: Path, engines: list[Engine]) -> dict[str, Any]:
    """Workers on `engines`, both jobs submitted and followed to their end; what the half measured."""
    work = h.work / half
    (work / "jobs").mkdir(parents=True, exist_ok=True)
    redis_client = sb_redis(h, half)
    redis_client.flushdb()
    workers: list[Worker] = []
    try:
        for engine in engines:
            worker = Worker(f"{half[:1]}{engine.name}", _env(h, half, engine), work, SLOTS,
                            ["--pier-bin", str(FAKE_PIER)], serves=h.work)  # fmt: skip
            workers.append(worker.start())
        for worker in workers:
            worker.wait_ready(timeout=180)
        a = _submit(h, half, path, "camp-a")
        time.sleep(B_DELAY_SEC)
        b = _submit(h, half, path, "camp-b")
        codes = {"camp-a": a.wait(timeout=900), "camp-b": b.wait(timeout=900)}
    finally:
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.stop()
        redis_client.close()
    if any(codes.values()):
        tails = {job: (work / f"{job}.submit.log").read_text(errors="replace")[-1500:] for job in codes}
        raise RuntimeError(f"{half}: a submit failed {codes}: {tails}")
    return _measure(half, work, engines, codes)


def sb_redis(h: Harness, half: str) -> Any:
    """A client of the half's Redis database."""
    import redis

    return redis.Redis.from_url(h.url(DB[half]))


def _job_id(jobs: Path, job: str) -> str:
    return str(json.loads((jobs / job / ".sciencebench" / "job.json").read_text())["job_id"])


def _pulls(engine: Engine) -> list[dict[str, Any]]:
    path = sb.pull_log_path(engine.state_dir)
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [entry for entry in lines if "event" not in entry]


def _measure(half: str, work: Path, engines: list[Engine], codes: dict[str, int]) -> dict[str, Any]:
    runs = [json.loads(line) for line in (work / "fake-pier.jsonl").read_text().splitlines() if line.strip()]
    jobs = work / "jobs"
    by_job: dict[str, list[dict[str, Any]]] = {}
    for job in ATTEMPTS:
        scope = f"/{_job_id(jobs, job)}/"
        by_job[job] = [r for r in runs if scope in r["argv"][r["argv"].index("--jobs-dir") + 1]]
    submitted = {job: (jobs / job / ".sciencebench" / "job.json").stat().st_mtime for job in ATTEMPTS}
    end = max(_wall(r["wall_end"]) for r in runs)
    first_b = min(_wall(r["wall_start"]) for r in by_job["camp-b"])
    end_b = max(_wall(r["wall_end"]) for r in by_job["camp-b"])
    pulls = {engine.name: _pulls(engine) for engine in engines}
    return {
        "submit_exit": codes,
        "trials": {job: len(r) for job, r in by_job.items()},
        "makespan_s": round(end - submitted["camp-a"], 2),
        "b_wait_s": round(first_b - submitted["camp-b"], 2),
        "b_makespan_s": round(end_b - submitted["camp-b"], 2),
        "pulls_per_host": {name: len(entries) for name, entries in pulls.items()},
        "pull_log": pulls,
    }


def bound(
    halves: dict[str, dict[str, Any]], images: dict[str, str], tasks: dict[str, float]
) -> dict[str, Any]:
    """The lower bound of either half: one pull of each image (its fastest measured pull) and every trial."""
    fastest: dict[str, float] = {}
    for half in halves.values():
        for entries in half["pull_log"].values():
            for entry in entries:
                fastest[entry["digest"]] = min(fastest.get(entry["digest"], float("inf")), entry["seconds"])
    pull = {task: fastest.get(ref.rpartition("@")[2], 0.0) for task, ref in images.items()}
    work = sum(tasks[t] * sum(ATTEMPTS.values()) for t in tasks) + sum(pull.values())
    longest = max(pull[t] + tasks[t] for t in tasks)
    return {"bound_s": round(max(longest, work / (HOSTS * SLOTS)), 2), "pull_s": pull,
            "work_slot_s": round(work, 2), "longest_s": round(longest, 2)}  # fmt: skip


def campaign(h: Harness) -> dict[str, Any]:
    """Both halves on fresh Engines, the images pushed once; the raw results."""
    published = Published(h.registry)
    try:
        kit = published.unique("campaign-kit", size=4096)
        images = {
            f"{i + 1:03d}": published.unique(f"campaign-{i + 1:03d}", size=mb << 20)
            for i, mb in enumerate(IMAGE_MB)
        }
        tasks = durations()
        path = h.selection("sel-campaign", {t: {"sleep_sec": d} for t, d in tasks.items()},
                           agent_image=images, verifier_image=images)  # fmt: skip
        halves: dict[str, dict[str, Any]] = {}
        for half in HALVES:
            names = [f"h{i}" for i in range(HOSTS)]
            with private_engines(names, h.work / f"engines-{half}", h.registry, proxy_image=kit) as engines:
                halves[half] = run_half(h, half, path, engines)
    finally:
        published.cleanup()
    limit = bound(halves, images, tasks)
    for half in halves.values():
        half["makespan_over_bound"] = round(half["makespan_s"] / limit["bound_s"], 3)
        half["pulls_total"] = sum(half["pulls_per_host"].values())
    sizes = dict(zip(tasks, IMAGE_MB, strict=True))
    return {"halves": halves, "bound": limit, "durations_s": tasks, "image_mb": sizes, "images": len(images),
            "hosts": HOSTS, "slots": SLOTS}  # fmt: skip


def measure(h: Harness, p: Params) -> Outcome:
    """Item 10's figures: makespan over bound, pulls per host and B's wait, placed and unplaced."""
    found = Findings()
    with found.kept_on_crash():
        if h.workers:
            h.stop_workers()
        raw = campaign(h)
        for half in raw["halves"].values():
            half.pop("pull_log")
        found.raw["campaign"] = raw
        placed, unplaced = raw["halves"]["placed"], raw["halves"]["unplaced"]
        n = raw["images"]
        for name, half in (("placed", placed), ("unplaced", unplaced)):
            per_host = sorted(half["pulls_per_host"].values())
            detail = (f"makespan {half['makespan_s']} s over bound {raw['bound']['bound_s']} s; "
                      f"pulls per host {per_host} of {n} images; exits {half['submit_exit']}")  # fmt: skip
            found.figure(f"campaign_{name}_makespan_over_bound", half["makespan_over_bound"], detail=detail)
            found.figure(f"campaign_{name}_pulls", half["pulls_total"], detail=f"{n} images, {HOSTS} hosts")
            found.figure(
                f"campaign_{name}_b_wait_s", half["b_wait_s"], detail="B's submit to its first start"
            )
    return found.outcome()


def main(argv: list[str] | None = None) -> int:
    """The campaign alone, printed as JSON."""
    import argparse
    import shutil
    import tempfile

    from bench.harness import load_host_env

    parser = argparse.ArgumentParser(prog="python -m bench.campaign", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)

    load_host_env()
    work = Path(tempfile.mkdtemp(prefix="sciencebench-campaign-"))
    h = Harness(work)
    try:
        h.start()
        raw = campaign(h)
    finally:
        h.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for half in raw["halves"].values():
        half.pop("pull_log")
    print(json.dumps(raw, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
