"""Item 2: orchestration overhead per trial, against a bare Celery chord of no-op tasks.

No-op trials on 2 workers x 2 slots: (wall x slots - summed wall of the fake
Pier processes) / trials, against a bare Celery chord of no-op tasks on
2 x 2 prefork workers of the same Redis.
"""

from __future__ import annotations

import time
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
        run = h.submit(sel, JOB, n_concurrent=SLOTS, n_attempts=attempts)
        runs = pier_runs(h, JOB)
        logged = sum(x["end"] - x["start"] for x in runs)
        untimed = sum(1 for x in runs if x["startup"] is None)
        # Each Pier process from its true start (wrapper record) to its last log line.
        pier_total = sum(x["process_s"] for x in runs) + idle_startup * untimed
        startup = (pier_total - logged) / max(len(runs), 1)
        ours = (run.wall_s * SLOTS - pier_total) / n
        ours_logged_only = (run.wall_s * SLOTS - logged) / n
        if untimed:
            found.note(f"{untimed} fake Pier run(s) without a start record: idle start-up assumed")

        bare = bare_chord_overhead(h, n)
        bare_ref = bare_chord_overhead(h, p.bare_reference_n) if p.bare_reference_n != n else bare
        h.stop_bare_workers()
        found.raw["overhead"] = {
            "trials": n,
            "slots": SLOTS,
            "wall_s": run.wall_s,
            "prepare_s": run.prepare_s,
            "dispatch_s": run.dispatch_s,
            "pier_runs": len(runs),
            "pier_logged_sum_s": logged,
            "fake_pier_startup_mean_s": startup,
            "fake_pier_startup_idle_sample_s": idle_startup,
            "pier_total_s": pier_total,
            "overhead_ms_per_trial": ours * 1000,
            "overhead_ms_per_trial_without_fake_startup": ours_logged_only * 1000,
            "bare_chord": bare,
            "bare_chord_reference": bare_ref,
            "errored": run.answer["n_errored_trials"],
        }
        found.figure(
            "overhead_ms_per_trial",
            ours * 1000,
            "< 30 ms",
            ours * 1000 < 30,
            f"{n} trials, wall {run.wall_s:.2f} s x {SLOTS} slots, Pier processes {pier_total:.2f} s "
            f"(incl. their Python start-up, {startup * 1000:.0f} ms each on average)",
        )
        ratio = ours / bare["ms_per_task"] * 1000
        found.figure(
            "overhead_ratio",
            ratio,
            "<= 3",
            ratio <= 3,
            f"bare Celery chord of {n} no-op tasks: {bare['ms_per_task']:.2f} ms/task "
            f"({p.bare_reference_n} tasks: {bare_ref['ms_per_task']:.2f} ms/task)",
        )
    return found.outcome()


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
