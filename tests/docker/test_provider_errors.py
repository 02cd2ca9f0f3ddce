"""Provider failures on real agents: a gateway that pushes back is not a model that failed.

One job per harness (Codex, Claude Code, mini-swe-agent; real Pier, the real
network policy and proxy, `submit --local`), the three jobs and all their
trials side by side on one gateway: each task is the demo's task_001 with a
marker in its instruction that tells the scripted gateway how to fail that
conversation, tagged with the harness so each job recovers only its own
faults (`tests/fixtures/model_gateway.py`):
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
# case -> (fault mode, None: healthy; other markers; the first try's provider status, None: not provider's)
CASES: dict[str, tuple[str | None, str, str | None]] = {
    "01": ("429", "", "429"),
    "02": ("429-ra", "", "429"),
    "03": ("429-after-1", "[gw-two-step]", "429"),
    "04": ("500", "", "500"),
    "05": ("reset", "", "reset"),
    "06": ("hang", "", "timeout"),
    "07": (None, "[gw-noop]", None),
    "08": ("429-sticky", "", "429"),
}
STICKY = "08"
STICKY_RETRIES = 1  # Codex's job's --provider-retries (only Codex runs the sticky case)
NORMAL_FAILURE = "07"
# The cases each harness runs: every mode with Codex; with the two others every status class
# their own logs must show (429, 5xx, reset; mini-swe-agent's 429 with Retry-After, which it reads
# from the proxy's log) and the normal failure, which keeps the suite's time
# in bounds (the never-answered request waits out the agent timeout; the sticky one is tried
# twice: Codex's job runs with --provider-retries 1, the default of 3 is unit-tested).
# Each harness's detector is unit-tested on every mode (tests/unit/test_provider_detect.py).
AGENT_CASES: dict[str, list[str]] = {
    "codex": list(CASES),
    "claude-code": ["01", "03", "04", "05", "07"],
    "mini-swe-agent": ["02", "04", "05", "07"],
}
# The three jobs run side by side on one gateway: each harness has its own tasks (task_1NN for
# Codex, 2NN, 3NN), whose fault markers carry the harness as their tag, so recovering one
# harness's fault leaves the same mode failing for the others.
TASK_PREFIX = {"codex": "1", "claude-code": "2", "mini-swe-agent": "3"}
# Each job's --n-concurrent: 12 trials at once in all. Every running trial holds two networks
# (egress, internal) and the Engine's default address pools hold 31 (with its own bridge), so
# the 18 trials cannot all run at once. mini-swe-agent's job is the longest: all its trials at once.
CONCURRENT = {"codex": 4, "claude-code": 3, "mini-swe-agent": 5}
# The worker's provider back-off in this test (the default is 30 s).
BACKOFF_SEC = "4"
# The three jobs together (each alone, under load: Codex 120 s, Claude Code 70 s, mini-swe-agent 180 s).
JOBS_TIMEOUT_SEC = 900


def task_id(agent: str, case: str) -> str:
    return TASK_PREFIX[agent] + case


def fault_key(agent: str, case: str) -> str | None:
    """The case's fault as the gateway recovers it (MODE@TAG), None for a healthy case."""
    mode = CASES[case][0]
    return None if mode is None else f"{mode}@{agent}"


def marker(agent: str, case: str) -> str:
    key, others = fault_key(agent, case), CASES[case][1]
    return " ".join([*([f"[gw-fault:{key}]"] if key else []), *([others] if others else [])])


def provider_selection(demo: Path, root: Path) -> Path:
    """The demo's task_001 once per harness and case, each with its marker, and the demo's baked images."""
    selection = root / "selection"
    selection.mkdir(parents=True)
    shutil.copytree(demo / ".sciencebench", selection / ".sciencebench")
    for agent, cases in AGENT_CASES.items():
        for case in cases:
            task = selection / f"task_{task_id(agent, case)}"
            shutil.copytree(demo / "task_001", task)
            instruction = (task / "instruction.md").read_text()
            (task / "instruction.md").write_text(f"{instruction}\n{marker(agent, case)}\n")
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
# never-answered request ends there; mini-swe-agent's Python and LiteLLM start slowly under load;
# Codex's and Claude Code's longer timeouts cost little beside mini-swe-agent's job, and a slow
# start among twelve trials is not taken for a request never answered).
HARNESSES: dict[str, tuple[str, list[str], str]] = {
    "codex": (
        f"MODEL={MODEL}\nOPENAI_API_KEY={CANARY}\nCODEX_BASE_URL=https://gw:{HTTPS_PORT}/v1\n",
        ["--provider-retries", str(STICKY_RETRIES)],
        "1.0",
    ),
    "claude-code": (
        f"ANTHROPIC_AUTH_TOKEN={CANARY}\nANTHROPIC_BASE_URL=https://gw:{HTTPS_PORT}\n",
        # Two retries of a call instead of Claude Code's ten (waits growing to a minute).
        ["--model", CLAUDE_MODEL, "--agent-env", "CLAUDE_CODE_MAX_RETRIES=2"],
        "0.75",
    ),
    "mini-swe-agent": (
        f"OPENAI_API_KEY={CANARY}\nOPENAI_BASE_URL=http://gw:{HTTP_PORT}/v1\n",
        # Two tries of a call instead of mini-swe-agent's ten (4 s to 60 s apart): the run ends on it.
        ["--agent-import-path", MSWEA_ADAPTER, "--model", f"openai/{MODEL}", "--agent-kwarg",
         "model_class=litellm", "--agent-env", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=2"],
        "1.5",
    ),
}  # fmt: skip


def start_job(selection: Path, jobs: Path, agent: str, state_dir: Path) -> subprocess.Popen[str]:
    """`submit --local` of the harness's cases, all at once; its output goes to `jobs/<agent>.out`."""
    env_text, extra, multiplier = HARNESSES[agent]
    env_file = write_env_file(jobs.parent / "env-files", env_text)
    tasks = [task_id(agent, case) for case in AGENT_CASES[agent]]
    argv = [str(SCIENCEBENCH), "submit", "--path", str(selection), "--agent", agent, "--env-file",
            str(env_file), "--jobs-dir", str(jobs), "--job-name", agent, "--local",
            "--task-id", ",".join(tasks), "--n-concurrent", str(CONCURRENT[agent]),
            "--agent-timeout-multiplier", multiplier, *extra]  # fmt: skip
    env = agent_env(state_dir, SCIENCEBENCH_PROVIDER_BACKOFF_SEC=BACKOFF_SEC)
    with (jobs / f"{agent}.out").open("w") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def run_jobs(lab: GatewayLab, selection: Path, jobs: Path, state_dir: Path) -> dict[str, dict[str, Any]]:
    """One job per harness, side by side; recover each fault once the gateway has seen it; the records."""
    lab.recover(False)
    jobs.mkdir(parents=True)
    started = time.monotonic()
    procs = {agent: start_job(selection, jobs, agent, state_dir) for agent in HARNESSES}
    # Each fault ends (its MODE@harness recovers) once its trial's first try has ended: its rerun has started.
    pending = {
        task_id(agent, case): key
        for agent, cases in AGENT_CASES.items()
        for case in cases
        if (key := fault_key(agent, case)) and case != STICKY
    }
    scratch = state_dir / "scratch"
    ended: dict[str, float] = {}  # agent -> seconds its job took
    try:
        while len(ended) < len(procs) and time.monotonic() - started < JOBS_TIMEOUT_SEC:
            ended |= {
                a: time.monotonic() - started
                for a, p in procs.items()
                if a not in ended and p.poll() is not None
            }
            for task in [t for t in pending if any(scratch.glob(f"*/{t}-1.*/try-2"))]:
                lab.recover(mode=pending.pop(task))
            time.sleep(0.5)
    finally:
        for proc in procs.values():  # a job past its time (or an interrupted test): ended, then killed
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    runs = {}
    for agent in procs:
        job = jobs / agent
        runs[agent] = {
            "records": {
                path.stem.split("-")[0]: json.loads(path.read_text())
                for path in (job / ".sciencebench" / "trials").glob("*.json")
            },
            "summary": json.loads((job / "summary.json").read_text())
            if (job / "summary.json").is_file()
            else {},
            "output": (jobs / f"{agent}.out").read_text(),
            "seconds": ended.get(agent),
        }
    return runs


@pytest.fixture(scope="module")
def runs(
    faulty_lab: GatewayLab,
    baked: None,
    selection: Path,
    tmp_path_factory: pytest.TempPathFactory,
    state_dir: Path,
) -> dict[str, dict[str, Any]]:
    """The three harnesses' jobs, run at once (their records, summaries, output)."""
    return run_jobs(faulty_lab, selection, tmp_path_factory.mktemp("provider-jobs") / "jobs", state_dir)


@pytest.mark.parametrize("agent", list(HARNESSES))
@pytest.mark.timeout(JOBS_TIMEOUT_SEC + 600)  # the first one's setup bakes the agents and runs the jobs
def test_provider_failures_are_their_own_class_and_rerun(agent: str, runs: dict[str, dict[str, Any]]) -> None:
    run = runs[agent]
    records = {task.removeprefix(TASK_PREFIX[agent]): record for task, record in run["records"].items()}
    assert sorted(records) == sorted(AGENT_CASES[agent]), run["output"][-3000:]
    for case in AGENT_CASES[agent]:
        status = CASES[case][2]
        record = records[case]
        if case == STICKY:
            # Never recovered: every try a provider failure, the last one the record's.
            assert record["provider_status"] == status, (case, record)
            assert record["tries"] == 1 + STICKY_RETRIES, record  # the first try and --provider-retries
            assert all(t["provider_status"] == status for t in record["earlier_tries"]), record
        elif status is None:
            # A normal failure on a healthy gateway: reward 0, tried once, not the provider's.
            assert record["provider_status"] is None and record["rewards"] == {"reward": 0.0}, record
            assert record["tries"] == 1, record
        else:
            # The first try failed on the provider with this status; the rerun earned the reward.
            assert record["provider_status"] is None and record["rewards"] == {"reward": 1.0}, (case, record)
            assert record["tries"] >= 2, record
            assert record["earlier_tries"][0]["provider_status"] == status, (case, record)
    # The summary: the sticky trial counted apart, out of the reward mean.
    rows = {row["task_id"].removeprefix(f"task_{TASK_PREFIX[agent]}"): row for row in run["summary"]["rows"]}
    if STICKY in rows:
        assert rows[STICKY]["failure_class"] == "provider_error", rows[STICKY]
    assert rows[NORMAL_FAILURE]["failure_class"] != "provider_error", rows[NORMAL_FAILURE]
    print(f"{agent}: {len(AGENT_CASES[agent])} trials in {run['seconds']:.0f}s (the three jobs side by side)")
