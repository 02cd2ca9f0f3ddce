"""Provider failures on real agents: a gateway that pushes back is not a model that failed.

One job per harness (Codex, Claude Code, mini-swe-agent; real Pier, the real
network policy and proxy, `submit --local`), its trials run side by side:
each task is the demo's task_001 with a marker in its instruction that tells
the scripted gateway how to fail that conversation (`tests/fixtures/model_gateway.py`):
429, 429 with Retry-After, 429 after one answered turn, 500, a connection
reset, a request never answered, and one 429 that never recovers. One task
asks the model for a command that fixes nothing (reward 0, healthy gateway).
Each fault ends as soon as its trial's first try has ended; that try must
end in the provider class with its status, the rerun (after the back-off)
must earn the reward, the never-recovering one must end in the
provider class and stay out of the reward mean, and the normal failure must
be a plain reward 0, tried once.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sciencebench.core.agentimages import load_agent_images
from sciencebench.core.paths import SelectionPaths
from tests.docker import test_real_agents as real_agents
from tests.docker.test_real_agents import (
    CANARY,
    CLAUDE_MODEL,
    FIX,
    MODEL,
    MSWEA_ADAPTER,
    SCIENCEBENCH,
    agent_env,
    write_env_file,
)
from tests.fixtures.gateway_lab import GatewayLab, TLSFiles

# The real-agent module's fixtures: the pinned artifacts and the test CA.
artifacts = real_agents.artifacts
tls = real_agents.tls


@pytest.fixture(scope="module")
def baked(demo_selection: Path, tls: TLSFiles, registry: str) -> None:
    """Every agent baked into the demo's agent image: only those this session has not baked yet."""
    base = real_agents.load_selection_agent_image(demo_selection)
    record = load_agent_images(SelectionPaths(demo_selection).agent_images)
    for agent in real_agents.AGENTS:
        if not record.find(base, agent):
            real_agents.bake(demo_selection, agent, tls, registry)


pytestmark = pytest.mark.docker

HTTP_PORT, HTTPS_PORT = 4000, 4443
SCRIPTS = [
    {"name": "noop", "match": "[gw-noop]", "commands": ["true"], "final": "Nothing to do."},
    {"name": "two-step", "match": "[gw-two-step]", "commands": ["true", FIX], "final": "Fixed."},
    {"name": "calc-fix", "match": "calc.sh", "commands": [FIX], "final": "Fixed add in calc.sh."},
]
# task id -> (marker in the instruction, the first try's provider status; None: not a provider failure)
CASES: dict[str, tuple[str, str | None]] = {
    "101": ("[gw-fault:429]", "429"),
    "102": ("[gw-fault:429-ra]", "429"),
    "103": ("[gw-fault:429-after-1] [gw-two-step]", "429"),
    "104": ("[gw-fault:500]", "500"),
    "105": ("[gw-fault:reset]", "reset"),
    "106": ("[gw-fault:hang]", "timeout"),
    "107": ("[gw-noop]", None),
    "108": ("[gw-fault:429-sticky]", "429"),
}
STICKY = "108"
NORMAL_FAILURE = "107"
# The cases each harness runs: every mode with Codex; with the two others every status class
# their own logs must show (429, 5xx, reset) and the normal failure, which keeps the suite's time
# in bounds (the never-answered request waits out the agent timeout; the sticky one four tries).
# Each harness's detector is unit-tested on every mode (tests/unit/test_provider_detect.py).
AGENT_CASES: dict[str, list[str]] = {
    "codex": list(CASES),
    "claude-code": ["101", "103", "104", "105", "107"],
    "mini-swe-agent": ["101", "102", "104", "105", "107"],
}
# The worker's provider back-off in this test (the default is 30 s).
BACKOFF_SEC = "4"


def provider_selection(demo: Path, root: Path) -> Path:
    """The demo selection's task_001 once per case, each with its marker, and the demo's baked images."""
    selection = root / "selection"
    selection.mkdir(parents=True)
    shutil.copytree(demo / ".sciencebench", selection / ".sciencebench")
    for task_id, (marker, _) in CASES.items():
        task = selection / f"task_{task_id}"
        shutil.copytree(demo / "task_001", task)
        instruction = (task / "instruction.md").read_text()
        (task / "instruction.md").write_text(f"{instruction}\n{marker}\n")
    return selection


@pytest.fixture(scope="module")
def selection(demo_selection: Path, baked: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Made once the demo selection has its baked images (their record is copied)."""
    return provider_selection(demo_selection, tmp_path_factory.mktemp("provider"))


@pytest.fixture(scope="module")
def faulty_lab(
    selection: Path, base_image: str, tls: TLSFiles, tmp_path_factory: pytest.TempPathFactory, state_dir: Path
) -> Iterator[GatewayLab]:
    root = tmp_path_factory.mktemp("faulty-gateway")
    with GatewayLab(
        image=base_image, root=root, selection=selection, key=CANARY, scripts=SCRIPTS, tls=tls,
        scratch=state_dir / "scratch", http_ports=(HTTP_PORT,), tls_ports=(HTTPS_PORT,),
    ) as running:  # fmt: skip
        yield running
    assert running.errors == [], running.errors


# agent -> env file, extra submit arguments, agent timeout multiplier (of the task's 120 s: the
# never-answered request ends there; mini-swe-agent's Python and LiteLLM start slowly under load).
HARNESSES: dict[str, tuple[str, list[str], str]] = {
    "codex": (
        f"MODEL={MODEL}\nOPENAI_API_KEY={CANARY}\nCODEX_BASE_URL=https://gw:{HTTPS_PORT}/v1\n",
        [],
        "0.5",
    ),
    "claude-code": (
        f"ANTHROPIC_AUTH_TOKEN={CANARY}\nANTHROPIC_BASE_URL=https://gw:{HTTPS_PORT}\n",
        # Two retries of a call instead of Claude Code's ten (waits growing to a minute).
        ["--model", CLAUDE_MODEL, "--agent-env", "CLAUDE_CODE_MAX_RETRIES=2"],
        "0.5",
    ),
    "mini-swe-agent": (
        f"OPENAI_API_KEY={CANARY}\nOPENAI_BASE_URL=http://gw:{HTTP_PORT}/v1\n",
        # Two tries of a call instead of mini-swe-agent's ten (4 s to 60 s apart): the run ends on it.
        ["--agent-import-path", MSWEA_ADAPTER, "--model", f"openai/{MODEL}", "--agent-kwarg",
         "model_class=litellm", "--agent-env", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=2"],
        "1.5",
    ),
}  # fmt: skip


def fault_mode(marker: str) -> str:
    return marker.split("]")[0].removeprefix("[gw-fault:")


def run_job(lab: GatewayLab, selection: Path, jobs: Path, agent: str, state_dir: Path) -> dict[str, Any]:
    """Submit one job of every case; recover the gateway once it has seen each fault; the records."""
    lab.recover(False)
    env_text, extra, multiplier = HARNESSES[agent]
    env_file = write_env_file(jobs.parent / "env-files", env_text)
    argv = [str(SCIENCEBENCH), "submit", "--path", str(selection), "--agent", agent, "--env-file",
            str(env_file), "--jobs-dir", str(jobs), "--job-name", agent, "--local",
            "--task-id", ",".join(AGENT_CASES[agent]), "--n-concurrent", str(len(AGENT_CASES[agent])),
            "--agent-timeout-multiplier", multiplier, *extra]  # fmt: skip
    env = agent_env(state_dir, SCIENCEBENCH_PROVIDER_BACKOFF_SEC=BACKOFF_SEC)
    # Each fault ends (its mode recovers) once its trial's first try has ended: its rerun has started.
    pending = {
        task: fault_mode(marker)
        for task, (marker, status) in CASES.items()
        if status and task != STICKY and task in AGENT_CASES[agent]
    }
    scratch = state_dir / "scratch"
    started = time.monotonic()
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        while proc.poll() is None and pending:
            for task in [t for t in pending if any(scratch.glob(f"*/{t}-1.*/try-2"))]:
                lab.recover(mode=pending.pop(task))
            time.sleep(0.5)
        output, _ = proc.communicate(timeout=900)
    records = {
        path.stem.split("-")[0]: json.loads(path.read_text())
        for path in (jobs / agent / ".sciencebench" / "trials").glob("*.json")
    }
    summary = json.loads((jobs / agent / "summary.json").read_text())
    return {"records": records, "summary": summary, "output": output, "seconds": time.monotonic() - started}


@pytest.mark.parametrize("agent", list(HARNESSES))
def test_provider_failures_are_their_own_class_and_rerun(
    agent: str, faulty_lab: GatewayLab, baked: None, selection: Path, tmp_path: Path, state_dir: Path
) -> None:
    run = run_job(faulty_lab, selection, tmp_path / "jobs", agent, state_dir)
    records = run["records"]
    assert sorted(records) == sorted(AGENT_CASES[agent]), run["output"][-3000:]
    for task_id in AGENT_CASES[agent]:
        status = CASES[task_id][1]
        record = records[task_id]
        if task_id == STICKY:
            # Never recovered: every try a provider failure, the last one the record's.
            assert record["provider_status"] == status, (task_id, record)
            assert record["tries"] == 4, record  # the first try and --provider-retries' default 3
            assert all(t["provider_status"] == status for t in record["earlier_tries"]), record
        elif status is None:
            # A normal failure on a healthy gateway: reward 0, tried once, not the provider's.
            assert record["provider_status"] is None and record["rewards"] == {"reward": 0.0}, record
            assert record["tries"] == 1, record
        else:
            # The first try failed on the provider with this status; the rerun earned the reward.
            assert record["provider_status"] is None and record["rewards"] == {"reward": 1.0}, (
                task_id,
                record,
            )
            assert record["tries"] >= 2, record
            assert record["earlier_tries"][0]["provider_status"] == status, (task_id, record)
    # The summary: the sticky trial counted apart, out of the reward mean.
    rows = {row["task_id"].removeprefix("task_"): row for row in run["summary"]["rows"]}
    if STICKY in rows:
        assert rows[STICKY]["failure_class"] == "provider_error", rows[STICKY]
    assert rows[NORMAL_FAILURE]["failure_class"] != "provider_error", rows[NORMAL_FAILURE]
    print(f"{agent}: {len(CASES)} trials in {run['seconds']:.0f}s")
