"""Real `pier run` with IsolatedDockerEnvironment: both modes, a separate verifier, timing.

The egress trial uses ProbeAgent (below, imported by Pier through
`--agent-import-path`): it declares a provider allowlist, so Pier and the
environment give it the proxy, and its `run` records what it can reach. Its
allowlist and gateway are `localhost` so that even allowed requests stay on
the proxy's loopback: no traffic leaves the trial's networks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pier.agents.base import BaseAgent
from pier.environments.base import BaseEnvironment
from pier.models.agent.context import AgentContext
from pier.models.agent.network import NetworkAllowlist

from sciencebench.core.capacity import DEFAULT_MEMORY_MB

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
PIER = Path(sys.executable).parent / "pier"
ENVIRONMENT = "sciencebench.network.environment:IsolatedDockerEnvironment"

# (name, command) pairs ProbeAgent runs with the agent's environment; each
# prints curl's "<http code> <exit code>".
PROBES = {
    "proxy_env": 'test -n "$HTTPS_PROXY" && echo set',
    "denied_source": "curl -s -m 5 -o /dev/null -w '%{http_code}' http://github.com/; echo \" $?\"",
    "allowed_provider": (
        "curl -s -m 5 -o /dev/null -w '%{http_code}' --noproxy '' -x \"$HTTP_PROXY\" "
        'http://localhost/; echo " $?"'
    ),
    "allowed_gateway_port": (
        "curl -s -m 5 -o /dev/null -w '%{http_code}' --noproxy '' -x \"$HTTP_PROXY\" "
        'http://localhost:4000/; echo " $?"'
    ),
    "other_port_same_host": (
        "curl -s -m 5 -o /dev/null -w '%{http_code}' --noproxy '' -x \"$HTTP_PROXY\" "
        'http://localhost:4001/; echo " $?"'
    ),
    "route": "ip route",
}


class ProbeAgent(BaseAgent):
    """A harness with inference egress that only probes the network and writes probe.json."""

    @staticmethod
    def name() -> str:
        return "sciencebench-network-probe"

    def version(self) -> str:
        return "1"

    def network_allowlist(self) -> NetworkAllowlist:
        return NetworkAllowlist(domains=["localhost"])

    async def setup(self, environment: BaseEnvironment) -> None:
        pass

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        results: dict[str, str] = {}
        for name, command in PROBES.items():
            result = await environment.exec(command, env=environment.agent_process_env(None), timeout_sec=30)
            results[name] = (result.stdout or "").strip()
        (self.logs_dir / "probe.json").write_text(json.dumps(results, indent=2))


@dataclass
class Task:
    path: Path
    verifier_image: str


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory, base_image: str) -> Iterator[Task]:
    """A one-task selection with a separate verifier image built locally from the base image."""
    root = tmp_path_factory.mktemp("pier-run") / "netpolicy"
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "environment" / "Dockerfile").write_text(f"FROM {base_image}\n")
    (root / "instruction.md").write_text("Do nothing.\n")
    test_sh = root / "tests" / "test.sh"
    test_sh.write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    test_sh.chmod(0o755)
    (root / "tests" / "Dockerfile").write_text(
        f"FROM {base_image}\nCOPY test.sh /tests/test.sh\nRUN chmod 755 /tests/test.sh\n"
    )
    verifier_image = f"sciencebench-test/netpolicy-verifier:{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["docker", "build", "-q", "-t", verifier_image, str(root / "tests")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (root / "task.toml").write_text(
        f"""schema_version = "1.3"
[task]
name = "sciencebench/network-policy-pier-run"
[agent]
timeout_sec = 120.0
[verifier]
timeout_sec = 120.0
[environment]
docker_image = "{base_image}"
allow_internet = false
[verifier.environment]
docker_image = "{verifier_image}"
allow_internet = false
"""
    )
    try:
        yield Task(root, verifier_image)
    finally:
        subprocess.run(["docker", "image", "rm", "-f", verifier_image], capture_output=True, timeout=120)


def pier_run(task: Task, jobs: Path, job: str, *extra: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
        SCIENCEBENCH_PROXY_IMAGE=os.environ["SB_SQUID_IMAGE"],
    )
    argv = [str(PIER), "run", "--path", str(task.path), "--jobs-dir", str(jobs), "--job-name", job,
            "--n-attempts", "1", "--n-concurrent", "1", "--no-delete", "--yes", "--quiet",
            "--env", "docker", "--environment-import-path", ENVIRONMENT, *extra]  # fmt: skip
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (trial_dir,) = [p for p in (jobs / job).iterdir() if p.is_dir()]
    result: dict[str, Any] = json.loads((trial_dir / "result.json").read_text())
    result["_trial_dir"] = str(trial_dir)
    return result


def seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def records(trial_dir: Path) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in trial_dir.glob("network-policy-*.json")}


def test_nop_trial_and_its_separate_verifier_run_without_network(task: Task, tmp_path: Path) -> None:
    result = pier_run(
        task, tmp_path / "jobs", "nop", "--agent", "nop", "--ek", 'inference_urls=["http://gw:4000/v1"]'
    )
    assert result["exception_info"] is None, result["exception_info"]
    assert result["verifier_result"]["rewards"] == {"reward": 1.0}
    trial_dir = Path(result["_trial_dir"])
    found = records(trial_dir)
    trial = trial_dir.name
    assert set(found) == {f"network-policy-{trial}.json", f"network-policy-{trial}__verifier__trial.json"}
    for record in found.values():
        assert record["network_mode"] == "none"
        assert record["internal_network"] is None
        assert record["host_gateway"] is None and record["proxy_forwarding"] is False
    # The task names no memory_mb: both environments got the default request as their memory limit,
    # swap none, and passed the inspection that requires exactly that of the Engine's HostConfig.
    overrides = sorted((trial_dir / "network-policy").glob("*/docker-compose-policy.json"))
    assert len(overrides) == 2, overrides
    for path in overrides:
        main = json.loads(path.read_text())["services"]["main"]
        limit = f"{DEFAULT_MEMORY_MB}M"
        assert (main["deploy"]["resources"]["limits"]["memory"], main["memswap_limit"]) == (limit, limit)
    # stop_signal SIGKILL: the agent environment's `compose down` (between the
    # agent and the separate verifier) no longer waits out a 10 s grace period.
    assert seconds(result["agent_execution"]["finished_at"], result["verifier"]["started_at"]) < 6


def test_egress_trial_reaches_only_its_allowlist_through_the_proxy(task: Task, tmp_path: Path) -> None:
    result = pier_run(
        task,
        tmp_path / "jobs",
        "probe",
        "--agent-import-path",
        "tests.docker.test_network_pier_run:ProbeAgent",
        "--ek",
        'inference_urls=["http://localhost:4000/v1"]',
    )
    assert result["exception_info"] is None, result["exception_info"]
    trial_dir = Path(result["_trial_dir"])
    probe = json.loads((trial_dir / "agent" / "probe.json").read_text())
    assert probe["proxy_env"] == "set"
    assert probe["denied_source"] == "403 0"
    # The gateway host is allowed on its own port only, even on 80 where the allowlist names it.
    assert probe["allowed_provider"] == "403 0"
    # Allowed: squid forwards to its own loopback, where nothing listens (503).
    assert probe["allowed_gateway_port"] == "503 0"
    assert probe["other_port_same_host"] == "403 0"
    assert "default" not in probe["route"]
    found = records(trial_dir)
    agent_record = found[f"network-policy-{trial_dir.name}.json"]
    assert agent_record["network_mode"] == "isolated-allowlist"
    assert agent_record["inference_domains"] == ["localhost"]
    assert agent_record["gateway_authorities"] == ["localhost:4000"]
    assert agent_record["proxy_image"] == os.environ["SB_SQUID_IMAGE"]
    verifier_record = found[f"network-policy-{trial_dir.name}__verifier__trial.json"]
    assert verifier_record["network_mode"] == "none"
