"""Item 5: a trivial real trial (oracle, demo task 001) through a worker / a direct `pier run`."""

from __future__ import annotations

import json
import statistics
import threading
import time
from typing import Any

from bench import sb
from bench.harness import Harness, Submitted
from bench.measure import read_pier_reward, run_measured
from bench.params import Params
from bench.report import Findings, Outcome

ENV_CLASS = "IsolatedDockerEnvironment"  # the worker's fast-teardown environment, from bench.sb


def environment_state() -> str:
    """Whether the worker's environment class imports (it may be another engineer's work in progress)."""
    try:
        getattr(sb, ENV_CLASS)
    except Exception as exc:
        return f"not importable: {exc.__class__.__name__}: {exc}"
    return "importable"


def measure(h: Harness, p: Params) -> Outcome:
    """real_trial_ratio: the worker's wall (submit to summary) / the direct `pier run` process wall.

    Stops the docker items' worker afterwards.
    """
    found = Findings()
    with found.kept_on_crash():
        env_class = sb.import_path(ENV_CLASS)
        env_state = environment_state()
        t = time.monotonic()
        demo = sb.build_demo_selection(h.work / "demo", h.base_image, h.registry)
        build_s = time.monotonic() - t
        worker = h.docker_worker(p.pull_trials, pier_bin="pier")
        via: dict[str, Any] = {}

        def submit(job: str) -> Submitted:
            return h.submit(demo, job, n_concurrent=1, agent="oracle", task_id="001", timeout=900)

        if p.real_warmup:
            warm = submit("real-warmup")
            via["warmup_wall_s"] = warm.wall_s

        # Direct: Pier's default docker environment, as a user runs it (shared images: --no-delete).
        def direct_argv(job: str) -> list[str]:
            return [str(h.venv_bin / "pier"), "run", "-p", str(demo / "task_001"), "--agent", "oracle",
                    "-o", str(h.work / "pier-direct"), "--job-name", job, "-n", "1", "--no-delete",
                    "-y", "-q"]  # fmt: skip

        pairs: list[dict[str, Any]] = []
        for i in range(1, p.repeats + 1):
            job, direct_job = ("real", "direct") if i == 1 else (f"real-{i}", f"direct-{i}")
            direct: dict[str, Any] = {}

            def run_direct(job: str = direct_job, into: dict[str, Any] = direct) -> None:
                into["out"] = run_measured(direct_argv(job), h.env(), cwd=h.work)

            if p.real_concurrent:
                thread = threading.Thread(target=run_direct)
                thread.start()
                run = submit(job)
                thread.join()
                found.note("quick mode: the direct `pier run` and the worker's trial ran at the same time")
            elif i % 2:  # alternate which goes first
                run_direct()
                run = submit(job)
            else:
                run = submit(job)
                run_direct()
            direct_wall, _, direct_code, _, direct_err = direct["out"]
            record = json.loads((h.trials_dir(job) / "001-1.json").read_text())
            pairs.append({
                "wall_s": run.wall_s, "prepare_s": run.prepare_s, "reward": record.get("rewards"),
                "exception": record.get("exception_type"),
                "exception_message": record.get("exception_message"),
                "timings_sec": record.get("timings_sec"),
                "direct": {"wall_s": direct_wall, "exit_code": direct_code,
                           "reward": read_pier_reward(h.work / "pier-direct" / direct_job)},
            })  # fmt: skip
            if direct_code != 0:
                found.errors["pier_direct"] = direct_err[-800:]
        h.stop_workers([worker])
        found.raw["real"] = {
            "environment_class": env_class,
            "environment_class_state": env_state,
            "demo_build_s": build_s,
            "via_worker": via,
            "pairs": pairs,
            "direct_command": " ".join(direct_argv("direct")[1:]),
        }
        ratios = [pair["wall_s"] / pair["direct"]["wall_s"] for pair in pairs]
        ratio = statistics.median(ratios)
        failed = [pair["exception"] for pair in pairs if pair["exception"]]
        ok = not failed and all(pair["direct"]["exit_code"] == 0 for pair in pairs)
        last = pairs[-1]
        worker_reward = (last["reward"] or {}).get("reward")
        worker_s = statistics.median(pair["wall_s"] for pair in pairs)
        direct_s = statistics.median(pair["direct"]["wall_s"] for pair in pairs)
        found.figure(
            "real_trial_ratio",
            ratio,
            "<= 0.5",
            ratio <= 0.5 and ok,
            f"worker, median {worker_s:.2f} s (reward {worker_reward}"
            + (f", FAILED {failed}: {last['exception_message']}" if failed else "")
            + f") vs direct `pier run`, median {direct_s:.2f} s (reward {last['direct']['reward']}); "
            f"ratios paired; env class {env_state}",
            samples=ratios,
        )
        if env_state != "importable":
            found.note(f"{env_class} {env_state}: the worker path ran without the fast-teardown environment")
    return found.outcome()
