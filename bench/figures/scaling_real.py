"""Item 8: real trials on worker containers: throughput with 2 containers / with 1 (2 slots each).

The cluster is deployed the way docs/deployment.md says, by the fixtures of
tests/docker/test_cluster.py (tests/fixtures/cluster.py): the control plane
from compose/control-plane.yml, two worker hosts from compose/worker-host.yml,
images from scripts/cluster-images.sh (build/cluster/images.env). The
workload is the demo selection (oracle, real Pier) with `--n-attempts` so
that it has enough trials to keep 4 slots busy, `--n-concurrent 4`: on one
worker container (the other stopped) and on two. The configurations
alternate, repeated `p.real_scaling_repeats` times, so drift in the
machine's load hits both alike. A makespan is the wall time of the login
node's `sciencebench submit --wait` process (submit to summary). The figure
is the median of the paired ratios (1 container / 2 containers); their
minimum and maximum are the spread.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from bench import sb
from bench.harness import REPO, Harness
from bench.params import Params
from bench.report import Findings, Outcome
from tests.fixtures.cluster import ClusterImages, ControlPlane, Login, SharedPaths, WorkerHost, docker_socket

SLOTS_PER_CONTAINER = 2
WORKER_UID = WORKER_GID = 10123
IMAGES_ENV = REPO / "build" / "cluster" / "images.env"


def cluster_images() -> ClusterImages:
    """The images of scripts/cluster-images.sh, from build/cluster/images.env."""
    values = dict(
        line.split("=", 1) for line in IMAGES_ENV.read_text().splitlines() if "=" in line and line[0] != "#"
    )
    return ClusterImages(
        redis=values["SB_CLUSTER_REDIS_IMAGE"],
        worker=values["SB_CLUSTER_WORKER_IMAGE"],
        flower=values["SB_CLUSTER_FLOWER_IMAGE"],
        proxy=values["SB_CLUSTER_PROXY_IMAGE"],
    )


def _host(control: ControlPlane, shared: SharedPaths, work: Path, prefix: str, key: str,
          images: ClusterImages) -> WorkerHost:  # fmt: skip
    hostname = f"{prefix}-{key}"
    socket = docker_socket()
    return WorkerHost(hostname, hostname, work, {
        "SCIENCEBENCH_WORKER_IMAGE": images.worker,
        "SCIENCEBENCH_BROKER_URL": control.internal_broker_url,
        "SCIENCEBENCH_HOSTNAME": hostname,
        "SCIENCEBENCH_CONCURRENCY": str(SLOTS_PER_CONTAINER),
        "SCIENCEBENCH_JOBS_DIR": str(shared.jobs),
        "SCIENCEBENCH_SELECTIONS_DIR": str(shared.selections),
        "SCIENCEBENCH_ENV_FILES_DIR": str(shared.profiles),
        "SCIENCEBENCH_UID": str(WORKER_UID),
        "SCIENCEBENCH_GID": str(WORKER_GID),
        "SCIENCEBENCH_DOCKER_SOCKET": str(socket),
        "SCIENCEBENCH_REGISTRY_AUTH_DIR": str(work / "registry-auth"),
        "SCIENCEBENCH_PROXY_IMAGE": images.proxy,
        "SCIENCEBENCH_STOP_GRACE_PERIOD": "60s",
        "SCIENCEBENCH_CONTROL_PLANE_NETWORK": control.network,
    })  # fmt: skip


def _run(login: Login, selection: Path, job: str, attempts: int) -> dict[str, Any]:
    """One timed `submit --wait`; its makespan and the trials' harness times and hosts."""
    started = time.monotonic()
    proc = login.submit(selection, job, "--n-attempts", str(attempts), "--n-concurrent", "4")
    out, err = proc.communicate(timeout=3600)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"job {job} exited {proc.returncode}: {out[-1500:]}{err[-1500:]}")
    trials = login.jobs / job / ".sciencebench" / "trials"
    records = [json.loads(path.read_text()) for path in sorted(trials.glob("*.json"))]
    return {
        "makespan_s": round(wall, 2),
        "trials": len(records),
        "harness_s_mean": round(statistics.mean(r["timings_sec"]["harness"] for r in records), 2),
        "workers": sorted({r["worker"] for r in records}),
    }


def measure(h: Harness, p: Params) -> Outcome:
    """scaling_real_1_to_2: median over paired runs of makespan(1 container) / makespan(2 containers)."""
    found = Findings()
    with found.kept_on_crash():
        images = cluster_images()
        prefix = f"sbbench{secrets.token_hex(3)}"
        work = h.work / "cluster"
        work.mkdir(parents=True, exist_ok=True)
        shared = SharedPaths(work / "shared", WORKER_UID, WORKER_GID).create()
        control = ControlPlane(f"{prefix}-cp", work, images)
        login = Login(control.broker_url, shared.jobs)
        hosts = [_host(control, shared, work, prefix, key, images) for key in ("a", "b")]
        attempts = p.real_scaling_trials // 2  # the demo selection has two tasks
        runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
        try:
            # Built here, so present on the Engine: no run pays for a pull.
            selection = sb.build_demo_selection(shared.selections / "demo", h.base_image, h.registry)
            control.up()
            for host in hosts:
                host.up()
            for host in hosts:
                host.wait_ready()
            running = 2
            for repeat in range(p.real_scaling_repeats):
                # Both containers run at first: the first pair starts with 2 (no restart needed).
                for containers in (2, 1) if repeat % 2 == 0 else (1, 2):
                    if containers == 1 and running == 2:
                        hosts[1].stop()
                        running = 1
                    elif containers == 2 and running == 1:
                        hosts[1].start_again()
                        running = 2
                    result = _run(login, selection, f"scale-{containers}c-{repeat}", attempts)
                    shown = f"makespan {result['makespan_s']:.1f} s, harness {result['harness_s_mean']:.1f} s"
                    print(f"  {containers} container(s), run {repeat + 1}: {shown}", flush=True)
                    runs[containers].append(result)
        finally:
            for host in hosts:
                host.down()
            control.down()
            shutil.rmtree(work, ignore_errors=True)
        ratios = [one["makespan_s"] / two["makespan_s"] for one, two in zip(runs[1], runs[2], strict=True)]
        ratio = statistics.median(ratios)
        found.raw["scaling_real"] = {
            "trials_per_run": p.real_scaling_trials,
            "slots_per_container": SLOTS_PER_CONTAINER,
            "n_concurrent": 4,
            "runs_1_container": runs[1],
            "runs_2_containers": runs[2],
            "ratios": [round(r, 3) for r in ratios],
            "spread": {"min": round(min(ratios), 3), "max": round(max(ratios), 3)},
        }
        one = statistics.median(r["makespan_s"] for r in runs[1])
        two = statistics.median(r["makespan_s"] for r in runs[2])
        harness = {n: statistics.mean(r["harness_s_mean"] for r in runs[n]) for n in (1, 2)}
        found.figure(
            "scaling_real_1_to_2",
            ratio,
            None,
            None,
            f"{p.real_scaling_trials} real oracle trials (demo selection), --n-concurrent 4: median makespan "
            f"1 container x 2 slots {one:.1f} s / 2 containers {two:.1f} s; paired ratios "
            f"{', '.join(f'{r:.2f}' for r in ratios)} (min {min(ratios):.2f}, max {max(ratios):.2f}) "
            f"over {p.real_scaling_repeats} alternating repeat(s); mean harness stage per trial "
            f"{harness[1]:.1f} s (1 container) vs {harness[2]:.1f} s (2): both share this machine's "
            f"{os.cpu_count()} cores",
            samples=ratios,
        )
    return found.outcome()
