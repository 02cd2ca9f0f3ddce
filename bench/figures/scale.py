"""Item 3: submit and finalize at 10,000 trials.

`sciencebench submit` of 10,000 trials with no workers, as a whole process,
against a process dispatching a bare 10,000-task chord; `write_summary` over
10,000 finished trials, and the `sciencebench summarize` process beside the
CLI's bare start-up.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import sb
from bench.harness import REPO, Harness
from bench.measure import run_measured
from bench.params import Params
from bench.report import Findings, Outcome

FINALIZED_JOB = "scale-1"  # the first submitted job: its records are what finalize() summarizes


def trials(p: Params) -> int:
    """How many trials item 3 submits and finalizes."""
    return p.scale_tasks * p.scale_attempts


def _best(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each contender's best (least disturbed) successful run."""
    return {
        key: min((e for e in entries if e["ok"]), key=lambda e: e["wall_s"])
        for key, entries in runs.items()
        if any(e["ok"] for e in entries)
    }


def submit(h: Harness, p: Params) -> Outcome:
    """submit_10k_s, submit_10k_ratio_to_bare_celery, submit_10k_rss_mb (and the 10k-tasks variant).

    Stops every worker first: the submitted trials stay queued.
    """
    import redis

    from tests.fixtures.selection import make_selection

    found = Findings()
    with found.kept_on_crash():
        n = trials(p)
        if h.workers:
            h.stop_workers()
        ids = [f"{i:04d}" for i in range(1, p.scale_tasks + 1)]
        sel = make_selection(h.work / "sel-scale", ids, agent_image=h.base_image, verifier_image=h.base_image)

        def fresh(db: int) -> None:
            redis.Redis.from_url(h.url(db)).flushdb()

        def queued(db: int, queue: str) -> int:
            return int(redis.Redis.from_url(h.url(db)).llen(queue))

        names = iter(f"scale-{k}" for k in range(1, 100))  # a submitted job name cannot be reused

        def submit_args(window: int = n) -> list[str]:
            """With `--n-concurrent` n every trial goes to the broker at once, as the bare chord sends."""
            return ["--path", str(sel), "--n-attempts", str(p.scale_attempts), "--n-concurrent", str(window),
                    "--jobs-dir", str(h.jobs_dir), "--job-name", next(names)]  # fmt: skip

        runs: dict[str, list[dict[str, Any]]] = {}

        def measure(key: str, argv: list[str], db: int, queue: str, cwd: Path, sent: int = n) -> None:
            fresh(db)
            wall, rss, code, out, err = run_measured(argv, h.env(db), cwd=cwd)
            entry = {"wall_s": wall, "rss_mb": rss, "exit_code": code, "queued_messages": queued(db, queue)}
            entry["ok"] = code == 0 and entry["queued_messages"] == sent
            if not entry["ok"]:
                found.errors[f"{key}"] = f"exit {code}, {entry['queued_messages']} queued: {err[-800:]}"
            if key.startswith("bare") and code == 0:
                entry.update(json.loads(out.strip().splitlines()[-1]))
            runs.setdefault(key, []).append(entry)
            fresh(db)

        sciencebench = str(h.venv_bin / "sciencebench")
        bare_argv = [sys.executable, "-m", "bench.bare_dispatch", "--broker", h.url(3), "--n", str(n)]
        # Alternate the contenders, repeated: drift in the machine's load hits them alike.
        if p.scale_tasks_variant:  # the same number of trials as tasks: selection validation x10
            many = [f"{i:05d}" for i in range(1, p.scale_tasks_variant + 1)]
            sel_many = make_selection(
                h.work / "sel-scale-tasks", many, agent_image=h.base_image, verifier_image=h.base_image
            )
        for repeat in range(1, p.scale_repeats + 1):
            measure("submit", [sciencebench, "submit", *submit_args()], 2, "celery", h.work)
            measure("bare_celery_defaults", bare_argv, 3, "bench_noop", REPO)
            if p.bare_events_variant:
                measure("bare_with_sent_events", [*bare_argv, "--events"], 3, "bench_noop", REPO)
            if p.scale_tasks_variant:
                many_args = ["--path", str(sel_many), "--jobs-dir", str(h.jobs_dir),
                             "--job-name", f"scale-tasks-{repeat}"]  # fmt: skip
                measure("submit_tasks_variant", [sciencebench, "submit", *many_args], 2, "celery", h.work)
        if p.stock_submit:  # the default --n-concurrent 1: one trial sent, the others held in the store
            held_argv = [sciencebench, "submit", *submit_args(window=1)]
            measure("submit_held", held_argv, 2, "celery", h.work, sent=1)
        if p.stock_submit:  # the dispatch of before this benchmark, same trials, same run
            stock_argv = [sys.executable, "-m", "bench.stock_submit", *submit_args()]
            measure("submit_stock_chord", stock_argv, 2, "celery", REPO)
        best = _best(runs)
        found.raw["scale"] = {"trials": n, "runs": runs, "best": best}
        _figures(found, p, n, runs, best)
    return found.outcome()


def _paired(runs: dict[str, list[dict[str, Any]]], key: str) -> list[tuple[dict[str, Any], float]]:
    """Each successful run of `key` with the faster bare chord of the same repetition (the yardstick)."""
    pairs = []
    for k, entry in enumerate(runs.get(key, [])):
        bare = [runs[b][k]["wall_s"] for b in ("bare_celery_defaults", "bare_with_sent_events")
                if b in runs and k < len(runs[b]) and runs[b][k]["ok"]]  # fmt: skip
        if entry["ok"] and bare:
            pairs.append((entry, min(bare)))
    return pairs


def _figures(
    found: Findings, p: Params, n: int, runs: dict[str, list[dict[str, Any]]], best: dict[str, dict[str, Any]]
) -> None:
    """The submit figures: medians over the repetitions, ratios paired by repetition."""
    submits = _paired(runs, "submit")
    walls = [entry["wall_s"] for entry, _ in submits]
    rss = [entry["rss_mb"] for entry, _ in submits]
    bare = best["bare_celery_defaults"]
    label = f"{n // 1000}k" if n >= 1000 else str(n)
    stock = best.get("submit_stock_chord")
    held = best.get("submit_held")
    found.figure(
        "submit_10k_s",
        statistics.median(walls),
        None,
        None,
        f"`sciencebench submit` of {n} trials ({p.scale_tasks} tasks x {p.scale_attempts}"
        f" attempts), whole process"
        + (f"; with stock chord dispatch {stock['wall_s']:.2f} s, {stock['rss_mb']:.0f} MB" if stock else "")
        + (f"; with --n-concurrent 1 (1 sent, {n - 1} held) {held['wall_s']:.2f} s" if held else ""),
        samples=walls,
    )
    variant = _paired(runs, "submit_tasks_variant")
    if variant:
        ratios = [entry["wall_s"] / yardstick for entry, yardstick in variant]
        found.figure(
            "submit_10k_tasks_ratio_to_bare_celery",
            statistics.median(ratios),
            None,
            None,
            f"`sciencebench submit` of {p.scale_tasks_variant} tasks x 1 attempt: median "
            f"{statistics.median(e['wall_s'] for e, _ in variant):.2f} s, "
            f"{statistics.median(e['rss_mb'] for e, _ in variant):.0f} MB "
            "(selection validation of every task)",
            samples=ratios,
        )
    with_events = [e["wall_s"] for e in runs.get("bare_with_sent_events", []) if e["ok"]]
    ratios = [entry["wall_s"] / yardstick for entry, yardstick in submits]
    ratio = statistics.median(ratios)
    found.figure(
        "submit_10k_ratio_to_bare_celery",
        ratio,
        "<= 0.5",
        ratio <= 0.5,
        f"bare {label}-task chord process, median "
        f"{statistics.median(e['wall_s'] for e in runs['bare_celery_defaults'] if e['ok']):.2f} s"
        + (f" (with task-sent events {statistics.median(with_events):.2f} s)" if with_events else "")
        + "; ratios paired by repetition, against the faster bare chord of each",
        samples=ratios,
    )
    found.figure(
        "submit_10k_rss_mb",
        statistics.median(rss),
        "< 200 MB",
        statistics.median(rss) < 200,
        f"bare chord process {bare['rss_mb']:.0f} MB",
        samples=rss,
    )


def finalize(h: Harness, p: Params) -> Outcome:
    """finalize_10k_s and summarize_10k_process_s over the first submitted job's trials.

    Every trial gets a record, a trial directory with `verifier/reward.json`
    and the `result.json` a real Codex trial leaves (Pier's TrialResult,
    about 4 KB), so the summary reads what it reads in production.
    `finalize_10k_s` is `write_summary` in this process, as the finalizer
    runs it; `summarize_10k_process_s` the whole `sciencebench summarize`
    process (the median of `repeats` runs), measured side by side
    with the bare start-up of the same CLI (`sciencebench --version`), runs
    alternating.
    """
    found = Findings()
    with found.kept_on_crash():
        paths = sb.JobPaths(h.jobs_dir, FINALIZED_JOB)
        job = sb.load_job(paths)
        paths.trials_dir.mkdir(parents=True, exist_ok=True)
        written = _write_trials(paths, job)
        os.sync()
        sciencebench = str(h.venv_bin / "sciencebench")
        argv = [sciencebench, "summarize", "--jobs-dir", str(h.jobs_dir), "--job-name", job.job_name]
        took: list[float] = []
        runs: dict[str, list[dict[str, Any]]] = {"summarize": [], "startup": []}
        for _ in range(p.repeats):  # alternating: in process (what the finalizer runs), then the CLIs
            t0 = time.monotonic()
            result = sb.write_summary(job).result
            took.append(time.monotonic() - t0)
            for key, command in (("summarize", argv), ("startup", [sciencebench, "--version"])):
                cpu0 = os.times()
                wall, rss, code, out, err = run_measured(command, h.env(2), cwd=h.work)
                cpu1 = os.times()
                cpu = (cpu1.children_user - cpu0.children_user) + (
                    cpu1.children_system - cpu0.children_system
                )
                runs[key].append({"wall_s": wall, "cpu_s": cpu, "rss_mb": rss, "exit_code": code,
                                  "stdout_lines": len(out.splitlines())})  # fmt: skip
                if code != 0:
                    found.errors[f"{key}_cli"] = f"exit {code}: {err[-500:]}"
        walls = sorted(r["wall_s"] for r in runs["summarize"])
        median = statistics.median(walls)
        startup = statistics.median(r["wall_s"] for r in runs["startup"])
        found.raw["finalize"] = {
            "records": written,
            "write_summary_s": took,
            "runs": runs,
            "summarize_cli_median_s": median,
            "n_completed": result.stats.n_completed_trials,
        }
        label = f"{written // 1000}k" if written >= 1000 else str(written)
        value = statistics.median(took)
        found.figure(
            "finalize_10k_s",
            value,
            "< 5 s",
            value < 5,
            f"write_summary over {written} records, trial directories and Pier result.json files ({label})",
            samples=took,
        )
        found.figure(
            "summarize_10k_process_s",
            median,
            "< 1.5 s",
            median < 1.5,
            f"`sciencebench summarize` of {written} trials as a process "
            f"(CPU {_median(runs['summarize'], 'cpu_s'):.2f} s; "
            f"{runs['summarize'][0]['stdout_lines']} lines printed); CLI start-up alone {startup:.2f} s",
            samples=walls,
        )
    return found.outcome()


def _median(entries: list[dict[str, Any]], key: str) -> float:
    values = sorted(e[key] for e in entries)
    return float(values[len(values) // 2])


def _trial_result_template() -> str:
    """A real Codex trial's result.json (Pier's TrialResult) with `@TRIAL@` and `@TASK@` to fill in."""
    from pier.models.agent.context import AgentContext
    from pier.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from pier.models.trial.result import TimingInfo

    from tests.fixtures.pier_results import trial_result

    now = datetime.now(UTC)
    timing = TimingInfo(started_at=now, finished_at=now)
    img = {
        "agent": "codex",
        "version": "0.169.0",
        "image": "127.0.0.1:5555/agents/codex@sha256:" + "8" * 64,
    }
    tokens = AgentContext(
        n_input_tokens=2400, n_cache_tokens=0, n_output_tokens=160, peak_context_tokens=1280, n_agent_steps=2
    )
    result = trial_result(
        "@TRIAL@",
        "sciencebench/@TASK@",
        agent="codex",
        model="gpt-demo",
        rewards={"reward": 1.0},
        context=tokens,
    )
    config = TrialConfig(
        task=TaskConfig(path=Path("/shared/selection/@TASK@")),
        trial_name="@TRIAL@",
        trials_dir=Path("/shared/jobs/scale-1/.sciencebench/scratch/@TASK@-1.12345-1ea9e2a9/job"),
        agent=AgentConfig(import_path="sciencebench.agents.codex:ScienceBenchCodex", model_name="gpt-demo",
                          kwargs={"base_url": "https://gw:4443/v1", "wire_api": "responses",
                                  "reasoning_effort": "low", "version": "0.169.0"}),
        environment=EnvironmentConfig(import_path=sb.import_path("IsolatedDockerEnvironment"), delete=False,
                                      kwargs={"inference_urls": ["https://gw:4443/v1"], "agent_image": img}),
    )  # fmt: skip
    result = result.model_copy(
        update={"config": config, "started_at": now, "finished_at": now, "environment_setup": timing,
                "agent_setup": timing, "agent_execution": timing, "verifier": timing, "n_agent_steps": 2,
                "trial_uri": "file:///shared/jobs/scale-1/.sciencebench/scratch/job/@TRIAL@"}
    )  # fmt: skip
    return result.model_dump_json(indent=4)


def _write_trials(paths: Any, job: Any) -> int:
    """A finished trial record, trial directory, reward.json and Pier result.json for every trial of `job`."""
    now = datetime.now(UTC)
    detail = json.dumps(
        {"reward": 1.0, "public": {"passed": 3, "collected": 3}, "private": {"passed": 2, "collected": 2}}
    )
    template = _trial_result_template()
    written = 0
    for task_id in job.task_ids:
        for attempt in range(1, job.n_attempts + 1):
            trial_dir = f"task_{task_id}__{written:07d}"
            (paths.job_dir / trial_dir / "verifier").mkdir(parents=True, exist_ok=True)
            (paths.job_dir / trial_dir / "verifier" / "reward.json").write_text(detail)
            (paths.job_dir / trial_dir / "result.json").write_text(
                template.replace("@TRIAL@", trial_dir).replace("@TASK@", f"task_{task_id}")
            )
            record = sb.TrialRecord(
                job_id=job.job_id,
                job_name=job.job_name,
                task_id=task_id,
                attempt=attempt,
                trial_dir=trial_dir,
                rewards={"reward": 1.0},
                worker="bench",
                patch_collected=True,
                started_at=now,
                finished_at=now,
                timings_sec={"harness": 1.0, "pull": 0.01},
            )
            paths.trial_record(task_id, attempt).write_text(record.model_dump_json())
            written += 1
    return written
