"""Item 1: scheduling efficiency on two workloads, against Pier's own queue on the same tasks.

Synthetic trials (the fake Pier sleeping each task's duration) on 2 workers x
2 slots, `--n-concurrent 4`; every figure is makespan / max(longest, sum / 4).

- heavy tail: seeded log-normal durations, one selection per seed
  (`params.HEAVY_SEEDS`, `Params.heavy_seeds` of them), and every task with
  the same timeouts, so they say nothing about the durations, as with most
  real tasks. The selection lists its tasks in the order Pier reads the
  directory, so with nothing known both queues hold the same trials in the
  same order (like with like). Contenders, per seed, in this order, the
  history cleared first: sciencebench with no history at all (agent nop), a
  real `pier run -n 4` (bench.sleep_agent, bench.null_env), sciencebench's
  first run of another agent (oracle: the history holds nop's run only), and
  nop's second run (ordered by its own first run).
- informative: 28 trials whose timeouts are 30 x their durations, so ordering
  by timeout is ordering by duration (the case this item measured first), and
  Pier's queue. History is cleared before each run: it is ordered by timeouts.

Each seed (and each repetition of the informative workload) runs every
contender once, in the same order, so drift in the machine's load hits them
alike; figures are medians over seeds with their spread (min-max), and the
no-history run against Pier's queue is the median of the per-seed ratios.
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
from bench.params import HEAVY_SEEDS, SLOTS, Params
from bench.report import Findings, Outcome

HISTORY_GOAL = 1.05
OTHER_AGENT = "oracle"  # the heavy tail's other agent (the fake Pier sleeps the same for any agent)


@dataclass(frozen=True)
class Workload:
    """A selection of fake tasks and each task's duration (s) by task id."""

    key: str
    label: str
    path: Path
    durations: dict[str, float]  # in the selection's order
    seed: int | None = None

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


def in_pier_order(path: Path) -> list[str]:
    """List the selection's tasks in the order Pier reads them (its directory's order); the ids.

    Pier queues a local dataset's tasks as `Path.iterdir` yields them; with
    selection.json in that order, sciencebench's queue without history
    (equal timeouts: selection order) is Pier's queue.
    """
    ids = [child.name.removeprefix("task_") for child in path.iterdir() if child.is_dir()]
    listing = path / "selection.json"
    listing.write_text(json.dumps({**json.loads(listing.read_text()), "task_ids": ids}, indent=2))
    return ids


def heavy_workloads(h: Harness, p: Params) -> list[Workload]:
    """One heavy-tailed selection per seed (equal timeouts), its tasks in Pier's order."""
    found = []
    for seed in HEAVY_SEEDS[: p.heavy_seeds]:
        values = heavy_tail_durations(p.heavy_trials, p.heavy_median_sec, p.heavy_sigma, seed)
        heavy = {f"{i:03d}": d for i, d in enumerate(values, start=1)}
        path = h.selection(f"sel-heavy-{seed}", {i: {"sleep_sec": d} for i, d in heavy.items()})
        order = in_pier_order(path)
        label = f"heavy tail: {len(heavy)} log-normal trials, equal timeouts"
        found.append(Workload("heavy_tail", label, path, {t: heavy[t] for t in order}, seed))
    return found


def workloads(h: Harness, p: Params) -> tuple[list[Workload], Workload]:
    """The heavy-tailed workloads (one per seed) and the informative one (shared with item 6)."""
    heavy = heavy_workloads(h, p)
    durations = list(p.durations)
    random.Random(7).shuffle(durations)  # task order says nothing about length
    informative = {f"{i:03d}": d for i, d in enumerate(durations, start=1)}
    # The agent timeout is what sciencebench orders by without history (longest expected first).
    informative_path = h.selection(
        "sel-sched",
        {i: {"sleep_sec": d} for i, d in informative.items()},
        agent_timeout_sec={i: 30.0 * d for i, d in informative.items()},
    )
    informative_label = f"{len(informative)} trials, timeouts 30 x duration"
    return heavy, Workload("informative", informative_label, informative_path, informative)


def warm_up(h: Harness, n: int = 8) -> None:
    """A short unmeasured job, so the first measured one finds warm workers."""
    path = h.selection("sel-warm", {f"{i:03d}": {"sleep_sec": 0.2} for i in range(1, n + 1)})
    h.submit(path, "warmup", n_concurrent=SLOTS)


def forget_history(h: Harness) -> None:
    """Clear sciencebench's measured durations (the next submit runs cold)."""
    import redis

    redis.Redis.from_url(h.url(0)).delete(sb.HISTORY_KEY)


def run_ours(h: Harness, w: Workload, job: str, agent: str = "nop") -> dict[str, Any]:
    """One sciencebench job of the workload on the running workers: its makespan and start order."""
    run = h.submit(w.path, job, n_concurrent=SLOTS, agent=agent)
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
        "seed": w.seed,
        "agent": agent,
        "makespan_s": run.wall_s,
        "bound_s": w.bound,
        "ratio": run.wall_s / w.bound,
        "prepare_s": run.prepare_s,
        "dispatch_s": run.dispatch_s,
        "first_pier_start_after_submit_s": min(x["start"] for x in runs) - run.t0 if runs else None,
        "errored": run.answer["n_errored_trials"],
        "pier_runs": len(runs),
        "start_order_durations_s": [length[id(x)] for x in started],
        "in_order_ideal_s": in_order_makespan([length[id(x)] for x in started]),
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
        "seed": w.seed,
        "bound_s": w.bound,
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
        in_order_ideal_s=in_order_makespan([w.durations[name.removeprefix("task_")] for name in order]),
        trials=len(trials),
        errored=sum(1 for t in trials if t.get("exception_info")),
        start_order_durations_s=[w.durations[name.removeprefix("task_")] for name in order],
    )
    return entry


HEAVY_KINDS = ("cold", "pier", "other", "history")  # run in this order for each seed


def measure(h: Harness, p: Params, heavy: list[Workload], informative: Workload) -> Outcome:
    """The item's figures: every heavy-tail seed's contenders, then `p.repeats` informative runs."""
    found = Findings()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        "heavy_tail": {kind: [] for kind in HEAVY_KINDS},
        informative.key: {"cold": [], "pier": []},
    }
    with found.kept_on_crash():
        try:
            for w in heavy:
                forget_history(h)
                done = runs["heavy_tail"]
                done["cold"].append(run_ours(h, w, f"heavy-cold-{w.seed}"))  # no history at all
                done["pier"].append(run_pier(h, w, f"heavy-{w.seed}"))
                done["other"].append(run_ours(h, w, f"heavy-other-{w.seed}", agent=OTHER_AGENT))
                done["history"].append(run_ours(h, w, f"heavy-history-{w.seed}"))  # nop's second run
                _progress(f"seed {w.seed}", runs["heavy_tail"])
            for i in range(1, p.repeats + 1):
                forget_history(h)
                runs[informative.key]["cold"].append(run_ours(h, informative, f"sched-{i}"))
                if p.informative_pier:
                    runs[informative.key]["pier"].append(run_pier(h, informative, f"sched-{i}"))
                _progress(f"repetition {i}", runs[informative.key])
        finally:
            _record(found, p, heavy, informative, runs)
    return found.outcome()


def _progress(what: str, runs: dict[str, list[dict[str, Any]]]) -> None:
    shown = "; ".join(
        f"{kind} {entries[-1].get('ratio', float('nan')):.3f}" for kind, entries in runs.items() if entries
    )
    print(f"  {what}: {shown}", flush=True)


def _checked(found: Findings, key: str, kind: str, entries: list[dict[str, Any]], trials: int) -> None:
    bad = [r["job"] for r in entries if r.get("errored") or r.get("pier_runs", r.get("trials")) != trials]
    if bad:
        found.note(f"{key} {kind}: errored trials or missing runs in {', '.join(bad)}")
    for r in entries:
        if "error" in r:
            found.errors[f"pier_{key}_{r['job']}"] = r["error"]


def _record(
    found: Findings,
    p: Params,
    heavy: list[Workload],
    informative: Workload,
    runs: dict[str, dict[str, list[dict[str, Any]]]],
) -> None:
    """Raw data and figures from whatever ran (an item that crashed keeps its finished runs)."""
    raw: dict[str, Any] = {}
    if heavy:
        raw["heavy_tail"] = _heavy_raw(found, p, heavy, runs["heavy_tail"])
        _heavy_figures(found, raw["heavy_tail"], runs["heavy_tail"])
    w = informative
    values = list(w.durations.values())
    ours = [r for r in runs[w.key]["cold"] if "makespan_s" in r]
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
        "cold_makespans_s": [r["makespan_s"] for r in ours],
        "pier_spans_s": [r["span_s"] for r in piers],
        "runs": runs[w.key],
    }
    _checked(found, w.key, "cold", ours, len(values))
    _checked(found, w.key, "pier", runs[w.key]["pier"], len(values))
    found.raw["schedule"] = raw
    i = raw[w.key]
    if timed := [r["ratio"] for r in ours]:
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
    if theirs := [r["ratio"] for r in piers]:
        found.figure(
            "pier_makespan_over_lower_bound",
            statistics.median(theirs),
            detail=f"Pier's job span {statistics.median(i['pier_spans_s']):.2f} s, same tasks, -n 4",
            samples=theirs,
        )


def _heavy_raw(
    found: Findings, p: Params, heavy: list[Workload], runs: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """The heavy tail's raw data: each seed's workload, each contender's runs, their ratios by seed."""
    seeds = {}
    for w in heavy:
        values = list(w.durations.values())
        seeds[str(w.seed)] = {
            "durations_s": values,  # in the selection's (Pier's) order
            "sum_s": sum(values),
            "longest_s": max(values),
            "lower_bound_s": w.bound,
            "lpt_ideal_s": lpt_makespan(values, SLOTS),
            "in_order_ideal_s": in_order_makespan(values),
        }
    for kind, entries in runs.items():
        done = [r for r in entries if "ratio" in r]
        _checked(found, "heavy_tail", kind, entries, p.heavy_trials)
        for r in done:
            seeds[str(r["seed"])][f"{kind}_ratio"] = r["ratio"]
    for entry in runs["other"] + runs["history"]:
        if entry.get("started_late"):
            found.note(f"{entry['job']}: {entry['started_late']} trial(s) started after a much shorter one")
    return {
        "label": heavy[0].label,
        "trials": p.heavy_trials,
        "median_sec": p.heavy_median_sec,
        "sigma": p.heavy_sigma,
        "slots": SLOTS,
        "seeds": seeds,
        "seed_context": seed_context(p),
        "runs": runs,
    }


def _heavy_figures(found: Findings, raw: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> None:
    """makespan / bound of each contender (median over seeds), and no history / Pier's queue paired."""
    ratios = {kind: [r["ratio"] for r in entries if "ratio" in r] for kind, entries in runs.items()}
    seeds = raw["seeds"]
    bounds = _span([s["lower_bound_s"] for s in seeds.values()])
    where = f"{raw['trials']} trials, {len(seeds)} seed(s), bounds {bounds} s"
    context = raw["seed_context"]
    ideal = statistics.median(s["in_order_ideal_s"] / s["lower_bound_s"] for s in seeds.values())
    lpt = statistics.median(s["lpt_ideal_s"] / s["lower_bound_s"] for s in seeds.values())
    if cold := ratios["cold"]:
        found.figure(
            "makespan_heavy_tail_cold",
            statistics.median(cold),
            detail=f"{where}; no history at all, equal timeouts: the selection's order, which is Pier's "
            f"(in that order with no overhead: median {ideal:.3f}; selection order's median over "
            f"{context['seeds']} seeds {context['selection_order_ratio_median']:.3f})",
            samples=cold,
        )
    if other := ratios["other"]:
        value = statistics.median(other)
        found.figure(
            "makespan_heavy_tail_other_agent",
            value,
            f"<= {HISTORY_GOAL}",
            value <= HISTORY_GOAL,
            f"{where}; a first run of another agent ({OTHER_AGENT}), the history holding nop's run only: "
            f"ordered by nop's measured durations, unscaled (no task in common; longest first with no "
            f"overhead: median {lpt:.3f})",
            samples=other,
        )
    if hist := ratios["history"]:
        value = statistics.median(hist)
        found.figure(
            "makespan_heavy_tail_history",
            value,
            f"<= {HISTORY_GOAL}",
            value <= HISTORY_GOAL,
            f"{where}; nop's second run of the selection, ordered by its first run's measured durations",
            samples=hist,
        )
    if pier := ratios["pier"]:
        found.figure(
            "pier_makespan_heavy_tail",
            statistics.median(pier),
            detail=f"{where}; Pier's job span (its start-up excluded, as ours is), same tasks in the same "
            "order, -n 4",
            samples=pier,
        )
    paired = [
        s["cold_ratio"] / s["pier_ratio"] for s in seeds.values() if "cold_ratio" in s and "pier_ratio" in s
    ]
    if paired:
        value = statistics.median(paired)
        found.figure(
            "heavy_tail_cold_over_pier",
            value,
            "<= 1",
            value <= 1.0,
            f"{where}; sciencebench with no history at all / Pier's queue, same trials in the same order "
            "on 4 slots, paired by seed",
            samples=paired,
        )


def _span(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}" if len(values) > 1 else f"{values[0]:.1f}"
