"""The fair-share soak: two users' jobs compete on a cluster whose hosts die and whose broker restarts.

    .venv/bin/python -m bench.soak                  5,000 trials, 6 workers x 2 slots (about 15 minutes)
    .venv/bin/python -m bench.soak --trials 500     a tenth of it

Not part of CI nor of `bench.run`. A private redis-server (AOF on), real
`sciencebench worker` processes running the fake Pier, two `submit --wait`
followers (users alice and bob, half the trials each, heavy-ish durations).
While they run, workers chosen at random are SIGKILLed with their pool and
Pier (a host dying mid-trial) and replaced by a fresh one, and the broker is
restarted once, halfway. Printed (and written as JSON with `--out`):

- lost: trials with no completed fake Pier run; run_twice: trials with more
  than one (counted from the fake Pier's own log: its `--jobs-dir` names the
  job id and the trial, never from sciencebench's records); both 0.
  `ended_before_kill` counts the twice-run trials whose first run ended at
  most KILL_WINDOW_SEC before a kill of its host: Pier had finished, the
  host died before the trial's record was written, so the trial ran again;
- each user's part of the busy slot time while both jobs had work, and its
  deviation from the equal share (goal: within 10 %), over the whole window
  and the worst 30-second window;
- Redis memory (INFO used_memory) with the workers up before the jobs, and
  after both jobs finished;
- dead runs: what the workers' logs say they did with the runs killed workers
  left (`worker.recovery`): committed (Pier had ended), put in place (the
  record was stored), run again (Pier had not ended), kept for a later pass
  (a process still worked in it), no claim (killed before its claim), other.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

from bench.harness import REPO, load_host_env
from tests.fixtures.selection import make_selection
from tests.fixtures.services import FAKE_PIER, VENV_BIN, RedisServer, Worker

LEASE_SECONDS = 3.0
TASKS_PER_JOB = 50
USERS = {"soak-a": "alice", "soak-b": "bob"}
# `<scratch>/<job id>/<task>-<attempt>.<owner>/try-<n>`: the fake Pier's --jobs-dir.
SCRATCH = re.compile(r"/([^/]+)/([^/]+-\d+)\.[^/]+/try-\d+$")
WINDOW_SEC = 30.0
KILL_WINDOW_SEC = 3.0


@dataclass
class Soak:
    """The soak's processes and files."""

    work: Path
    workers_wanted: int
    slots: int
    redis: RedisServer = field(init=False)
    workers: list[Worker] = field(default_factory=list)
    started: int = 0

    def __post_init__(self) -> None:
        self.redis = RedisServer(self.work / "redis")

    @property
    def log(self) -> Path:
        return self.work / "fake-pier.jsonl"

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SCIENCEBENCH_BROKER_URL=self.redis.url,
            SCIENCEBENCH_LEASE_SECONDS=str(LEASE_SECONDS),
            SCIENCEBENCH_STATE_DIR=str(self.work / "host-state"),
            FAKE_PIER_LOG=str(self.log),
            SCIENCEBENCH_PIER_ENV="FAKE_PIER_LOG",
            LITELLM_LOCAL_MODEL_COST_MAP="True",
            # The hosts it simulates run fake trials that hold nothing: their slots, not the machine's
            # cores and memory, bound them (`worker --cpus`, `--memory`).
            SCIENCEBENCH_CPUS="1024",
            SCIENCEBENCH_MEMORY="4T",
            PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        )
        env.update(extra)
        return env

    def start_worker(self, wait: bool = True) -> Worker:
        worker = Worker(f"s{self.started}", self.env(), self.work, self.slots, ["--pier-bin", str(FAKE_PIER)])
        self.started += 1
        worker.start()
        if wait:
            worker.wait_ready(timeout=180)
        self.workers.append(worker)
        return worker

    def used_memory(self) -> int:
        client = redis.Redis.from_url(self.redis.url)
        try:
            return int(client.info("memory")["used_memory"])
        finally:
            client.close()

    def completions(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.redis.stop()


def key_kinds(soak: Soak) -> dict[str, int]:
    """The broker's keys after the jobs, counted by shape (job ids and trial keys replaced by J and K)."""
    client = redis.Redis.from_url(soak.redis.url, decode_responses=True)
    try:
        shapes: Counter[str] = Counter()
        for key in client.scan_iter(count=1000):
            shape = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "J", key)
            shapes[re.sub(r"\d{3}#\d+", "K", shape)] += 1
        return dict(shapes.most_common(20))
    finally:
        client.close()


def selection(root: Path, prefix: str, rng: random.Random, base_image: str) -> Path:
    """TASKS_PER_JOB fake tasks (ids `<prefix>NN`), log-normal durations around 0.5 s, capped at 4 s."""
    ids = [f"{prefix}{i:02d}" for i in range(TASKS_PER_JOB)]
    path = make_selection(root, ids, agent_image=base_image, verifier_image=base_image)
    for task in ids:
        sleep = min(4.0, 0.5 * rng.lognormvariate(0, 0.6))
        (path / f"task_{task}" / "fake.json").write_text(json.dumps({"sleep_sec": round(sleep, 3)}))
    return path


def submit(soak: Soak, path: Path, job: str, attempts: int, cap: int) -> subprocess.Popen[bytes]:
    user = USERS[job]
    argv = [str(VENV_BIN / "sciencebench"), "submit", "--path", str(path), "--agent", "nop",
            "--jobs-dir", str(soak.work / "jobs"), "--job-name", job, "--wait",
            "--n-attempts", str(attempts), "--n-concurrent", str(cap)]  # fmt: skip
    out = (soak.work / f"{job}.submit.log").open("wb")
    return subprocess.Popen(argv, env=soak.env(USER=user, LOGNAME=user), cwd=soak.work,
                            stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def job_id(soak: Soak, job: str) -> str:
    return str(json.loads((soak.work / "jobs" / job / ".sciencebench" / "job.json").read_text())["job_id"])


def runs_keys(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each completed fake Pier run's (job id, `<task>-<attempt>`), from its own --jobs-dir."""
    keys = []
    for run in runs:
        argv = run["argv"]
        found = SCRATCH.search(argv[argv.index("--jobs-dir") + 1])
        keys.append((found.group(1), found.group(2)) if found else ("", ""))
    return keys


def runs_per_trial(runs: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """Completed fake Pier runs per (job id, `<task>-<attempt>`)."""
    return Counter(runs_keys(runs))


def busy(runs: list[dict[str, Any]], start: float, end: float) -> float:
    """Slot-seconds the runs spent inside [start, end]."""
    return sum(max(0.0, min(r["end"], end) - max(r["start"], start)) for r in runs)


def shares(by_job: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each job's part of the busy slot time while both had work (later first start to earlier last start)."""
    start = max(min(r["start"] for r in runs) for runs in by_job.values())
    end = min(max(r["start"] for r in runs) for runs in by_job.values())
    whole = {job: busy(runs, start, end) for job, runs in by_job.items()}
    total = sum(whole.values()) or 1.0
    parts = {job: value / total for job, value in whole.items()}
    worst = 0.0
    t = start
    while t + WINDOW_SEC <= end:
        window = {job: busy(runs, t, t + WINDOW_SEC) for job, runs in by_job.items()}
        if sum(window.values()) > 0:
            worst = max(worst, max(abs(v / sum(window.values()) - 0.5) / 0.5 for v in window.values()))
        t += WINDOW_SEC
    return {
        "window_sec": round(end - start, 1),
        "part": {job: round(p, 4) for job, p in parts.items()},
        "deviation": round(max(abs(p - 0.5) / 0.5 for p in parts.values()), 4),
        f"worst_{WINDOW_SEC:.0f}s_window_deviation": round(worst, 4) if end - start >= WINDOW_SEC else None,
    }


def chaos(soak: Soak, followers: dict[str, subprocess.Popen[bytes]], total: int, kills: int,
          rng: random.Random, timeout: float) -> dict[str, Any]:  # fmt: skip
    """Kill random hosts at random points of the progress (fresh ones replace them); restart the broker."""
    kill_at = sorted(rng.uniform(0.1, 0.9) for _ in range(kills))
    restart_at, restarted = 0.5, None
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while any(f.poll() is None for f in followers.values()):
        if time.monotonic() > deadline:  # a job that never finishes: stop following, audit what ran
            for follower in followers.values():
                if follower.poll() is None:
                    follower.kill()
                    follower.wait()
            return {"events": events, "timed_out_sec": timeout}
        done = len(soak.completions()) / total
        if kill_at and done >= kill_at[0]:
            # A moment not tied to a completion: the log grows as runs end, and a host killed just
            # after its Pier ended (before the trial's record) must run it again (`ended_before_kill`).
            kill_at.pop(0)
            time.sleep(rng.uniform(0.0, 2.0))
            victim = rng.choice([w for w in soak.workers if w.proc and w.proc.poll() is None])
            victim.kill_all()
            soak.workers.remove(victim)
            soak.start_worker(wait=False)
            events.append({"kill": victim.name, "at_progress": round(done, 3), "wall": time.time()})
        if restarted is None and done >= restart_at:
            t0 = time.monotonic()
            soak.redis.restart()
            restarted = round(time.monotonic() - t0, 2)
            events.append({"broker_restart_sec": restarted, "at_progress": round(done, 3)})
        time.sleep(0.2)
    return {"events": events}


def main(argv: list[str] | None = None) -> int:
    """Run the soak; 1 when a trial was lost or ran twice."""
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trials", type=int, default=5000, help="trials of both jobs together (default 5000)"
    )
    parser.add_argument("--workers", type=int, default=6, help="worker hosts (default 6)")
    parser.add_argument("--slots", type=int, default=2, help="slots per worker (default 2)")
    parser.add_argument("--kills", type=int, help="worker SIGKILLs (default: one per 250 trials, at least 2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the results here as JSON")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (kept anyway on a failure)"
    )
    args = parser.parse_args(argv)
    attempts = max(1, args.trials // (2 * TASKS_PER_JOB))
    total = 2 * TASKS_PER_JOB * attempts
    kills = args.kills if args.kills is not None else max(2, total // 250)
    rng = random.Random(args.seed)

    load_host_env()
    work = Path(tempfile.mkdtemp(prefix="sciencebench-soak-"))
    soak = Soak(work, args.workers, args.slots)
    followers: dict[str, subprocess.Popen[bytes]] = {}
    base_image = os.environ["SB_BASE_IMAGE"]
    try:
        soak.redis.start()
        for _ in range(args.workers):
            soak.start_worker(wait=False)
        for worker in soak.workers:
            worker.wait_ready(timeout=180)
        memory_before = soak.used_memory()
        cap = args.workers * args.slots
        paths = {job: selection(work / f"sel-{job}", str(i), rng, base_image)
                 for i, job in enumerate(USERS)}  # fmt: skip
        t0 = time.monotonic()
        followers.update({job: submit(soak, paths[job], job, attempts, cap) for job in USERS})
        print(f"soak: {total} trials ({attempts} attempts x {TASKS_PER_JOB} tasks x 2 jobs), "
              f"{args.workers} workers x {args.slots} slots, {kills} kills, one broker restart; in {work}",
              flush=True)  # fmt: skip
        chaos_log = chaos(soak, followers, total, kills, rng, timeout=max(600.0, total * 1.0))
        wall = time.monotonic() - t0
        time.sleep(2 * LEASE_SECONDS)  # retired jobs' keys go at their finalizer; leases lapse
        memory_after = soak.used_memory()
        keys_after = key_kinds(soak)
        kill_walls = [e["wall"] for e in chaos_log["events"] if "kill" in e]
        results = audit(soak, followers, total, kill_walls)
        results.update(chaos_log, wall_s=round(wall, 1), trials=total, workers=args.workers,
                       slots=args.slots, kills=kills,
                       redis_used_memory={"before": memory_before, "after": memory_after},
                       keys_after=keys_after)  # fmt: skip
    finally:
        for follower in followers.values():
            if follower.poll() is None:
                follower.kill()
        soak.close()
    ok = results["lost"] == 0 and results["run_twice"] == 0 and not any(results["submit_exit"].values())
    if not ok:  # what the followers said, and the work directory kept to look into
        results["submit_tail"] = {job: (work / f"{job}.submit.log").read_text(errors="replace")[-3000:]
                                  for job in USERS}  # fmt: skip
        results["work_dir"] = str(work)
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    if ok and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


DEAD_RUN_KINDS = {
    "its record is committed": "committed",
    "its files are put in place": "put_in_place",
    "its Pier run had not ended": "run_again",
    "looked at again later": "kept_for_a_later_pass",
    "no claim": "no_claim",
}


def dead_runs(soak: Soak) -> dict[str, int]:
    """What the workers did with the runs of killed workers, from their `dead run:` log lines."""
    kinds: Counter[str] = Counter()
    for log in sorted(soak.work.glob("s*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "dead run: " in line:
                kinds[next((k for p, k in DEAD_RUN_KINDS.items() if p in line), "other")] += 1
    return dict(kinds)


def ended_before_kill(runs: list[dict[str, Any]], twice: list[tuple[str, str]], kills: list[float]) -> int:
    """Twice-run trials whose first run ended at most KILL_WINDOW_SEC before a host kill."""
    first_end: dict[tuple[str, str], float] = {}
    for key, run in zip(runs_keys(runs), runs, strict=True):
        if key in twice:
            end = datetime.fromisoformat(run["wall_end"]).timestamp()
            first_end[key] = min(first_end.get(key, end), end)
    return sum(any(0 <= k - end <= KILL_WINDOW_SEC for k in kills) for end in first_end.values())


def uncounted(soak: Soak, ids: dict[str, str]) -> dict[str, list[str]]:
    """Per job, trials with a record in the store that the chord was never told of (no counted mark)."""
    client = redis.Redis.from_url(soak.redis.url, decode_responses=True)
    try:
        found = {}
        for job, jid in ids.items():
            prefix = f"sciencebench:{jid}:"
            results = {k.removeprefix(prefix + "result:") for k in client.scan_iter(f"{prefix}result:*")}
            counted = {k.removeprefix(prefix + "counted:") for k in client.scan_iter(f"{prefix}counted:*")}
            found[job] = sorted(results - counted)
        return found
    finally:
        client.close()


def audit(
    soak: Soak, followers: dict[str, subprocess.Popen[bytes]], total: int, kills: list[float]
) -> dict[str, Any]:
    """Lost and twice-run trials (the fake Pier's log), the followers' exit codes, the shares."""
    runs = soak.completions()
    counts = runs_per_trial(runs)
    ids = {job: job_id(soak, job) for job in USERS}
    by_job = {job: [r for r in runs if f"/{ids[job]}/" in r["argv"][r["argv"].index("--jobs-dir") + 1]]
              for job in USERS}  # fmt: skip
    seen = {job: {key for (jid, key) in counts if jid == ids[job]} for job in USERS}
    expected = total // 2
    twice = [key for key, n in counts.items() if n > 1]
    return {
        "lost": sum(expected - len(keys) for keys in seen.values()),
        "run_twice": len(twice),
        "run_twice_keys": [f"{jid[:8]}/{key}" for jid, key in twice],
        "ended_before_kill": ended_before_kill(runs, twice, kills),
        "submit_exit": {job: f.returncode for job, f in followers.items()},
        "recorded_not_counted": uncounted(soak, ids),
        "dead_runs": dead_runs(soak),
        "share": shares(by_job),
    }


if __name__ == "__main__":
    sys.exit(main())
