"""Helpers of the reliability tier: waiting, reading what a job left, measuring.

Other sessions may run tests on the same machine (and the same Docker
Engine) at the same time, so every probe here is scoped to this test's own
directories: processes by their command line naming our jobs directory,
Docker objects by the compose projects of our trials.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

# name -> JSON-able figure, printed at the end of the run (see conftest.py).
FIGURES: dict[str, Any] = {}


def figure(name: str, value: Any) -> None:
    FIGURES[name] = value


def spread(values: list[float]) -> dict[str, float]:
    """min / median / max of a list of seconds, rounded for the report."""
    return {
        "n": len(values),
        "min": round(min(values), 2),
        "median": round(statistics.median(values), 2),
        "max": round(max(values), 2),
    }


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> float:
    """Poll until `predicate()` is truthy; return the seconds it took."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# --- what a job left on disk ---------------------------------------------------------


def records(job_dir: Path) -> dict[str, dict[str, Any]]:
    """Trial records by `<task>-<attempt>` (the file stem)."""
    trials = job_dir / ".sciencebench" / "trials"
    return {p.stem: json.loads(p.read_text()) for p in sorted(trials.glob("*.json"))}


def summary_rows(job_dir: Path) -> list[dict[str, str]]:
    with (job_dir / "summary.csv").open() as handle:
        return list(csv.DictReader(handle))


def trial_dirs(job_dir: Path) -> list[str]:
    return sorted(p.name for p in job_dir.iterdir() if p.is_dir() and p.name.startswith("task_"))


def dir_bytes(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


# --- processes -------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    argv: list[str]

    def option(self, name: str) -> str:
        return self.argv[self.argv.index(name) + 1]

    @property
    def task(self) -> str:
        return Path(self.option("--path")).name


def _proc(pid: int) -> Proc | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in field 2 may hold spaces: the ppid follows the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    args = [a.decode(errors="replace") for a in argv if a]
    if len(args) == 1:
        # A process title (a warm Pier from the zygote) is argv joined by spaces.
        args = args[0].split()
    return Proc(pid=pid, ppid=int(fields[1]), argv=args)


def job_id_of(job_dir: Path) -> str:
    """The job id of a submitted job (its `.sciencebench/job.json`)."""
    return str(json.loads((job_dir / ".sciencebench" / "job.json").read_text())["job_id"])


def job_scratch(job_dir: Path, state_dir: Path) -> Path:
    """The job's host-local scratch on a worker whose state directory is `state_dir` (its default scratch)."""
    return state_dir / "scratch" / job_id_of(job_dir)


def pier_procs(job_dir: Path, marker: str = "run") -> list[Proc]:
    """Live Pier (real or fake) processes of the job of `job_dir` (their `--jobs-dir` is in its scratch)."""
    if not (job_dir / ".sciencebench" / "job.json").is_file():
        return []  # not submitted yet: nothing of it runs
    scope = f"/scratch/{job_id_of(job_dir)}/"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        proc = _proc(int(entry))
        if proc is None or marker not in proc.argv or "--jobs-dir" not in proc.argv:
            continue
        if scope in proc.option("--jobs-dir") and any("pier" in a for a in proc.argv[:2]):
            found.append(proc)
    return found


def fake_pier_completions(runs: list[dict[str, Any]], job_dir: Path) -> list[dict[str, Any]]:
    """FAKE_PIER_LOG entries (completed fake Pier runs) of the job of `job_dir`."""
    marker = f"/scratch/{job_id_of(job_dir)}/"
    return [r for r in runs if marker in r["argv"][r["argv"].index("--jobs-dir") + 1]]


# --- Redis -----------------------------------------------------------------------------


def redis_dump(url: str) -> dict[str, Any]:
    """Every key with its type and value: a snapshot to compare before and after."""
    client = redis.Redis.from_url(url)
    dump: dict[str, Any] = {}
    for key in client.scan_iter(count=1000):
        raw_kind = client.type(key)
        kind = raw_kind.decode() if isinstance(raw_kind, bytes) else str(raw_kind)
        value: Any
        if kind == "string":
            value = client.get(key)
        elif kind == "hash":
            value = sorted(client.hgetall(key).items())
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        else:
            value = None
        dump[key.decode(errors="replace") if isinstance(key, bytes) else key] = (kind, value)
    client.close()
    return dump


def job_keys(url: str, job_dir: Path) -> list[str]:
    """Every Redis key of the job in `job_dir` (keyed by its submit's job id)."""
    job_id = json.loads((job_dir / ".sciencebench" / "job.json").read_text())["job_id"]
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return sorted(client.scan_iter(match=f"sciencebench:{job_id}:*", count=1000))
    finally:
        client.close()
