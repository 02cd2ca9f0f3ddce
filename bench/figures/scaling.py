"""Item 6: throughput with 2 worker processes / with 1 (2 slots each), item 1's informative workload."""

from __future__ import annotations

import statistics

from bench.figures.schedule import Workload, forget_history, lower_bound
from bench.harness import Harness
from bench.params import SLOTS, Params
from bench.report import Findings, Outcome


def measure(h: Harness, p: Params, w: Workload, two_workers_s: list[float]) -> Outcome:
    """scaling_1_to_2: stops all but the first worker and reruns item 1's informative job `p.repeats` times.

    `two_workers_s` are item 1's makespans of the same job on 2 workers (empty
    when item 1 failed); the figure is the median of the paired ratios.
    """
    found = Findings()
    with found.kept_on_crash():
        if len(h.workers) > 1:
            h.stop_workers(h.workers[1:])
        ones, errored = [], 0
        for i in range(1, p.repeats + 1):
            forget_history(h)  # ordered by timeouts, as item 1's runs
            run = h.submit(w.path, f"sched-1w-{i}", n_concurrent=SLOTS)
            ones.append(run.wall_s)
            errored += run.answer["n_errored_trials"]
        found.raw["scaling"] = {
            "makespans_1_worker_s": ones,
            "makespans_2_workers_s": two_workers_s,
            "lower_bound_1_worker_s": lower_bound(w.durations, SLOTS // 2),
            "errored": errored,
        }
        if not two_workers_s:
            found.figure("scaling_1_to_2", None, ">= 1.9", False, "no 2-worker makespan (item 1 failed)")
            return found.outcome()
        twos = [two_workers_s[k % len(two_workers_s)] for k in range(len(ones))]
        ratios = [one / two for one, two in zip(ones, twos, strict=True)]
        ratio = statistics.median(ratios)
        found.figure(
            "scaling_1_to_2",
            ratio,
            ">= 1.9",
            ratio >= 1.9,
            f"median makespan 1 worker {statistics.median(ones):.2f} s / 2 workers "
            f"{statistics.median(two_workers_s):.2f} s (throughput ratio; paired by repetition)",
            samples=ratios,
        )
    return found.outcome()
