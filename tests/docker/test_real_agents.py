"""Real agents end to end, offline: Codex, Claude Code and mini-swe-agent against a scripted gateway.

Everything is real except the model provider: the pinned agent binaries
(fetched on the host by scripts/agent-artifacts.sh and baked into the task
image by `sciencebench images bake`), Pier 0.3.0, the isolated-bridge policy
with its squid proxy, the Docker Engine, the registry, sciencebench's submit,
workers, Redis and Flower. The provider is `tests/fixtures/model_gateway.py`
in a container on each trial's egress network (tests/fixtures/gateway_lab.py),
reachable only through the trial's proxy, answering from a script: first
the tool call that applies the task's fix, then a final message.

The task is the demo's task_001 (a hidden-style task: a separate verifier
image applies the agent's model.patch to a clean copy and runs public and
private tests), so reward 1 needs the fix and nothing else gives it.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import hashlib
import json
import shlex
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from sciencebench.core.agentimages import AgentImages, load_agent_images
from sciencebench.core.harnesses import bake_of
from sciencebench.core.paths import SelectionPaths
from tests.fixtures.flower import Flower
from tests.fixtures.gateway_lab import GatewayLab, TLSFiles, make_ca
from tests.fixtures.pier_results import check_pier_job_files
from tests.fixtures.pier_viewer import check_job_as_pier_shows_it, check_trials_as_pier_shows_them, pier_view
from tests.fixtures.services import VENV_BIN, RedisServer, Worker, local_host_env

pytestmark = pytest.mark.docker

SCIENCEBENCH = VENV_BIN / "sciencebench"
AGENTS = ("codex", "claude-code", "mini-swe-agent")
CANARY = f"sk-sb-canary-{uuid.uuid4().hex}"
CANARY_SHA256 = hashlib.sha256(CANARY.encode()).hexdigest()
MODEL = "gpt-sb-scripted"
CLAUDE_MODEL = "claude-sb-scripted"
USAGE = {"input_tokens": 1200, "output_tokens": 80}  # the gateway's default, per answer
# The demo task's fix (its oracle solution), as the scripted model's one tool call.
FIX = "cd /app/project && sed -i 's/\\$(( \\$1 - \\$2 ))/$(( $1 + $2 ))/' calc.sh"
SCRIPTS = [{"name": "calc-fix", "match": "calc.sh", "commands": [FIX], "final": "Fixed add in calc.sh."}]
ALLOWED_PORTS = {"https": 4443, "http": 4000}
DENIED_PORT = 4100  # the gateway listens here too, but no trial's proxy allows it
MSWEA_ADAPTER = "sciencebench.agents.mini_swe_agent:ScienceBenchMiniSweAgent"


# --- fixtures ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifacts() -> Path:
    """The pinned artifacts scripts/agent-artifacts.sh fetched (scripts/test.sh runs it first)."""
    root = Path(os.environ.get("SCIENCEBENCH_AGENT_ARTIFACTS") or "/var/tmp/sciencebench-agents")
    for agent in AGENTS:
        version = bake_of(agent).version
        manifest = root / agent / version / ("py3.11/MANIFEST" if agent == "mini-swe-agent" else "MANIFEST")
        if not manifest.is_file():
            raise RuntimeError(f"{manifest} missing: run scripts/agent-artifacts.sh (scripts/test.sh does)")
    return root


@pytest.fixture(scope="module")
def tls(artifacts: Path) -> TLSFiles:
    """A test CA (made once, kept beside the artifacts) and the gateway's certificate for `gw`."""
    return make_ca(artifacts / "test-ca", "gw")


@dataclass
class Baked:
    record: AgentImages
    seconds: dict[str, float]  # agent -> first bake of this session (build + push, or found)
    rebake_seconds: float  # codex again: nothing to do
    rebake_output: str


def bake(selection: Path, agent: str, tls: TLSFiles, registry: str) -> tuple[float, str]:
    started = time.monotonic()
    proc = subprocess.run(
        [str(SCIENCEBENCH), "images", "bake", "--path", str(selection), "--agent", agent,
         "--registry", registry, "--extra-ca", str(tls.ca_cert)],
        capture_output=True, text=True, timeout=1200, env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return time.monotonic() - started, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def baked(demo_selection: Path, tls: TLSFiles, registry: str) -> Baked:
    """Every agent baked into the demo's agent image (once per session), then codex once more."""
    seconds = {agent: bake(demo_selection, agent, tls, registry)[0] for agent in AGENTS}
    before = SelectionPaths(demo_selection).agent_images.read_bytes()
    rebake_seconds, output = bake(demo_selection, "codex", tls, registry)
    record = load_agent_images(SelectionPaths(demo_selection).agent_images)
    assert json.loads(SelectionPaths(demo_selection).agent_images.read_bytes()) == json.loads(before)
    return Baked(record, seconds, rebake_seconds, output)


@pytest.fixture(scope="module")
def lab(
    demo_selection: Path,
    base_image: str,
    tls: TLSFiles,
    tmp_path_factory: pytest.TempPathFactory,
    state_dir: Path,
) -> Iterator[GatewayLab]:
    root = tmp_path_factory.mktemp("gateway")
    with GatewayLab(
        image=base_image, root=root, selection=demo_selection, key=CANARY, scripts=SCRIPTS, tls=tls,
        scratch=state_dir / "scratch",
        http_ports=(ALLOWED_PORTS["http"], DENIED_PORT), tls_ports=(ALLOWED_PORTS["https"],),
    ) as running:  # fmt: skip
        yield running
    assert running.errors == [], running.errors


class CommandLineWatch:
    """Samples every process's command line on this host while a trial runs; keeps those with the canary."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        needle = CANARY.encode()
        while not self._stop.is_set():
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    cmdline = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                if needle in cmdline:
                    self.hits.append(cmdline.replace(b"\0", b" ").decode(errors="replace")[:300])
            self.samples += 1
            self._stop.wait(0.1)

    def __enter__(self) -> CommandLineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@dataclass
class Run:
    proc: subprocess.CompletedProcess[str]
    job_dir: Path
    requests: list[dict[str, Any]]  # what the gateway saw during this run
    cmdline: CommandLineWatch
    record: dict[str, Any] = field(default_factory=dict)  # sciencebench's trial record
    result: dict[str, Any] = field(default_factory=dict)  # Pier's trial result.json
    trial_dir: Path | None = None

    @property
    def reward(self) -> float | None:
        rewards = self.record.get("rewards") or {}
        return rewards.get("reward")


def agent_env(state_dir: Path, **extra: str) -> dict[str, str]:
    """A local submit's (or a worker's) environment on an offline host: the baked images only.

    Its operator lists the scripted gateway: `gw` resolves only on the trials' egress networks.
    """
    listed = f"http://gw:{ALLOWED_PORTS['http']} https://gw:{ALLOWED_PORTS['https']}"
    return local_host_env(
        state_dir, **{"SCIENCEBENCH_AGENT_INSTALL": "baked", "SCIENCEBENCH_GATEWAYS": listed, **extra}
    )


def write_env_file(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"provider-{uuid.uuid4().hex[:6]}.env"
    path.write_text(text)
    path.chmod(0o600)
    return path


def submit(
    lab: GatewayLab, selection: Path, jobs: Path, job: str, agent: str, env_text: str, *extra: str,
    env: dict[str, str], local: bool = True,
) -> Run:  # fmt: skip
    """`sciencebench submit` of task 001 (embedded, or to the workers with --wait) and what it left."""
    env_file = write_env_file(jobs.parent / "env-files", env_text)
    seen_before = len(lab.requests())
    argv = [str(SCIENCEBENCH), "submit", "--path", str(selection), "--task-id", "001", "--agent", agent,
            "--env-file", str(env_file), "--jobs-dir", str(jobs), "--job-name", job,
            "--local" if local else "--wait", *extra]  # fmt: skip
    with CommandLineWatch() as watch:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    run = Run(proc, jobs / job, lab.requests()[seen_before:], watch)
    record_path = run.job_dir / ".sciencebench" / "trials" / "001-1.json"
    if record_path.is_file():
        run.record = json.loads(record_path.read_text())
        if run.record.get("trial_dir"):
            run.trial_dir = run.job_dir / run.record["trial_dir"]
            run.result = json.loads((run.trial_dir / "result.json").read_text())
    return run


def policy_record(run: Run) -> dict[str, Any]:
    assert run.trial_dir is not None
    return json.loads((run.trial_dir / f"network-policy-{run.trial_dir.name}.json").read_text())


def assert_solved_through_the_gateway(run: Run, *, protocol: str, model: str, port: int, tls: bool) -> None:
    """Reward 1 from the scripted fix; the gateway saw the model, the key and the turns; tokens recorded."""
    output = run.proc.stdout + run.proc.stderr
    assert run.proc.returncode == 0, output
    assert run.record["exception_type"] is None, run.record
    assert run.reward == 1.0, run.record
    main = [r for r in run.requests if r.get("protocol") == protocol and r.get("tools")]
    assert [r["turn"] for r in main] == [0, 1], run.requests  # the fix, then the final answer
    assert [r["answer"] for r in main] == ["tool", "text" if protocol != "chat" else "tool"]
    for request in run.requests:
        assert request["authorized"] and request["auth_sha256"] == CANARY_SHA256, request
        assert (request["port"], request["tls"]) == (port, tls), request
    assert {r["model"] for r in main} == {model}
    # The policy: the agent joined the isolated bridge; its proxy allowed exactly the gateway.
    policy = policy_record(run)
    assert policy["network_mode"] == "isolated-allowlist"
    assert policy["gateway_authorities"] == [f"gw:{port}"]
    assert policy["inference_domains"] == ["gw"]
    # Pier's own trial result carries the agent's token counts (what the job totals are made of).
    agent_result = run.result["agent_result"]
    assert agent_result["n_input_tokens"] == len(main) * USAGE["input_tokens"]
    assert agent_result["n_output_tokens"] == len(main) * USAGE["output_tokens"]
    # The job's files are Pier's; its result.json totals the trial's tokens and cost as Pier does.
    result, _, trials = check_pier_job_files(run.job_dir)
    stats = result.stats
    totals = (stats.n_input_tokens, stats.n_cache_tokens, stats.n_output_tokens, stats.cost_usd)
    assert totals == trials[0].compute_token_cost_totals()
    assert stats.n_input_tokens == len(main) * USAGE["input_tokens"]
    # On a baked image Pier skips the install: its agent-setup stage is short.
    assert run.record["timings_sec"]["agent_setup"] < 2.0, run.record["timings_sec"]
    assert run.cmdline.samples > 10 and run.cmdline.hits == [], run.cmdline.hits


# --- baking ------------------------------------------------------------------------


def test_each_agent_is_baked_once_and_a_second_bake_is_a_no_op(baked: Baked, demo_selection: Path) -> None:
    assert "up to date" in baked.rebake_output and "built" not in baked.rebake_output, baked.rebake_output
    assert baked.rebake_seconds < 15, baked.rebake_seconds  # a registry lookup, no build, no push
    base = load_selection_agent_image(demo_selection)
    for agent in AGENTS:
        (image,) = baked.record.find(base, agent)
        assert image.version == bake_of(agent).version
        assert "@sha256:" in image.image and image.image != base
    (codex,) = baked.record.find(base, "codex")
    assert codex.wire_apis == ["responses"]  # probed on the baked binary itself


def load_selection_agent_image(selection: Path) -> str:
    text = (selection / "task_001" / "task.toml").read_text()
    return text.split('docker_image = "', 1)[1].split('"', 1)[0]


def test_the_baked_codex_itself_refuses_chat(baked: Baked, demo_selection: Path) -> None:
    (codex,) = baked.record.find(load_selection_agent_image(demo_selection), "codex")
    provider = 'model_providers.p={name="p", base_url="http://127.0.0.1:9/v1", wire_api="chat"}'
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", codex.image, "bash", "-c",
         f"export CODEX_HOME=$(mktemp -d) OPENAI_API_KEY=x; codex -c model_provider=p -c '{provider}' "
         "exec --skip-git-repo-check -- hi </dev/null"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert '`wire_api = "chat"` is no longer supported' in proc.stdout + proc.stderr


def test_a_missing_baked_image_is_one_line_at_submit(
    demo_selection: Path, tmp_path: Path, state_dir: Path
) -> None:
    # A codex version nobody baked: refused before anything is written or sent.
    env_file = write_env_file(
        tmp_path,
        f"OPENAI_API_KEY={CANARY}\nCODEX_BASE_URL=https://gw:{ALLOWED_PORTS['https']}/v1\nCODEX_VERSION=0.1.0\n",
    )
    proc = subprocess.run(
        [str(SCIENCEBENCH), "submit", "--path", str(demo_selection), "--agent", "codex", "--env-file",
         str(env_file), "--jobs-dir", str(tmp_path / "jobs"), "--job-name", "missing", "--local"],
        env=agent_env(state_dir), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "no baked codex 0.1.0 image for task(s) 001, 002" in line
    assert "sciencebench images bake" in line
    assert CANARY not in proc.stdout + proc.stderr
    assert not (tmp_path / "jobs").exists()


# --- real agents through the proxy -------------------------------------------------


def test_codex_responses_over_tls_on_a_nonstandard_port(
    lab: GatewayLab, baked: Baked, demo_selection: Path, tmp_path: Path, state_dir: Path
) -> None:
    # MODEL is the exact route sent to the gateway, provider prefix and all (Pier's Codex agent
    # would send only what follows the last '/'); CODEX_WIRE_API is case-insensitive.
    env_text = (
        f"MODEL=openai/{MODEL}\nOPENAI_API_KEY={CANARY}\nCODEX_BASE_URL=https://gw:{ALLOWED_PORTS['https']}/v1\n"
        "CODEX_WIRE_API=Responses\nCODEX_REASONING_EFFORT=low\n"
    )
    run = submit(lab, demo_selection, tmp_path / "jobs", "codex", "codex", env_text, env=agent_env(state_dir))
    assert_solved_through_the_gateway(
        run, protocol="responses", model=f"openai/{MODEL}", port=ALLOWED_PORTS["https"], tls=True
    )
    main = [r for r in run.requests if r["protocol"] == "responses"]
    assert all(r["stream"] for r in main)  # SSE, as Codex uses the Responses API
    assert {r["reasoning_effort"] for r in main} == {"low"}  # CODEX_REASONING_EFFORT reached the wire
    assert all(r["user_agent"].startswith("codex_exec/0.169.0") for r in main)
    assert run.result["agent_info"]["name"] == "codex" and run.result["agent_info"]["version"] == "0.169.0"
    assert run.trial_dir is not None
    assert (run.trial_dir / "agent" / "trajectory.json").is_file()  # converted by Pier from the session
    assert (run.trial_dir / "agent" / "codex.txt").is_file()
    # The run record names the baked image, and so does the trial's Pier command.
    record = json.loads((demo_selection / "batch-run.json").read_text())
    (codex,) = baked.record.find(load_selection_agent_image(demo_selection), "codex")
    assert record["agent_images"]["001"]["image"] == codex.image
    assert any(
        arg.startswith("agent_image=") and codex.image in arg for arg in shlex.split(record["pier_command"])
    )
    # The key went to the gateway only: not into the jobs directory, not onto a container's config.
    assert_canary_absent_from_tree(run.job_dir)
    assert_canary_absent_from_container_config(lab)
    # Pier's viewer shows the job's and the trial's tokens as for a job `pier run` wrote (the adapter is
    # an import path, so the job lists no agent name, as Pier lists none for --agent-import-path).
    with pier_view(run.job_dir.parent, agent_env(state_dir), tmp_path / "pier-view.log") as viewer:
        entry = check_job_as_pier_shows_it(viewer, run.job_dir, agents=[])
        (shown,) = check_trials_as_pier_shows_them(viewer, run.job_dir, agent="codex")
    tokens = run.result["agent_result"]
    assert entry["models"] == [MODEL]
    assert entry["total_output_tokens"] == shown["output_tokens"] == tokens["n_output_tokens"] > 0
    assert (
        entry["total_input_tokens"]
        == shown["input_tokens"]
        == tokens["n_input_tokens"] - tokens["n_cache_tokens"]
    )
    assert entry["total_cost_usd"] == shown["cost_usd"] == tokens["cost_usd"]


def test_codex_chat_wire_api_is_refused_at_submit_naming_the_version(
    baked: Baked, demo_selection: Path, tmp_path: Path, state_dir: Path
) -> None:
    env_file = write_env_file(
        tmp_path,
        f"MODEL={MODEL}\nOPENAI_API_KEY={CANARY}\nCODEX_BASE_URL=http://gw:4000/v1\nCODEX_WIRE_API=chat\n",
    )
    proc = subprocess.run(
        [str(SCIENCEBENCH), "submit", "--path", str(demo_selection), "--task-id", "001", "--agent", "codex",
         "--env-file", str(env_file), "--jobs-dir", str(tmp_path / "jobs"), "--job-name", "chat", "--local"],
        env=agent_env(state_dir), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "CODEX_WIRE_API=chat" in line and "Codex 0.169.0" in line and "wire_api=responses" in line
    assert not (tmp_path / "jobs").exists()


def test_claude_code_messages_over_tls(
    lab: GatewayLab, baked: Baked, demo_selection: Path, tmp_path: Path, state_dir: Path
) -> None:
    env_text = f"ANTHROPIC_AUTH_TOKEN={CANARY}\nANTHROPIC_BASE_URL=https://gw:{ALLOWED_PORTS['https']}\n"
    run = submit(lab, demo_selection, tmp_path / "jobs", "claude", "claude-code", env_text,
                 "--model", CLAUDE_MODEL, env=agent_env(state_dir))  # fmt: skip
    assert_solved_through_the_gateway(
        run, protocol="anthropic", model=CLAUDE_MODEL, port=ALLOWED_PORTS["https"], tls=True
    )
    assert all(r["path"].startswith("/v1/messages") for r in run.requests)
    assert run.result["agent_info"]["name"] == "claude-code"
    assert run.trial_dir is not None
    assert (run.trial_dir / "agent" / "claude-code.txt").is_file()
    assert (run.trial_dir / "agent" / "trajectory.json").is_file()
    assert_canary_absent_from_tree(run.job_dir)


def test_mini_swe_agent_chat_completions_over_http(
    lab: GatewayLab, baked: Baked, demo_selection: Path, tmp_path: Path, state_dir: Path
) -> None:
    env_text = f"OPENAI_API_KEY={CANARY}\nOPENAI_BASE_URL=http://gw:{ALLOWED_PORTS['http']}/v1\n"
    # model_class=litellm: LiteLLM's Chat Completions client (Pier's default for openai/ is Responses).
    # The adapter: Pier's own mini-swe-agent would also let api.openai.com through the proxy.
    run = submit(lab, demo_selection, tmp_path / "jobs", "mswea", "mini-swe-agent", env_text,
                 "--agent-import-path", MSWEA_ADAPTER, "--model", f"openai/{MODEL}",
                 "--agent-kwarg", "model_class=litellm", env=agent_env(state_dir))  # fmt: skip
    assert_solved_through_the_gateway(
        run, protocol="chat", model=MODEL, port=ALLOWED_PORTS["http"], tls=False
    )
    assert all(r["path"] == "/v1/chat/completions" for r in run.requests)
    assert run.result["agent_info"]["name"] == "mini-swe-agent"
    assert run.result["agent_info"]["version"] == bake_of("mini-swe-agent").version
    assert run.trial_dir is not None
    assert (run.trial_dir / "agent" / "mini-swe-agent.trajectory.json").is_file()
    assert (run.trial_dir / "agent" / "trajectory.json").is_file()
    assert_canary_absent_from_tree(run.job_dir)


# Each agent is pointed at the gateway's port DENIED_PORT while its env file (so the
# proxy's allowlist) names the allowed one: the agent's own setting wins over the env file.
OFF_THE_ALLOWLIST = {
    "codex": (
        f"MODEL={MODEL}\nOPENAI_API_KEY={CANARY}\nCODEX_BASE_URL=https://gw:{ALLOWED_PORTS['https']}/v1\n",
        ["--agent-kwarg", f"base_url=https://gw:{DENIED_PORT}/v1"],
        ALLOWED_PORTS["https"],
    ),
    "claude-code": (
        f"ANTHROPIC_AUTH_TOKEN={CANARY}\nANTHROPIC_BASE_URL=https://gw:{ALLOWED_PORTS['https']}\n",
        ["--model", CLAUDE_MODEL, "--agent-env", f"ANTHROPIC_BASE_URL=https://gw:{DENIED_PORT}"],
        ALLOWED_PORTS["https"],
    ),
    "mini-swe-agent": (
        f"OPENAI_API_KEY={CANARY}\nOPENAI_BASE_URL=http://gw:{ALLOWED_PORTS['http']}/v1\n",
        ["--agent-import-path", MSWEA_ADAPTER, "--model", f"openai/{MODEL}", "--agent-kwarg",
         "model_class=litellm", "--agent-env", f"OPENAI_BASE_URL=http://gw:{DENIED_PORT}/v1"],
        ALLOWED_PORTS["http"],
    ),
}  # fmt: skip


def test_a_gateway_off_the_allowlist_is_refused_by_the_proxy(
    lab: GatewayLab, baked: Baked, demo_selection: Path, tmp_path: Path, state_dir: Path
) -> None:
    # One trial per agent, run side by side (they are independent jobs). The agents
    # retry a refused request until their timeout, kept short; mini-swe-agent needs
    # longer to make its first request (Python and LiteLLM start in the container).
    runs: dict[str, Run] = {}

    def run(agent: str) -> None:
        env_text, extra, _ = OFF_THE_ALLOWLIST[agent]
        runs[agent] = submit(
            lab, demo_selection, tmp_path / "jobs", f"denied-{agent}", agent, env_text, *extra,
            "--agent-timeout-multiplier", "0.2" if agent == "mini-swe-agent" else "0.0625",
            env=agent_env(state_dir),
        )  # fmt: skip

    threads = [threading.Thread(target=run, args=(agent,)) for agent in AGENTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(runs) == sorted(AGENTS)
    # Nothing reached the gateway (the runs overlap, so each one's slice of the log is the whole window).
    assert all(run.requests == [] for run in runs.values()), {a: r.requests for a, r in runs.items()}
    for agent, run in runs.items():
        allowed_port = OFF_THE_ALLOWLIST[agent][2]
        assert run.proc.returncode == 1, run.proc.stdout + run.proc.stderr  # the job has an errored trial
        assert run.record["exception_type"] == "AgentTimeoutError", (agent, run.record)
        assert run.reward == 0.0
        assert policy_record(run)["gateway_authorities"] == [f"gw:{allowed_port}"]
        # The proxy's own access log: the agent's calls to the other port were denied there.
        assert run.trial_dir is not None
        access = lab.proxy_logs.get(run.trial_dir.name.lower(), "")
        denied = [
            line for line in access.splitlines() if "TCP_DENIED/403" in line and f"gw:{DENIED_PORT}" in line
        ]
        assert denied, (agent, access)
        assert f"gw:{allowed_port}" not in access


# --- the key's path, through a real worker, Redis and Flower ------------------------


def assert_canary_absent_from_tree(root: Path) -> None:
    found = [str(p) for p in root.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert found == [], found


def assert_canary_absent_from_container_config(lab: GatewayLab) -> None:
    assert lab.container_envs, "no trial container was seen"
    leaked = [name for name, env in lab.container_envs.items() if any(CANARY in entry for entry in env)]
    assert leaked == [], leaked


def redis_dump(client: redis.Redis) -> bytes:
    """Every key and value in the database, as one blob to search."""
    parts: list[bytes] = []
    for key in client.scan_iter(count=1000):
        parts.append(key)
        kind = client.type(key)
        if kind == b"string":
            parts.append(client.get(key) or b"")
        elif kind == b"hash":
            for field_name, value in client.hgetall(key).items():
                parts += [field_name, value]
        elif kind == b"list":
            parts += client.lrange(key, 0, -1)
        elif kind == b"set":
            parts += list(client.smembers(key))
        elif kind == b"zset":
            parts += [member for member, _ in client.zrange(key, 0, -1, withscores=True)]
    return b"\n".join(parts)


def test_the_key_reaches_the_gateway_and_nothing_else_through_a_worker(
    lab: GatewayLab, baked: Baked, demo_selection: Path, tmp_path: Path, state_dir: Path,
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory,
) -> None:  # fmt: skip
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    env = agent_env(state_dir, SCIENCEBENCH_BROKER_URL=redis_server.url, SCIENCEBENCH_LEASE_SECONDS="10")
    # The demo selection is the module's: the worker serves the whole test run's directory.
    worker = Worker("agents", env, tmp_path, concurrency=1, serves=tmp_path_factory.getbasetemp()).start()
    flower = Flower.start(
        env, tmp_path, "admin", "flower-secret", "--task_runtime_metric_buckets=1,10,60,600,inf"
    )
    try:
        worker.wait_ready(timeout=120)
        env_text = (
            f"MODEL={MODEL}\nOPENAI_API_KEY={CANARY}\nCODEX_BASE_URL=https://gw:{ALLOWED_PORTS['https']}/v1\n"
        )
        run = submit(
            lab, demo_selection, tmp_path / "jobs", "codex-worker", "codex", env_text, env=env, local=False
        )
        assert_solved_through_the_gateway(
            run, protocol="responses", model=MODEL, port=ALLOWED_PORTS["https"], tls=True
        )
        tasks = flower.get_json("/api/tasks")
        assert tasks, "Flower saw no task"
        for task_id in tasks:
            flower.get_json(f"/api/task/info/{task_id}")
        flower.get_json("/api/workers")
        flower.get("/metrics", auth=False)
    finally:
        worker.stop()
        flower.stop()
    # At the gateway: every request carried the key from the env file (compared by hash).
    assert run.requests and {r["auth_sha256"] for r in run.requests} == {CANARY_SHA256}
    # Nowhere else: Redis (broker, results, coordination), the jobs directory, the worker's
    # log, Flower's answers and log, any process's command line, any trial container's config.
    assert CANARY.encode() not in redis_dump(client)
    assert_canary_absent_from_tree(run.job_dir)
    assert CANARY not in worker.log_path.read_text(errors="replace")
    assert all(CANARY not in body for body in flower.seen) and flower.seen
    assert CANARY not in flower.log_path.read_text(errors="replace")
    assert run.cmdline.hits == []
    assert_canary_absent_from_container_config(lab)
    # The run record names the env file by path and hash only.
    assert CANARY not in (demo_selection / "batch-run.json").read_text()
