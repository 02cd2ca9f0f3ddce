"""Item 1: scheduling efficiency, and the same tasks through Pier's own queue as a baseline.

Synthetic trials (the fake Pier sleeping each task's duration) on 2 workers x
2 slots, `--n-concurrent 4`: makespan / max(longest, sum / 4). Baseline: a real
`pier run -n 4` of the same tasks with bench.sleep_agent and bench.null_env.
"""

from __future__ import annotations

import json
import random
from datetime import datetime
from pathlib import Path

from bench.harness import Harness
from bench.measure import lpt_makespan, pier_runs, run_measured
from bench.params import SLOTS, Params
from bench.report import Findings, Outcome

JOB = "sched-2w"


def selection(h: Harness, p: Params) -> tuple[Path, dict[str, float]]:
    """The scheduling selection (shared with item 6) and each task's duration by task id."""
    durations = list(p.durations)
    random.Random(7).shuffle(durations)  # task order says nothing about length
    ids = [f"{i:03d}" for i in range(1, len(durations) + 1)]
    by_id = dict(zip(ids, durations, strict=True))
    # The agent timeout is what sciencebench orders by (longest expected first).
    path = h.selection(
        "sel-sched",
        {i: {"sleep_sec": d} for i, d in by_id.items()},
        agent_timeout_sec={i: 30.0 * d for i, d in by_id.items()},
    )
    return path, by_id


def warm_up(h: Harness, n: int = 8) -> None:
    """A short unmeasured job, so the first measured one finds warm workers."""
    path = h.selection("sel-warm", {f"{i:03d}": {"sleep_sec": 0.2} for i in range(1, n + 1)})
    h.submit(path, "warmup", n_concurrent=SLOTS)


def lower_bound(durations: dict[str, float], slots: int = SLOTS) -> float:
    """max(longest, sum / slots): no schedule on `slots` slots can be shorter."""
    values = list(durations.values())
    return max(max(values), sum(values) / slots)


def measure(h: Harness, p: Params, sel: Path, durations: dict[str, float]) -> Outcome:
    """makespan_over_lower_bound: the scheduling job on the running 2 x 2 fake-Pier workers."""
    found = Findings()
    with found.kept_on_crash():
        values = list(durations.values())
        lower = lower_bound(durations)
        run = h.submit(sel, JOB, n_concurrent=SLOTS)
        runs = pier_runs(h, JOB)
        span = max(x["end"] for x in runs) - min(x["start"] for x in runs)
        errored = run.answer["n_errored_trials"]
        found.raw["schedule"] = {
            "trials": len(values),
            "durations_s": values,
            "sum_s": sum(values),
            "longest_s": max(values),
            "slots": SLOTS,
            "lower_bound_s": lower,
            "lpt_ideal_s": lpt_makespan(values, SLOTS),
            "makespan_s": run.wall_s,
            "prepare_s": run.prepare_s,
            "dispatch_s": run.dispatch_s,
            "first_pier_start_after_submit_s": min(x["start"] for x in runs) - run.t0,
            "pier_span_s": span,
            "errored": errored,
            "pier_runs": len(runs),
        }
        ratio = run.wall_s / lower
        found.figure(
            "makespan_over_lower_bound",
            ratio,
            "<= 1.05",
            ratio <= 1.05,
            f"makespan {run.wall_s:.2f} s, lower bound {lower:.2f} s, {len(values)} trials",
        )
        if errored or len(runs) != len(values):
            found.note(f"scheduling job: {errored} errored trial(s), {len(runs)} Pier runs for {len(values)}")
    return found.outcome()


def pier_baseline(h: Harness, p: Params, sel: Path, durations: dict[str, float]) -> Outcome:
    """pier_makespan_over_lower_bound: `pier run -n 4`, sleep agent, no containers."""
    found = Findings()
    with found.kept_on_crash():
        lower = lower_bound(durations)
        out = h.work / "pier-jobs"
        argv = [
            str(h.venv_bin / "pier"),
            "run",
            "-p",
            str(sel),
            "-n",
            str(SLOTS),
            "-o",
            str(out),
            "--job-name",
            "sched",
            "--agent-import-path",
            "bench.sleep_agent:SleepAgent",
            "--environment-import-path",
            "bench.null_env:NullEnvironment",
            "--disable-verification",
            "-y",
            "-q",
        ]
        wall, _, code, _, err = run_measured(argv, h.env(), cwd=h.work)
        try:
            result = json.loads((out / "sched" / "result.json").read_text())
            span = (
                datetime.fromisoformat(result["finished_at"]) - datetime.fromisoformat(result["started_at"])
            ).total_seconds()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            found.errors["pier_baseline"] = f"pier run exited {code}: {exc}: {err[-800:]}"
            found.figure("pier_makespan_over_lower_bound", None)
            return found.outcome()
        trials = [json.loads(p.read_text()) for p in (out / "sched").glob("task_*/result.json")]
        agent_sum = sum(
            (
                datetime.fromisoformat(t["agent_execution"]["finished_at"])
                - datetime.fromisoformat(t["agent_execution"]["started_at"])
            ).total_seconds()
            for t in trials
            if t.get("agent_execution")
        )
        order = [t["trial_name"].split("__")[0] for t in sorted(trials, key=lambda t: t["started_at"])]
        found.raw["pier_baseline"] = {
            "command": " ".join(argv[1:]),
            "exit_code": code,
            "process_wall_s": wall,
            "job_span_s": span,
            "trials": len(trials),
            "errored": sum(1 for t in trials if t.get("exception_info")),
            "summed_agent_s": agent_sum,
            "start_order_durations_s": [durations[name.removeprefix("task_")] for name in order],
        }
        found.figure(
            "pier_makespan_over_lower_bound",
            span / lower,
            None,
            None,
            f"Pier's job span {span:.2f} s (process {wall:.2f} s with start-up), same tasks, -n 4",
        )
    return found.outcome()
