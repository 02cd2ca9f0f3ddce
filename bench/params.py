"""The benchmark's sizes: FULL (bench/results.json, docs/performance.md) and QUICK (a smoke run)."""

from __future__ import annotations

from dataclasses import dataclass

SLOTS = 4  # 2 workers x 2 slots


@dataclass(frozen=True)
class Params:
    """How big and how careful one run is; every figure module reads its share."""

    quick: bool
    # Item 1/6: per-trial durations (s). Longest-first list scheduling packs
    # both sets exactly onto 4 and onto 2 slots, so the lower bound is
    # reachable and the ratio measures the system, not bin-packing luck.
    durations: list[float]
    overhead_tasks: int
    overhead_attempts: int
    bare_reference_n: int
    scale_tasks: int
    scale_attempts: int
    pull_trials: int
    pull_sleep_sec: float
    real_warmup: bool
    # Quick mode runs the direct `pier run` and the worker's trial at the same
    # time (both mostly wait on Docker) and skips the bare chord variant with
    # task-sent events; the full run does neither.
    real_concurrent: bool
    bare_events_variant: bool
    scale_repeats: int
    stock_submit: bool
    scale_tasks_variant: int  # also submit this many tasks x 1 attempt (0: not)
    warm_trials: int  # item 7: measured trials per start mode
    warm_warmup: bool  # item 7: one unmeasured trial first (the zygote imports Pier meanwhile)
    real_scaling_trials: int  # item 8: real trials per run (demo selection: 2 tasks x trials/2 attempts)
    real_scaling_repeats: int  # item 8: paired runs (1 container, 2 containers), alternating order


FULL = Params(
    quick=False,
    durations=[20, 18, 17, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 4, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1],
    overhead_tasks=50,
    overhead_attempts=4,
    bare_reference_n=1000,
    scale_tasks=1000,
    scale_attempts=10,
    pull_trials=8,
    pull_sleep_sec=2.0,
    real_warmup=True,
    real_concurrent=False,
    bare_events_variant=True,
    scale_repeats=2,
    stock_submit=True,
    scale_tasks_variant=10000,
    warm_trials=6,
    warm_warmup=True,
    real_scaling_trials=8,
    real_scaling_repeats=3,
)
QUICK = Params(
    quick=True,
    durations=[3, 2.5, 2, 2, 1.5, 1, 1, 1, 0.5, 0.5, 0.5, 0.5],
    overhead_tasks=10,
    overhead_attempts=4,
    bare_reference_n=40,
    scale_tasks=100,
    scale_attempts=10,
    pull_trials=8,
    pull_sleep_sec=1.0,
    real_warmup=False,
    real_concurrent=True,
    bare_events_variant=False,
    scale_repeats=1,
    stock_submit=False,
    scale_tasks_variant=0,
    warm_trials=1,
    warm_warmup=False,
    real_scaling_trials=4,
    real_scaling_repeats=1,
)
