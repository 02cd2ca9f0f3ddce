"""The cluster backs off from a gateway that pushes back (real Redis, real workers, fake Pier).

The gateway is the scripted one (`tests/fixtures/model_gateway.py`) on
loopback, answering 429 to a model call while 2 others are in flight, each
answer taking a while. Pier is the fake one acting as an agent: its trials
make their model calls in turn to the job's gateway and stop at the first
that fails, leaving each call in the proxy's access-log format, from which
the worker reads the provider failure. A job of 12 trials at
--n-concurrent 6 must end with every reward, the gateway's log must show the
concurrency fall to what it accepts, and `status` must show the authority's
limit and why.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.model_gateway import Server, serve
from tests.fixtures.services import VENV_BIN, Worker, free_port
from tests.integration.conftest import FAKE_WORKER, Cluster

pytestmark = pytest.mark.integration

KEY = "sk-backoff-5d1f"
ACCEPTS = 2  # concurrent model calls the gateway answers; more get 429
CALLS = 3  # model calls per trial
TRIALS = 12
N_CONCURRENT = 6


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port = free_port()
    log = tmp_path / "gateway.jsonl"
    config: dict[str, Any] = {
        "key_sha256": hashlib.sha256(KEY.encode()).hexdigest(), "log": str(log),
        "listen": [{"port": port}], "max_concurrent": ACCEPTS, "delay_sec": 0.4,
    }  # fmt: skip
    servers: list[Server] = serve(config, host="127.0.0.1")
    yield f"http://127.0.0.1:{port}/v1", log
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_gateway_that_pushes_back_gets_fewer_concurrent_calls(
    cluster: Cluster, gateway: tuple[str, Path], tmp_path: Path
) -> None:
    url, log = gateway
    # Workers with a short provider back-off (the default's first wait is 30 s), whose operator
    # allows the gateway on loopback (an internal address no job may name unless listed).
    env = {
        **cluster.env,
        "SCIENCEBENCH_GATEWAYS": url,
        "SCIENCEBENCH_PROVIDER_BACKOFF_SEC": "1",
        "SCIENCEBENCH_PROVIDER_BACKOFF_MAX_SEC": "4",
    }
    workers = [Worker(f"w{n}", env, cluster.root, N_CONCURRENT // 2, FAKE_WORKER).start() for n in range(2)]
    cluster.workers += workers
    for worker in workers:
        worker.wait_ready()
    path = cluster.selection({f"{n:03d}": {"gateway_calls": CALLS} for n in range(1, TRIALS + 1)})
    env_file = tmp_path / "provider.env"
    env_file.write_text(f"OPENAI_API_KEY={KEY}\nOPENAI_BASE_URL={url}\n")
    env_file.chmod(0o600)
    started = time.monotonic()
    done = subprocess.run(
        [str(VENV_BIN / "sciencebench"), "submit", "--path", str(path), "--agent", "mini-swe-agent",
         "--model", "openai/m", "--env-file", str(env_file), "--jobs-dir", str(cluster.jobs_dir),
         "--job-name", "backoff", "--n-concurrent", str(N_CONCURRENT), "--provider-retries", "10", "--wait"],
        env=cluster.env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    records = [
        json.loads(p.read_text())
        for p in (cluster.jobs_dir / "backoff" / ".sciencebench" / "trials").glob("*.json")
    ]
    assert len(records) == TRIALS
    assert all(r["rewards"] == {"reward": 1.0} and r["provider_status"] is None for r in records), records
    reruns = [t for r in records for t in r["earlier_tries"]]
    assert reruns and {t["provider_status"] for t in reruns} == {"429"}, reruns  # the back-off was needed
    # The gateway's view: pushed past what it accepts at first, then the calls fell to what it accepts.
    calls = [json.loads(line) for line in log.read_text().splitlines() if '"inflight"' in line]
    first, last = calls[: len(calls) // 3], calls[-len(calls) // 3 :]
    refused = [c for c in calls if c["status"] == 429]
    assert max(c["inflight"] for c in first) > ACCEPTS

    def mean_inflight(window: list[dict[str, Any]]) -> float:
        return round(sum(c["inflight"] for c in window) / len(window), 2)

    assert mean_inflight(last) <= ACCEPTS < max(c["inflight"] for c in first)
    late_refused = sum(c["status"] == 429 for c in last)
    assert late_refused <= len(last) // 4, [(c["inflight"], c["status"]) for c in last]
    # `status` names the authority's limit and why it moved.
    shown = cluster.cli("status", "backoff", "--jobs-dir", str(cluster.jobs_dir))
    authority = url.removeprefix("http://").split("/", 1)[0]
    lines = [line for line in shown.stdout.splitlines() if line.startswith(f"gateway {authority}:")]
    assert len(lines) == 1, shown.stdout + shown.stderr
    (line,) = lines
    assert "limit" in line and "429" in line, shown.stdout
    figures = {
        "wall_sec": round(wall, 1), "trials": TRIALS, "model_calls": len(calls), "refused_429": len(refused),
        "reruns": len(reruns), "max_inflight_first_third": max(c["inflight"] for c in first),
        "max_inflight_last_third": max(c["inflight"] for c in last), "refused_last_third": late_refused,
        "mean_inflight_first_third": mean_inflight(first), "mean_inflight_last_third": mean_inflight(last),
    }  # fmt: skip
    print("back-off figures:", json.dumps(figures))
