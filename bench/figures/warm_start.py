"""Item 7: the harness stage of trivial real trials with Pier forked warm / started cold.

The same trivial real trials (nop agent, one at a time) with Pier forked by
the worker's zygote and with Pier exec'd (SCIENCEBENCH_WARM_PIER=0). One worker
per mode; in the full run each mode's first trial is a warm-up (the zygote may
still be importing Pier when the worker is ready). The figure is the median of
the harness stages' ratios paired by attempt (warm n / cold n).
"""

from __future__ import annotations

import json
import statistics

from bench import sb
from bench.harness import Harness
from bench.params import Params
from bench.report import Findings, Outcome


def measure(h: Harness, p: Params) -> Outcome:
    """warm_start_harness_ratio: mean harness stage warm / cold (a raw figure, no goal)."""
    found = Findings()
    with found.kept_on_crash():
        demo = sb.build_demo_selection(h.work / "demo-warm", h.base_image, h.registry)
        harness: dict[str, list[float]] = {}
        walls: dict[str, float] = {}
        for mode, flag in (("cold", "0"), ("warm", "1")):
            h.stop_workers()
            env = h.env(SCIENCEBENCH_STATE_DIR=str(h.pull_state), SCIENCEBENCH_WARM_PIER=flag)
            h.pull_state.mkdir(parents=True, exist_ok=True)
            worker = h.start_workers(1, 1, env=env, pier_bin="pier")[0]
            job = f"start-{mode}"
            skip = 1 if p.warm_warmup else 0
            attempts = skip + p.warm_trials
            run = h.submit(demo, job, n_concurrent=1, n_attempts=attempts, agent="nop",
                           task_id="001", timeout=1800)  # fmt: skip
            h.stop_workers([worker])
            records = [json.loads(t.read_text()) for t in sorted(h.trials_dir(job).glob("001-*.json"))]
            failed = [rec.get("exception_type") for rec in records if rec.get("exception_type")]
            if failed:
                found.errors[f"warm_start_{mode}"] = f"{len(failed)} trials failed: {failed[:3]}"
            harness[mode] = [rec["timings_sec"]["harness"] for rec in records if rec["attempt"] > skip]
            walls[mode] = run.wall_s
        cold, warm = statistics.mean(harness["cold"]), statistics.mean(harness["warm"])
        ratios = [w / c for w, c in zip(harness["warm"], harness["cold"], strict=False)]
        found.raw["warm_start"] = {"trials_per_mode": p.warm_trials, "harness_sec": harness,
                                   "job_wall_s": walls, "paired_ratios": ratios}  # fmt: skip
        found.figure(
            "warm_start_harness_ratio",
            statistics.median(ratios),
            detail=f"harness stage of a trivial real trial (nop, one at a time): warm {warm:.2f} s vs "
            f"cold {cold:.2f} s (means of {p.warm_trials}; {cold - warm:.2f} s saved per trial); the "
            "figure is the median of the ratios paired by attempt",
            samples=ratios,
        )
    return found.outcome()
