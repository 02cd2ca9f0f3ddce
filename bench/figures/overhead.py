"""Item 2: orchestration overhead per trial, against a bare Celery chord of no-op tasks.

No-op trials on 2 workers x 2 slots: (wall x slots - summed wall of the fake
Pier processes) / trials, against a bare Celery chord of no-op tasks on
2 x 2 prefork workers of the same Redis.
"""

from __future__ import annotations

import json
import statistics
import time
from datetime import datetime
from typing import Any

from bench.harness import Harness
from bench.measure import fake_startup_sec, pier_runs
from bench.params import SLOTS, Params
from bench.report import Findings, Outcome

JOB = "overhead"


def measure(h: Harness, p: Params) -> Outcome:
    """overhead_ms_per_trial and overhead_ratio (the bare workers are stopped afterwards)."""
    found = Findings()
    with found.kept_on_crash():
        n_tasks, attempts = p.overhead_tasks, p.overhead_attempts
        n = n_tasks * attempts
        sel = h.selection("sel-noop", {f"{i:03d}": {"sleep_sec": 0} for i in range(1, n_tasks + 1)})
        idle_startup = fake_startup_sec(h)
        samples: list[dict[str, Any]] = []
        for i in range(1, p.repeats + 1):  # each repetition: our job, then the bare chords, alternating
            job = JOB if i == 1 else f"{JOB}-{i}"
            run = h.submit(sel, job, n_concurrent=SLOTS, n_attempts=attempts)
            runs = pier_runs(h, job)
            logged = sum(x["end"] - x["start"] for x in runs)
            untimed = sum(1 for x in runs if x["startup"] is None)
            # Each Pier process from its true start (wrapper record) to its last log line.
            pier_total = sum(x["process_s"] for x in runs) + idle_startup * untimed
            if untimed:
                found.note(f"{job}: {untimed} fake Pier run(s) without a start record: idle start-up assumed")
            bare = bare_chord_overhead(h, n)
            bare_ref = bare_chord_overhead(h, p.bare_reference_n) if p.bare_reference_n != n else bare
            samples.append({
                "wall_s": run.wall_s,
                "prepare_s": run.prepare_s,
                "dispatch_s": run.dispatch_s,
                "pier_runs": len(runs),
                "pier_logged_sum_s": logged,
                "fake_pier_startup_mean_s": (pier_total - logged) / max(len(runs), 1),
                "pier_total_s": pier_total,
                "overhead_ms_per_trial": (run.wall_s * SLOTS - pier_total) / n * 1000,
                "overhead_ms_per_trial_without_fake_startup": (run.wall_s * SLOTS - logged) / n * 1000,
                "bare_chord": bare,
                "bare_chord_reference": bare_ref,
                "errored": run.answer["n_errored_trials"],
                "stages_ms_per_trial": stage_shares(h, job, runs, (run.wall_s * SLOTS - pier_total) / n),
            })  # fmt: skip
        h.stop_bare_workers()
        found.raw["overhead"] = {
            "trials": n, "slots": SLOTS, "fake_pier_startup_idle_sample_s": idle_startup, "samples": samples,
        }  # fmt: skip
        ours = [s["overhead_ms_per_trial"] for s in samples]
        ratios = [s["overhead_ms_per_trial"] / s["bare_chord"]["ms_per_task"] for s in samples]
        mid = samples[ours.index(sorted(ours)[(len(ours) - 1) // 2])]  # the median repetition (lower middle)
        ms = statistics.median(ours)
        found.figure(
            "overhead_ms_per_trial",
            ms,
            "< 30 ms",
            ms < 30,
            f"{n} trials, median repetition: wall {mid['wall_s']:.2f} s x {SLOTS} slots, Pier processes "
            f"{mid['pier_total_s']:.2f} s (incl. their Python start-up, "
            f"{mid['fake_pier_startup_mean_s'] * 1000:.0f} ms each on average)",
            samples=ours,
        )
        found.note(f"overhead per trial by stage (ms, median repetition): {_stages_text(mid)}")
        ratio = statistics.median(ratios)
        bare_ms = statistics.median(s["bare_chord"]["ms_per_task"] for s in samples)
        ref_ms = statistics.median(s["bare_chord_reference"]["ms_per_task"] for s in samples)
        found.figure(
            "overhead_ratio",
            ratio,
            "<= 3",
            ratio <= 3,
            f"bare Celery chord of {n} no-op tasks: {bare_ms:.2f} ms/task ({p.bare_reference_n} tasks: "
            f"{ref_ms:.2f} ms/task), medians; ratios paired by repetition",
            samples=ratios,
        )
    return found.outcome()


# The worker's own timed stages of a try (`worker.stages.run_try`), in order; `harness` is split below.
WORKER_STAGES = ("snapshot", "workspace", "secrets", "review", "preflight", "pull")


def stage_shares(h: Harness, job: str, runs: list[dict[str, Any]], overhead_s: float) -> dict[str, float]:
    """Each stage's mean share of a no-op trial's overhead (ms per trial), from the trials' records.

    The worker's timed stages as recorded (`timings_sec`); `pier_start`: the
    harness stage less the Pier process itself (spawn or fork, exit, log
    reading); `admission_claim`: the rest of the record's span (admission,
    host check, claim, slot, scratch set-up; `started_at` to `finished_at`);
    `commit_and_dispatch`: what is left of the overhead outside that span
    (the record committed and published, the last try's cleanup after it,
    the chord's answer, the message's way from the broker to a worker process).
    """
    records = [json.loads(path.read_text()) for path in sorted(h.trials_dir(job).glob("*.json"))]
    if not records:
        return {}
    n = len(records)
    shares = {
        stage: sum(r.get("timings_sec", {}).get(stage, 0.0) for r in records) / n * 1000
        for stage in WORKER_STAGES
    }
    harness = sum(r.get("timings_sec", {}).get("harness", 0.0) for r in records) / n
    pier = sum(x["process_s"] for x in runs) / max(len(runs), 1)
    shares["pier_start"] = (harness - pier) * 1000
    span = statistics.fmean(
        (datetime.fromisoformat(r["finished_at"]) - datetime.fromisoformat(r["started_at"])).total_seconds()
        for r in records
    )
    timed = sum(shares.values()) / 1000 + pier
    shares["admission_claim"] = (span - timed) * 1000
    shares["commit_and_dispatch"] = overhead_s * 1000 - sum(shares.values())
    return {key: round(value, 2) for key, value in shares.items()}


def _stages_text(sample: dict[str, Any]) -> str:
    stages = sample.get("stages_ms_per_trial") or {}
    return ", ".join(f"{name} {ms:.1f}" for name, ms in stages.items()) or "no records"


def bare_chord_overhead(h: Harness, n: int) -> dict[str, Any]:
    """A stock chord of n no-op tasks on 2 x 2 bare prefork workers: wall x slots / n."""
    from celery import chord, group

    from bench.noop_app import NOOP, NOOP_FINALIZE

    h.start_bare_workers()
    app = h.bare_app()
    body = app.signature(NOOP_FINALIZE).set(immutable=True)
    chord(group(app.signature(NOOP) for _ in range(8)))(body.clone()).get(timeout=120)  # warm-up
    t0 = time.monotonic()
    result = chord(group(app.signature(NOOP) for _ in range(n)))(body.clone())
    t_sent = time.monotonic()
    result.get(timeout=600, interval=0.05)
    wall = time.monotonic() - t0
    return {"tasks": n, "wall_s": wall, "dispatch_s": t_sent - t0, "ms_per_task": wall * SLOTS / n * 1000}
