"""A registry that pushes back is waited out, per registry across the cluster (real Redis, workers, Engines).

The registry is the loopback one behind the throttling proxy
(`tests/fixtures/throttled_registry.py`): 429 `toomanyrequests` with
Retry-After and RateLimit headers past N manifest GETs per window, HEAD
free, as Docker Hub. Two worker hosts, each on a Docker Engine of its own,
pull the trials' images through it; Pier is the fake one. A 429 storm ends
with every trial completed and no error, whatever --max-retries says (0).
A registry that stays shut past the registry deadline ends its trial as the
registry's failure: not in the mean, shown by `status`, rerun by `retry --failed`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.coordination.registries import RedisRegistryMarks
from tests.fixtures.engines import EngineFactory, loopback_registry
from tests.fixtures.registry import Published
from tests.fixtures.services import Worker
from tests.fixtures.throttled_registry import Throttle, serve, through
from tests.integration.conftest import FAKE_WORKER, Cluster

pytestmark = pytest.mark.integration

MIB = 1 << 20


def _records(cluster: Cluster, job: str) -> list[dict[str, Any]]:
    trials = cluster.jobs_dir / job / ".sciencebench" / "trials"
    return [json.loads(path.read_text()) for path in sorted(trials.glob("*.json"))]


def _workers(cluster: Cluster, engines: EngineFactory, kit_image: str, **settings: str) -> None:
    env = {**cluster.env, **{f"SCIENCEBENCH_{name.upper()}": value for name, value in settings.items()}}
    hosts = engines("rh0", "rh1", proxy_image=kit_image)
    workers = [
        Worker(f"w{n}", env, cluster.root, 2, FAKE_WORKER, engine=host).start()
        for n, host in enumerate(hosts)
    ]
    cluster.workers += workers
    for worker in workers:
        worker.wait_ready()


def _selection(cluster: Cluster, name: str, refs: list[str]) -> Path:
    """Task i runs image i (its agent and verifier image), each trial a quick success of the fake Pier."""
    path = cluster.selection({f"{n:03d}": {} for n in range(1, len(refs) + 1)}, root=cluster.root / name,
                             agent_image=refs[0], verifier_image=refs[0])  # fmt: skip
    for n, ref in enumerate(refs, start=1):
        toml = path / f"task_{n:03d}" / "task.toml"
        toml.write_text(toml.read_text().replace(refs[0], ref))
    return path


def test_a_429_storm_ends_with_every_trial_completed_and_no_error(
    cluster: Cluster, engines: EngineFactory, kit_image: str, published: Published
) -> None:
    uid = uuid.uuid4().hex[:8]
    originals = [published.unique(f"storm-{n}-{uid}", size=MIB) for n in range(6)]
    # 2 manifest GETs per 3 s, and blobs at 8 MiB/s: a pull takes a while, as from a real registry.
    throttle = Throttle(upstream=loopback_registry(), limit=2, window_sec=3.0, bytes_per_sec=8 * MIB)
    with serve(throttle) as proxy:
        _workers(cluster, engines, kit_image, registry_backoff_sec="0.5", registry_backoff_max_sec="2",
                 registry_deadline_sec="120")  # fmt: skip
        path = _selection(cluster, "storm", [through(ref, proxy) for ref in originals])
        done = cluster.submit(path, "storm", "--n-concurrent", "4", "--max-retries", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    records = _records(cluster, "storm")
    assert len(records) == 6
    assert all(r["rewards"] == {"reward": 1.0} and r["exception_type"] is None for r in records), records
    assert all(r["registry_status"] is None for r in records)
    waited = [t for r in records for t in r["earlier_tries"]]
    assert waited and {t["registry_status"] for t in waited} == {"429"}, waited  # the storm was real
    assert throttle.refused(), throttle.log
    held = [t for t in waited if "held back" in (t["exception_message"] or "")]
    assert held, waited  # trials the cluster's back-off kept from asking at all
    gets = [e for e in throttle.log if e["method"] == "GET" and e["status"] == 200]
    assert len({e["path"] for e in gets}) == 6  # each image's manifest served once it was its turn
    summary = json.loads((cluster.jobs_dir / "storm" / "summary.json").read_text())
    assert summary["stats"]["n_scored"] == 6 and summary["stats"]["registry_errors"] == {}


def test_past_the_deadline_a_trial_ends_as_the_registrys_failure_and_retry_failed_reruns_it(
    cluster: Cluster, engines: EngineFactory, kit_image: str, published: Published
) -> None:
    uid = uuid.uuid4().hex[:8]
    shut, open_ = (published.unique(f"deadline-{n}-{uid}", size=MIB) for n in range(2))
    # Every manifest GET refused; the RateLimit headers name a window of 20 s, past the 5 s deadline.
    throttle = Throttle(upstream=loopback_registry(), limit=0, window_sec=20.0)
    with serve(throttle) as proxy:
        _workers(cluster, engines, kit_image, registry_backoff_sec="0.5", registry_deadline_sec="5")
        path = _selection(cluster, "deadline", [through(shut, proxy), open_])
        cluster.submit(path, "deadline", "--n-concurrent", "2")
        by_task = {r["task_id"]: r for r in _records(cluster, "deadline")}
        assert set(by_task) == {"001", "002"}
        failed, passed = by_task["001"], by_task["002"]
        assert failed["registry_status"] == "429" and failed["exception_type"] == "RegistryError", failed
        assert failed["stage"] == "pull" and "toomanyrequests" in failed["exception_message"]
        assert failed["tries"] == 1  # the registry's wait (20 s) ends past the deadline: no wait at all
        assert passed["rewards"] == {"reward": 1.0}
        summary = json.loads((cluster.jobs_dir / "deadline" / "summary.json").read_text())
        classes = {row["task_id"]: row["failure_class"] for row in summary["rows"]}
        assert classes == {"task_001": "registry_error", "task_002": ""}
        stats = summary["stats"]
        assert stats["registry_errors"] == {"429": 1} and stats["n_scored"] == 1 and stats["errors"] == {}
        (evals,) = stats["evals"]
        assert evals["n_trials"] == 1 and evals["metrics"] == {"mean": 1.0}  # not in the mean
        shown = cluster.cli("status", "deadline", "--jobs-dir", str(cluster.jobs_dir))
        lines = [line for line in shown.stdout.splitlines() if line.startswith(f"registry {proxy}:")]
        assert len(lines) == 1 and "rate-limited (429), next try in" in lines[0], shown.stdout + shown.stderr
        throttle.limit = None  # the registry is back; the cluster's back-off from it runs out first
        coord = RedisCoordinator(cluster.redis.url)
        mark = RedisRegistryMarks(coord).state(proxy)
        assert mark is not None and mark.status == "429"
        time.sleep(mark.wait_sec(coord.now()) + 0.2)
        again = cluster.cli("retry", "deadline", "--failed", "--wait", "--jobs-dir", str(cluster.jobs_dir))
    assert again.returncode == 0, again.stdout + again.stderr
    rerun = {r["task_id"]: r for r in _records(cluster, "deadline")}["001"]
    assert rerun["rewards"] == {"reward": 1.0} and rerun["registry_status"] is None, rerun
    assert os.path.exists(cluster.jobs_dir / "deadline" / "summary.json")
