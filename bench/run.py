"""sciencebench performance benchmark: every figure measured side by side, in one run.

    .venv/bin/python -m bench.run            full run -> bench/results.json + docs/performance.md
    .venv/bin/python -m bench.run --quick    items 1-7, about 4 minutes -> bench/results-quick.json

It needs what the test tiers need (scripts/host-setup.sh, scripts/fixture-images.sh):
redis-server, the Docker Engine 28 of /var/tmp/sciencebench-host, its loopback
registry and SB_BASE_IMAGE; it sources /var/tmp/sciencebench-host/env.sh and
images.env itself. Everything it starts (a private redis-server on a loopback
port, `sciencebench worker` processes, bare Celery workers, containers of its
own Pier runs) is stopped before it exits. It exits non-zero only when it
crashes (an item raising counts; the other items still run and results are
still written); a missed goal is printed as MISSED and exits 0.

Figures (names as in results.json):

1. makespan_over_lower_bound: synthetic trials (fake Pier sleeping each task's
   duration), 2 workers x 2 slots, --n-concurrent 4; makespan / max(longest,
   sum / 4). Baseline: real `pier run -n 4` of the same tasks with
   bench.sleep_agent and bench.null_env (pier_makespan_over_lower_bound).
   The heavy tail (equal timeouts, 7 seeds): no history at all, a first run
   after another agent's run, a second run, and Pier's queue of the same
   trials in the same order; heavy_tail_cold_over_pier pairs the first and
   the last by seed.
2. overhead_ms_per_trial, overhead_ratio: no-op trials on 2 x 2 slots:
   (wall x slots - summed wall of the fake Pier processes) / trials, against a
   bare Celery chord of no-op tasks on 2 x 2 prefork workers of the same Redis.
3. submit_10k_s, submit_10k_rss_mb, submit_10k_ratio_to_bare_celery,
   finalize_10k_s, summarize_10k_process_s: `sciencebench submit` of 10,000
   trials with no workers against a process dispatching a bare 10,000-task
   chord; `write_summary` over 10,000 finished trials (records, trial
   directories, Pier result.json files), and the `sciencebench summarize`
   process (median of 5) beside the CLI's bare start-up.
4. pulls_per_image_per_host: 8 concurrent trials sharing 2 freshly pushed
   images on one host with 8 slots.
5. real_trial_ratio: a trivial real trial through a worker / direct `pier run`.
6. scaling_1_to_2: throughput with 2 worker processes / with 1 (2 slots each).
7. warm_start_harness_ratio: the harness stage of trivial real trials (nop,
   one at a time) with Pier forked by the worker's zygote / with Pier exec'd
   (SCIENCEBENCH_WARM_PIER=0).
8. scaling_real_1_to_2: real oracle trials (the demo selection, enough to
   keep 4 slots busy) on worker containers deployed from compose/ (2 slots
   each): makespan with 1 container / with 2, median of alternating paired
   runs with their spread (needs scripts/cluster-images.sh).
9. bake_s, rebake_s, agent_setup_baked_s: Codex baked into the demo's agent
   image (`sciencebench images bake`), the same bake again (a no-op), and
   Pier's agent-setup stage of a real Codex trial on the baked image against
   the scripted gateway (needs scripts/agent-artifacts.sh).
10. campaign_{placed,unplaced}_{makespan_over_bound,pulls,b_wait_s}: two
   users' jobs on 4 simulated hosts, each its own Docker Engine and image
   store, 8 task images of 16-128 MB, heavy-tailed durations; placed
   (`submit --placement`) and unplaced (without it) in one run
   (bench/campaign.py). Full run only (about 3 minutes), or `--only 10`.

`--quick` (a smoke that fails only on a crash; scripts/test.sh runs it beside
the second test phase) runs items 1-7. Items 8-10 deploy a compose cluster,
bake an agent or start four Engines: the full run's, or `--only`; in CI the
docker tier deploys and bakes the same way (tests/docker/test_cluster.py,
test_real_agents.py), and the smoke's CPU went to the tests beside it.

Makespans and walls start when the submit starts (`prepare`, as `sciencebench
submit` runs it, in this process) and end when the chord's finalizer has
written the summary; the interpreter start-up of the CLI is not part of them
(figure 3 measures the whole CLI process).

Layout: bench/params.py (FULL, QUICK), bench/harness.py (processes),
bench/measure.py (timed processes, the fake Pier's logs), bench/figures/*.py
(one module per item, each returning `bench.report.Outcome`s), bench/report.py
(printing, results JSON, docs/performance.md), bench/sb.py (every sciencebench
name the benchmark uses).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import campaign
from bench.figures import agents, overhead, pulls, real, scale, scaling, scaling_real, schedule, warm_start
from bench.harness import BENCH_DIR, REPO, Harness, load_host_env
from bench.params import FULL, QUICK, QUICK_ITEMS
from bench.report import DOC, ItemCrash, Outcome, Report, banner, loadavg, write_doc, write_json


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 1 when an item crashed (missed goals still exit 0)."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller and shorter; about 2 minutes")
    parser.add_argument(
        "--only", help="comma-separated items to run (1-10), for development; nothing is written"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="with --only: replace those items' figures in the full run's results (bench/results.json, "
        "docs/performance.md) and keep the rest",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    p = QUICK if args.quick else FULL
    everything = QUICK_ITEMS if p.quick else range(1, 11)
    only = {int(x) for x in args.only.split(",")} if args.only else set(everything)

    load_host_env()
    sys.path.insert(0, str(REPO))

    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="sciencebench-bench-"))
    report = Report(p)
    loads: dict[str, list[float]] = {}
    print(f"sciencebench benchmark ({'quick' if p.quick else 'full'}), work dir {workdir}", flush=True)
    h = Harness(workdir)

    phases: dict[str, float] = {}
    crashed_items: list[str] = []

    def step(key: str, title: str, *parts: Callable[[], Outcome]) -> None:
        """One item: its parts in order, each outcome recorded as it arrives; a crash ends the item."""
        loads[key] = loadavg()
        t = time.monotonic()
        if title:
            banner(title)
        try:
            for part in parts:
                try:
                    outcome = part()
                except ItemCrash as crash:  # keep what the part found before it raised
                    report.record(crash.partial)
                    crashed_in(key, crash.__cause__ or crash)
                    return
                except Exception as exc:
                    crashed_in(key, exc)
                    return
                report.record(outcome)
        finally:
            phases[key] = round(time.monotonic() - t, 1)

    def crashed_in(key: str, exc: BaseException) -> None:
        """A crash: the other items still run, the exit code says so."""
        crashed_items.append(key)
        report.errors[key] = f"{exc.__class__.__name__}: {exc}"
        print(f"  CRASH in {key}: {exc.__class__.__name__}: {exc}", flush=True)
        traceback.print_exception(exc)

    crashed = False
    try:
        h.start()
        if only & {1, 2, 6}:
            t = time.monotonic()
            heavy, informative = schedule.workloads(h, p)
            h.start_workers(2, 2, pier_bin=str(h.fake_pier))
            schedule.warm_up(h)
            phases["workers_and_warm_up"] = round(time.monotonic() - t, 1)
            if 1 in only or 6 in only:
                step(
                    "schedule",
                    "1. scheduling, 2 workers x 2 slots, --n-concurrent 4: a heavy tail with equal timeouts "
                    "per seed (no history, Pier, after another agent, own history), timeouts 30 x duration "
                    "(sciencebench, Pier)",
                    lambda: schedule.measure(h, p, heavy, informative),
                )
            if 2 in only:
                step(
                    "overhead",
                    "2. orchestration overhead per trial: no-op trials, 2 workers x 2 slots",
                    lambda: overhead.measure(h, p),
                )
            if 6 in only:
                two = report.raw.get("schedule", {}).get("informative", {}).get("cold_makespans_s", [])
                step(
                    "scaling",
                    "6. scaling: 1 worker x 2 slots vs 2 workers x 2 slots, same workload",
                    lambda: scaling.measure(h, p, informative, two),
                )
        if 3 in only:
            n = scale.trials(p)
            step(
                "scale",
                f"3. scale: submit {n} trials (no workers) vs a bare {n}-task chord; finalize {n} records",
                lambda: scale.submit(h, p),
                lambda: scale.finalize(h, p),
            )
        if 4 in only:
            step(
                "pulls",
                f"4. pull dedup: {p.pull_trials} concurrent trials sharing 2 images on one host",
                lambda: pulls.measure(h, p),
            )
        if 5 in only:
            step(
                "real",
                "5. a real trivial trial (oracle, demo task 001): through a worker vs direct `pier run`",
                lambda: real.measure(h, p),
            )
        if 7 in only:
            step("warm_start", "", lambda: warm_start.measure(h, p))
        if 8 in only:
            step(
                "scaling_real",
                f"8. real trials: {p.real_scaling_trials} oracle trials, 1 vs 2 worker containers x 2 slots",
                lambda: scaling_real.measure(h, p),
            )
        if 9 in only:
            step(
                "agents",
                "9. agent-ready images: bake Codex, bake it again, agent setup of a real trial on it",
                lambda: agents.measure(h, p),
            )
        if 10 in only:
            step(
                "campaign",
                "10. campaign: 2 users' jobs on 4 hosts with their own Engines, placed vs unplaced",
                lambda: campaign.measure(h, p),
            )
    except Exception:
        crashed = True
        traceback.print_exc()
    finally:
        h.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    duration = time.monotonic() - started
    results = report.results(duration, loads, phases)
    print(f"\n== time per phase (s): {phases}", flush=True)
    missed = report.missed()
    if p.quick:
        verdict = "goals not judged in quick mode (its sizes are too small; full run: python -m bench.run)"
    else:
        verdict = f"goals met {len(report.goals) - len(missed)}/{len(report.goals)}" + (
            f"; MISSED: {', '.join(missed)}" if missed else ""
        )
    print(f"\n== done in {duration:.0f} s; {verdict}", flush=True)
    if report.errors:
        print(f"== errors: {', '.join(report.errors)}", flush=True)
    if crashed_items:
        print(f"== CRASHED items (exit code 1): {', '.join(crashed_items)}", flush=True)
    if args.only is not None and args.update and not p.quick:
        results["reproduce"] = f".venv/bin/python -m bench.run --only {args.only} --update"
        merged = update_results(BENCH_DIR / "results.json", results)
        write_json(merged, BENCH_DIR / "results.json")
        write_doc(merged)
        print(
            f"== updated {', '.join(sorted(results['figures']))} in bench/results.json and the doc",
            flush=True,
        )
    if args.only is None:
        out = BENCH_DIR / ("results-quick.json" if p.quick else "results.json")
        write_json(results, out)
        print(f"== wrote {out.relative_to(REPO)}", flush=True)
        if not p.quick:
            write_doc(results)
            print(f"== wrote {DOC.relative_to(REPO)}", flush=True)
    return 1 if crashed or crashed_items else 0


def update_results(path: Path, partial: dict[str, Any]) -> dict[str, Any]:
    """The full run's results with `partial`'s items measured again (figures, goals, raw, errors).

    The machine and date of the partial run are kept beside the old ones under `updates`.
    """
    merged: dict[str, Any] = json.loads(path.read_text())
    for key in ("figures", "spread", "details", "goals", "raw", "errors", "phase_s", "load_average"):
        merged.setdefault(key, {}).update(partial.get(key, {}))
    merged["notes"] = list(dict.fromkeys([*merged.get("notes", []), *partial.get("notes", [])]))
    merged.setdefault("updates", []).append(
        {"date": partial["date"], "figures": sorted(partial["figures"]), "duration_s": partial["duration_s"],
         "reproduce": partial["reproduce"]}
    )  # fmt: skip
    return merged


if __name__ == "__main__":
    sys.exit(main())
