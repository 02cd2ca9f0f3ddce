"""Item 6: throughput with 2 worker processes / with 1 (2 slots each), same workload as item 1."""

from __future__ import annotations

from pathlib import Path

from bench.harness import Harness
from bench.params import SLOTS, Params
from bench.report import Findings, Outcome


def measure(
    h: Harness, p: Params, sel: Path, durations: dict[str, float], two_workers_s: float | None
) -> Outcome:
    """scaling_1_to_2: stops all but the first worker and reruns item 1's job.

    `two_workers_s` is item 1's makespan (None when item 1 failed).
    """
    found = Findings()
    with found.kept_on_crash():
        if len(h.workers) > 1:
            h.stop_workers(h.workers[1:])
        run = h.submit(sel, "sched-1w", n_concurrent=SLOTS)
        values = list(durations.values())
        one, two = run.wall_s, two_workers_s
        found.raw["scaling"] = {
            "makespan_1_worker_s": one,
            "makespan_2_workers_s": two,
            "lower_bound_1_worker_s": max(max(values), sum(values) / 2),
            "errored": run.answer["n_errored_trials"],
        }
        if two is None:
            found.figure("scaling_1_to_2", None, ">= 1.9", False, "no 2-worker makespan (item 1 failed)")
            return found.outcome()
        ratio = one / two
        found.figure(
            "scaling_1_to_2",
            ratio,
            ">= 1.9",
            ratio >= 1.9,
            f"makespan 1 worker {one:.2f} s / 2 workers {two:.2f} s (throughput ratio)",
        )
    return found.outcome()
