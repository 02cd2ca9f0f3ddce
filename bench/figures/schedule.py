"""Item 1: scheduling efficiency on two workloads, against Pier's own queue on the same tasks.

Synthetic trials (the fake Pier sleeping each task's duration) on 2 workers x
2 slots, `--n-concurrent 4`; every figure is makespan / max(longest, sum / 4).

- heavy tail: seeded log-normal durations (`params.HEAVY_SEED`), and every
  task with the same timeouts, so they say nothing about the durations, as
  with most real tasks. Contenders: sciencebench's first run of the selection
  (no history: selection order, as Pier's), its second run of the same
  selection (ordered by what the first run measured), and a real
  `pier run -n 4` (bench.sleep_agent, bench.null_env). The history is cleared
  before each first run.
- informative: 28 trials whose timeouts are 30 x their durations, so ordering
  by timeout is ordering by duration (the case this item measured first), and
  Pier's queue. History is cleared before each run: it is ordered by timeouts.

Each repetition runs every contender once, in the same order, so drift in the
machine's load hits them alike; figures are medians with their spread.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import sb
from bench.harness import Harness
from bench.measure import lpt_makespan, pier_runs, run_measured
from bench.params import HEAVY_SEED, SLOTS, Params
from bench.report import Findings, Outcome

HISTORY_GOAL = 1.05


@dataclass(frozen=True)
class Workload:
    """A selection of fake tasks and each task's duration (s) by task id."""

    key: str
    label: str
    path: Path
    durations: dict[str, float]

    @property
    def bound(self) -> float:
        """max(longest, sum / slots): no schedule on the slots can be shorter."""
        return lower_bound(self.durations)


def lower_bound(durations: dict[str, float], slots: int = SLOTS) -> float:
    """max(longest, sum / slots): no schedule on `slots` slots can be shorter."""
    values = list(durations.values())
    return max(max(values), sum(values) / slots)


def heavy_tail_durations(n: int, median: float, sigma: float, seed: int) -> list[float]:
    """`n` log-normal durations (s) of the given median and sigma, in steps of 0.05 s, at least 0.05 s."""
    rng = random.Random(seed)
    return [max(0.05, round(rng.lognormvariate(math.log(median), sigma) / 0.05) * 0.05) for _ in range(n)]


def in_order_makespan(durations: list[float], slots: int = SLOTS) -> float:
    """Makespan of list scheduling in the given order with no overhead (what Pier's queue does)."""
    ends = [0.0] * slots
    for d in durations:
        i = ends.index(min(ends))
        ends[i] += d
    return max(ends)


def seed_context(p: Params, seeds: int = 200) -> dict[str, float]:
    """How lucky selection order is for this workload's seed, among `seeds` seeds (no overhead)."""
    ratios = []
    for seed in range(1, seeds + 1):
        values = heavy_tail_durations(p.heavy_trials, p.heavy_median_sec, p.heavy_sigma, seed)
        ratios.append(in_order_makespan(values) / max(max(values), sum(values) / SLOTS))
    ratios.sort()
    return {"seeds": seeds, "selection_order_ratio_median": statistics.median(ratios),
            "p10": ratios[seeds // 10], "p90": ratios[seeds - seeds // 10 - 1]}  # fmt: skip


def workloads(h: Harness, p: Params) -> tuple[Workload, Workload]:
    """The heavy-tailed and the informative workloads (the latter shared with item 6)."""
    values = heavy_tail_durations(p.heavy_trials, p.heavy_median_sec, p.heavy_sigma, HEAVY_SEED)
    heavy = {f"{i:03d}": d for i, d in enumerate(values, start=1)}
    heavy_path = h.selection("sel-heavy", {i: {"sleep_sec": d} for i, d in heavy.items()})  # equal timeouts
    durations = list(p.durations)
    random.Random(7).shuffle(durations)  # task order says nothing about length
    informative = {f"{i:03d}": d for i, d in enumerate(durations, start=1)}
    # The agent timeout is what sciencebench orders by without history (longest expected first).
    informative_path = h.selection(
        "sel-sched",
        {i: {"sleep_sec": d} for i, d in informative.items()},
        agent_timeout_sec={i: 30.0 * d for i, d in informative.items()},
    )
    heavy_label = f"heavy tail: {len(heavy)} log-normal trials, equal timeouts"
    informative_label = f"{len(informative)} trials, timeouts 30 x duration"
    return (
        Workload("heavy_tail", heavy_label, heavy_path, heavy),
        Workload("informative", informative_label, informative_path, informative),
    )


def warm_up(h: Harness, n: int = 8) -> None:
    """A short unmeasured job, so the first measured one finds warm workers."""
    path = h.selection("sel-warm", {f"{i:03d}": {"sleep_sec": 0.2} for i in range(1, n + 1)})
    h.submit(path, "warmup", n_concurrent=SLOTS)


def forget_history(h: Harness) -> None:
    """Clear sciencebench's measured durations (the next submit runs cold)."""
    import redis

    redis.Redis.from_url(h.url(0)).delete(sb.HISTORY_KEY)


def run_ours(h: Harness, w: Workload, job: str) -> dict[str, Any]:
    """One sciencebench job of the workload on the running workers: its makespan and start order."""
    run = h.submit(w.path, job, n_concurrent=SLOTS)
    runs = pier_runs(h, job)
    started = sorted(runs, key=lambda x: x["start"])
    length = {id(x): w.durations[x["task"].removeprefix("task_")] for x in runs}
    # Out of longest-first order: a trial that started over half a second after one at most half as long
    # and over 1 s shorter (simultaneous starts race by milliseconds; tiny trials measure noise).
    late = 0
    for x in runs:
        shorter = min(length[id(x)] / 2, length[id(x)] - 1)
        late += any(y["start"] < x["start"] - 0.5 and length[id(y)] < shorter for y in runs)
    return {
        "job": job,
        "makespan_s": run.wall_s,
        "ratio": run.wall_s / w.bound,
        "prepare_s": run.prepare_s,
        "dispatch_s": run.dispatch_s,
        "first_pier_start_after_submit_s": min(x["start"] for x in runs) - run.t0 if runs else None,
        "errored": run.answer["n_errored_trials"],
        "pier_runs": len(runs),
        "start_order_durations_s": [length[id(x)] for x in started],
        "started_late": late,
    }


def run_pier(h: Harness, w: Workload, job: str) -> dict[str, Any]:
    """Real `pier run -n 4` of the workload (sleep agent, no containers): its job span from result.json."""
    out = h.work / "pier-jobs"
    argv = [
        str(h.venv_bin / "pier"), "run", "-p", str(w.path), "-n", str(SLOTS), "-o", str(out),
        "--job-name", job, "--agent-import-path", "bench.sleep_agent:SleepAgent",
        "--environment-import-path", "bench.null_env:NullEnvironment", "--disable-verification", "-y", "-q",
    ]  # fmt: skip
    wall, _, code, _, err = run_measured(argv, h.env(), cwd=h.work)
    entry: dict[str, Any] = {
        "job": job,
        "command": " ".join(argv[1:]),
        "exit_code": code,
        "process_wall_s": wall,
    }
    try:
        result = json.loads((out / job / "result.json").read_text())
        span = (
            datetime.fromisoformat(result["finished_at"]) - datetime.fromisoformat(result["started_at"])
        ).total_seconds()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        entry["error"] = f"pier run exited {code}: {exc}: {err[-800:]}"
        return entry
    trials = [json.loads(t.read_text()) for t in (out / job).glob("task_*/result.json")]
    order = [t["trial_name"].split("__")[0] for t in sorted(trials, key=lambda t: t["started_at"])]
    entry.update(
        span_s=span,
        ratio=span / w.bound,
        trials=len(trials),
        errored=sum(1 for t in trials if t.get("exception_info")),
        start_order_durations_s=[w.durations[name.removeprefix("task_")] for name in order],
    )
    return entry


def measure(h: Harness, p: Params, heavy: Workload, informative: Workload) -> Outcome:
    """The item's five figures, from `p.repeats` repetitions of every contender on the running workers."""
    found = Findings()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        w.key: {"cold": [], "history": [], "pier": []} for w in (heavy, informative)
    }
    with found.kept_on_crash():
        try:
            for i in range(1, p.repeats + 1):
                forget_history(h)
                runs[heavy.key]["cold"].append(run_ours(h, heavy, f"heavy-cold-{i}"))
                runs[heavy.key]["history"].append(run_ours(h, heavy, f"heavy-history-{i}"))
                runs[heavy.key]["pier"].append(run_pier(h, heavy, f"heavy-{i}"))
                forget_history(h)
                runs[informative.key]["cold"].append(run_ours(h, informative, f"sched-{i}"))
                if p.informative_pier:
                    runs[informative.key]["pier"].append(run_pier(h, informative, f"sched-{i}"))
                _progress(i, runs)
        finally:
            _record(found, p, heavy, informative, runs)
    return found.outcome()


def _progress(i: int, runs: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    shown = "; ".join(
        f"{key} {kind} {entries[-1].get('ratio', float('nan')):.3f}"
        for key, kinds in runs.items()
        for kind, entries in kinds.items()
        if entries
    )
    print(f"  repetition {i}: {shown}", flush=True)


def _record(
    found: Findings,
    p: Params,
    heavy: Workload,
    informative: Workload,
    runs: dict[str, dict[str, list[dict[str, Any]]]],
) -> None:
    """Raw data and figures from whatever ran (an item that crashed keeps its finished runs)."""
    raw: dict[str, Any] = {}
    for w in (heavy, informative):
        values = list(w.durations.values())
        ours = {kind: [r for r in runs[w.key][kind] if "makespan_s" in r] for kind in ("cold", "history")}
        piers = [r for r in runs[w.key]["pier"] if "span_s" in r]
        raw[w.key] = {
            "label": w.label,
            "trials": len(values),
            "durations_s": values,
            "sum_s": sum(values),
            "longest_s": max(values),
            "slots": SLOTS,
            "lower_bound_s": w.bound,
            "lpt_ideal_s": lpt_makespan(values, SLOTS),
            "selection_order_ideal_s": in_order_makespan(values),
            "cold_makespans_s": [r["makespan_s"] for r in ours["cold"]],
            "history_makespans_s": [r["makespan_s"] for r in ours["history"]],
            "pier_spans_s": [r["span_s"] for r in piers],
            "runs": runs[w.key],
        }
        for kind, entries in (*ours.items(), ("pier", piers)):
            bad = [
                r["job"]
                for r in entries
                if r.get("errored") or r.get("pier_runs", r.get("trials")) != len(values)
            ]
            if bad:
                found.note(f"{w.key} {kind}: errored trials or missing runs in {', '.join(bad)}")
        for r in runs[w.key]["pier"]:
            if "error" in r:
                found.errors[f"pier_{w.key}_{r['job']}"] = r["error"]
    raw[heavy.key].update(seed=HEAVY_SEED, median_sec=p.heavy_median_sec, sigma=p.heavy_sigma,
                          seed_context=seed_context(p))  # fmt: skip
    found.raw["schedule"] = raw
    for entry in runs[heavy.key]["history"]:
        if entry["started_late"]:
            found.note(f"{entry['job']}: {entry['started_late']} trial(s) started after a much shorter one")

    def ratios(key: str, kind: str) -> list[float]:
        return [r["ratio"] for r in runs[key][kind] if "ratio" in r]

    h, i = raw[heavy.key], raw[informative.key]
    where = f"{h['trials']} trials, bound {h['lower_bound_s']:.1f} s"
    context = h["seed_context"]
    if cold := ratios(heavy.key, "cold"):
        ideal = h["selection_order_ideal_s"] / h["lower_bound_s"]
        found.figure(
            "makespan_heavy_tail_cold",
            statistics.median(cold),
            detail=f"{where}; median makespan {statistics.median(h['cold_makespans_s']):.2f} s; no history, "
            f"equal timeouts: selection order ({ideal:.3f} with no overhead; the median over "
            f"{context['seeds']} seeds is {context['selection_order_ratio_median']:.3f})",
            samples=cold,
        )
    if hist := ratios(heavy.key, "history"):
        value = statistics.median(hist)
        ideal = h["lpt_ideal_s"] / h["lower_bound_s"]
        found.figure(
            "makespan_heavy_tail_history",
            value,
            f"<= {HISTORY_GOAL}",
            value <= HISTORY_GOAL,
            f"{where}; median makespan {statistics.median(h['history_makespans_s']):.2f} s; the second run "
            f"of the selection, ordered by the first run's measured durations ({ideal:.3f} with no overhead)",
            samples=hist,
        )
    if pier := ratios(heavy.key, "pier"):
        found.figure(
            "pier_makespan_heavy_tail",
            statistics.median(pier),
            detail=f"{where}; Pier's job span {statistics.median(h['pier_spans_s']):.2f} s (its start-up "
            "excluded, as ours is), same tasks, -n 4, task order",
            samples=pier,
        )
    if timed := ratios(informative.key, "cold"):
        value = statistics.median(timed)
        found.figure(
            "makespan_over_lower_bound",
            value,
            f"<= {HISTORY_GOAL}",
            value <= HISTORY_GOAL,
            f"{i['trials']} trials, bound {i['lower_bound_s']:.1f} s, median makespan "
            f"{statistics.median(i['cold_makespans_s']):.2f} s; ordered by timeouts (no history)",
            samples=timed,
        )
    if theirs := ratios(informative.key, "pier"):
        found.figure(
            "pier_makespan_over_lower_bound",
            statistics.median(theirs),
            detail=f"Pier's job span {statistics.median(i['pier_spans_s']):.2f} s, same tasks, -n 4",
            samples=theirs,
        )
