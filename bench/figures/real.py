"""Item 5: a trivial real trial (oracle, demo task 001) through a worker / a direct `pier run`."""

from __future__ import annotations

import json
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
        argv = [str(h.venv_bin / "pier"), "run", "-p", str(demo / "task_001"), "--agent", "oracle",
                "-o", str(h.work / "pier-direct"), "--job-name", "direct", "-n", "1", "--no-delete",
                "-y", "-q"]  # fmt: skip
        direct: dict[str, Any] = {}

        def run_direct() -> None:
            direct["out"] = run_measured(argv, h.env(), cwd=h.work)

        if p.real_concurrent:
            thread = threading.Thread(target=run_direct)
            thread.start()
            run = submit("real")
            thread.join()
            found.note("quick mode: the direct `pier run` and the worker's trial ran at the same time")
        else:
            run_direct()
            run = submit("real")
        direct_wall, _, direct_code, _, direct_err = direct["out"]
        direct_reward = read_pier_reward(h.work / "pier-direct" / "direct")
        h.stop_workers([worker])
        record = json.loads((h.trials_dir("real") / "001-1.json").read_text())
        via.update(
            {
                "wall_s": run.wall_s,
                "prepare_s": run.prepare_s,
                "reward": record.get("rewards"),
                "exception": record.get("exception_type"),
                "timings_sec": record.get("timings_sec"),
            }
        )
        found.raw["real"] = {
            "environment_class": env_class,
            "environment_class_state": env_state,
            "demo_build_s": build_s,
            "via_worker": via,
            "direct": {
                "wall_s": direct_wall,
                "exit_code": direct_code,
                "reward": direct_reward,
                "command": " ".join(argv[1:]),
            },
        }
        if direct_code != 0:
            found.errors["pier_direct"] = direct_err[-800:]
        ratio = run.wall_s / direct_wall
        failed = record.get("exception_type")
        worker_reward = (record.get("rewards") or {}).get("reward")
        found.figure(
            "real_trial_ratio",
            ratio,
            "<= 0.5",
            ratio <= 0.5 and not failed and direct_code == 0,
            f"worker {run.wall_s:.2f} s (reward {worker_reward}"
            + (f", FAILED {failed}: {record.get('exception_message')}" if failed else "")
            + f") vs direct `pier run` {direct_wall:.2f} s (reward {direct_reward}); env class {env_state}",
        )
        if env_state != "importable":
            found.note(f"{env_class} {env_state}: the worker path ran without the fast-teardown environment")
    return found.outcome()
