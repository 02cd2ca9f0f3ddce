"""Item 3: submit and finalize at 10,000 trials.

`sciencebench submit` of 10,000 trials with no workers, as a whole process,
against a process dispatching a bare 10,000-task chord; `write_summary` over
10,000 trial records (and the `sciencebench summarize` process).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import sb
from bench.harness import REPO, Harness
from bench.measure import run_measured
from bench.params import Params
from bench.report import Findings, Outcome

FINALIZED_JOB = "scale-1"  # the first submitted job: its records are what finalize() summarizes


def trials(p: Params) -> int:
    """How many trials item 3 submits and finalizes."""
    return p.scale_tasks * p.scale_attempts


def _best(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each contender's best (least disturbed) successful run."""
    return {
        key: min((e for e in entries if e["ok"]), key=lambda e: e["wall_s"])
        for key, entries in runs.items()
        if any(e["ok"] for e in entries)
    }


def submit(h: Harness, p: Params) -> Outcome:
    """submit_10k_s, submit_10k_ratio_to_bare_celery, submit_10k_rss_mb (and the 10k-tasks variant).

    Stops every worker first: the submitted trials stay queued.
    """
    import redis

    from tests.fixtures.selection import make_selection

    found = Findings()
    with found.kept_on_crash():
        n = trials(p)
        if h.workers:
            h.stop_workers()
        ids = [f"{i:04d}" for i in range(1, p.scale_tasks + 1)]
        sel = make_selection(h.work / "sel-scale", ids, agent_image=h.base_image, verifier_image=h.base_image)

        def fresh(db: int) -> None:
            redis.Redis.from_url(h.url(db)).flushdb()

        def queued(db: int, queue: str) -> int:
            return int(redis.Redis.from_url(h.url(db)).llen(queue))

        names = iter(f"scale-{k}" for k in range(1, 100))  # a submitted job name cannot be reused

        def submit_args(window: int = n) -> list[str]:
            """With `--n-concurrent` n every trial goes to the broker at once, as the bare chord sends."""
            return ["--path", str(sel), "--n-attempts", str(p.scale_attempts), "--n-concurrent", str(window),
                    "--jobs-dir", str(h.jobs_dir), "--job-name", next(names)]  # fmt: skip

        runs: dict[str, list[dict[str, Any]]] = {}

        def measure(key: str, argv: list[str], db: int, queue: str, cwd: Path, sent: int = n) -> None:
            fresh(db)
            wall, rss, code, out, err = run_measured(argv, h.env(db), cwd=cwd)
            entry = {"wall_s": wall, "rss_mb": rss, "exit_code": code, "queued_messages": queued(db, queue)}
            entry["ok"] = code == 0 and entry["queued_messages"] == sent
            if not entry["ok"]:
                found.errors[f"{key}"] = f"exit {code}, {entry['queued_messages']} queued: {err[-800:]}"
            if key.startswith("bare") and code == 0:
                entry.update(json.loads(out.strip().splitlines()[-1]))
            runs.setdefault(key, []).append(entry)
            fresh(db)

        sciencebench = str(h.venv_bin / "sciencebench")
        bare_argv = [sys.executable, "-m", "bench.bare_dispatch", "--broker", h.url(3), "--n", str(n)]
        # Alternate the contenders, repeated: drift in the machine's load hits them alike.
        if p.scale_tasks_variant:  # the same number of trials as tasks: selection validation x10
            many = [f"{i:05d}" for i in range(1, p.scale_tasks_variant + 1)]
            sel_many = make_selection(
                h.work / "sel-scale-tasks", many, agent_image=h.base_image, verifier_image=h.base_image
            )
        for repeat in range(1, p.scale_repeats + 1):
            measure("submit", [sciencebench, "submit", *submit_args()], 2, "celery", h.work)
            measure("bare_celery_defaults", bare_argv, 3, "bench_noop", REPO)
            if p.bare_events_variant:
                measure("bare_with_sent_events", [*bare_argv, "--events"], 3, "bench_noop", REPO)
            if p.scale_tasks_variant:
                many_args = ["--path", str(sel_many), "--jobs-dir", str(h.jobs_dir),
                             "--job-name", f"scale-tasks-{repeat}"]  # fmt: skip
                measure("submit_tasks_variant", [sciencebench, "submit", *many_args], 2, "celery", h.work)
        if p.stock_submit:  # the default --n-concurrent 1: one trial sent, the others held in the store
            held_argv = [sciencebench, "submit", *submit_args(window=1)]
            measure("submit_held", held_argv, 2, "celery", h.work, sent=1)
        if p.stock_submit:  # the dispatch of before this benchmark, same trials, same run
            stock_argv = [sys.executable, "-m", "bench.stock_submit", *submit_args()]
            measure("submit_stock_chord", stock_argv, 2, "celery", REPO)
        best = _best(runs)
        found.raw["scale"] = {"trials": n, "runs": runs, "best": best}
        _figures(found, p, n, runs, best)
    return found.outcome()


def _paired(runs: dict[str, list[dict[str, Any]]], key: str) -> list[tuple[dict[str, Any], float]]:
    """Each successful run of `key` with the faster bare chord of the same repetition (the yardstick)."""
    pairs = []
    for k, entry in enumerate(runs.get(key, [])):
        bare = [runs[b][k]["wall_s"] for b in ("bare_celery_defaults", "bare_with_sent_events")
                if b in runs and k < len(runs[b]) and runs[b][k]["ok"]]  # fmt: skip
        if entry["ok"] and bare:
            pairs.append((entry, min(bare)))
    return pairs


def _figures(
    found: Findings, p: Params, n: int, runs: dict[str, list[dict[str, Any]]], best: dict[str, dict[str, Any]]
) -> None:
    """The submit figures: medians over the repetitions, ratios paired by repetition."""
    submits = _paired(runs, "submit")
    walls = [entry["wall_s"] for entry, _ in submits]
    rss = [entry["rss_mb"] for entry, _ in submits]
    bare = best["bare_celery_defaults"]
    label = f"{n // 1000}k" if n >= 1000 else str(n)
    stock = best.get("submit_stock_chord")
    held = best.get("submit_held")
    found.figure(
        "submit_10k_s",
        statistics.median(walls),
        None,
        None,
        f"`sciencebench submit` of {n} trials ({p.scale_tasks} tasks x {p.scale_attempts}"
        f" attempts), whole process"
        + (f"; with stock chord dispatch {stock['wall_s']:.2f} s, {stock['rss_mb']:.0f} MB" if stock else "")
        + (f"; with --n-concurrent 1 (1 sent, {n - 1} held) {held['wall_s']:.2f} s" if held else ""),
        samples=walls,
    )
    variant = _paired(runs, "submit_tasks_variant")
    if variant:
        ratios = [entry["wall_s"] / yardstick for entry, yardstick in variant]
        found.figure(
            "submit_10k_tasks_ratio_to_bare_celery",
            statistics.median(ratios),
            None,
            None,
            f"`sciencebench submit` of {p.scale_tasks_variant} tasks x 1 attempt: median "
            f"{statistics.median(e['wall_s'] for e, _ in variant):.2f} s, "
            f"{statistics.median(e['rss_mb'] for e, _ in variant):.0f} MB "
            "(selection validation of every task)",
            samples=ratios,
        )
    with_events = [e["wall_s"] for e in runs.get("bare_with_sent_events", []) if e["ok"]]
    ratios = [entry["wall_s"] / yardstick for entry, yardstick in submits]
    ratio = statistics.median(ratios)
    found.figure(
        "submit_10k_ratio_to_bare_celery",
        ratio,
        "<= 0.5",
        ratio <= 0.5,
        f"bare {label}-task chord process, median "
        f"{statistics.median(e['wall_s'] for e in runs['bare_celery_defaults'] if e['ok']):.2f} s"
        + (f" (with task-sent events {statistics.median(with_events):.2f} s)" if with_events else "")
        + "; ratios paired by repetition, against the faster bare chord of each",
        samples=ratios,
    )
    found.figure(
        "submit_10k_rss_mb",
        statistics.median(rss),
        "< 200 MB",
        statistics.median(rss) < 200,
        f"bare chord process {bare['rss_mb']:.0f} MB",
        samples=rss,
    )


def finalize(h: Harness, p: Params) -> Outcome:
    """finalize_10k_s: write_summary over the first submitted job's records (with trial dirs and
    reward.json), as the finalizer runs it, and the `sciencebench summarize` process."""
    found = Findings()
    with found.kept_on_crash():
        paths = sb.JobPaths(h.jobs_dir, FINALIZED_JOB)
        job = sb.load_job(paths)
        paths.trials_dir.mkdir(parents=True, exist_ok=True)
        written = _write_records(paths, job)
        os.sync()
        argv = [str(h.venv_bin / "sciencebench"), "summarize", "--jobs-dir", str(h.jobs_dir),
                "--job-name", job.job_name]  # fmt: skip
        took, cli = [], []
        for _ in range(p.repeats):  # alternating: in process (what the finalizer runs), then the CLI
            t0 = time.monotonic()
            result = sb.write_summary(job)
            took.append(time.monotonic() - t0)
            cli_wall, cli_rss, cli_code, _, cli_err = run_measured(argv, h.env(2), cwd=h.work)
            cli.append(cli_wall)
            if cli_code != 0:
                found.errors["summarize_cli"] = f"exit {cli_code}: {cli_err[-500:]}"
        found.raw["finalize"] = {
            "records": written,
            "write_summary_s": took,
            "summarize_cli_wall_s": cli,
            "summarize_cli_rss_mb": cli_rss,
            "n_completed": result["stats"]["n_completed_trials"],
        }
        value = statistics.median(took)
        found.figure(
            "finalize_10k_s",
            value,
            "< 5 s",
            value < 5,
            f"write_summary over {written} records; `sciencebench summarize` process, median "
            f"{statistics.median(cli):.2f} s",
            samples=took,
        )
    return found.outcome()


def _write_records(paths: Any, job: Any) -> int:
    """A finished trial record, trial dir and reward.json for every trial of `job`; how many."""
    now = datetime.now(UTC)
    detail = json.dumps(
        {"reward": 1.0, "public": {"passed": 3, "collected": 3}, "private": {"passed": 2, "collected": 2}}
    )
    written = 0
    for task_id in job.task_ids:
        for attempt in range(1, job.n_attempts + 1):
            trial_dir = f"task_{task_id}__{written:07d}"
            (paths.job_dir / trial_dir / "verifier").mkdir(parents=True, exist_ok=True)
            (paths.job_dir / trial_dir / "verifier" / "reward.json").write_text(detail)
            record = sb.TrialRecord(
                job_id=job.job_id,
                job_name=job.job_name,
                task_id=task_id,
                attempt=attempt,
                trial_dir=trial_dir,
                rewards={"reward": 1.0},
                worker="bench",
                patch_collected=True,
                started_at=now,
                finished_at=now,
                timings_sec={"harness": 1.0, "pull": 0.01},
            )
            paths.trial_record(task_id, attempt).write_text(record.model_dump_json())
            written += 1
    return written
