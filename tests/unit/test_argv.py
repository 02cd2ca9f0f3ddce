"""pier.render_argv: one trial, one private job directory, no secret values."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from sciencebench.core.harness import POLICY_ENVIRONMENT
from sciencebench.core.harnesses import REGISTRY
from sciencebench.core.pier_argv import render_argv
from sciencebench.login.cluster import Cluster
from sciencebench.login.options import SubmitOptions
from sciencebench.login.submit import Prepared
from tests.fixtures.hosts import EVERYTHING, READY, prepare
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit
CODEX_ADAPTER = REGISTRY["codex"].adapter

CANARY_KEY = "sk-canary-ARGV-91fe22"
CANARY_AGENT_ENV = "canary-agent-env-77ab"
REPEATABLE = {"--model", "--ak", "--ae", "--ek"}
FLAGS = {"--no-force-build", "--no-delete", "--yes", "--quiet"}


def _prepare(tmp_path: Path, *, env_text: str | None = None, cluster: Cluster = READY, **kw: Any) -> Prepared:
    selection = tmp_path / "sel"
    if not selection.exists():
        make_selection(selection, ["002", "005"])
    if env_text is not None:
        env_file = tmp_path / "provider.env"
        env_file.write_text(env_text)
        kw["env_file"] = env_file
    kw.setdefault("jobs_dir", tmp_path / "jobs")
    kw.setdefault("job_name", "argv")
    return prepare(SubmitOptions(path=selection, **kw), cluster=cluster)


def _argv(prepared: Prepared, index: int = 0) -> list[str]:
    scratch = prepared.job.job_dir / ".sciencebench" / "scratch" / "t1"
    return render_argv(prepared.job, prepared.trials[index], scratch, "pier-job-1")


def _options(argv: list[str]) -> dict[str, list[str]]:
    """Every option's values, checking the argv is well formed on the way."""
    assert argv[1] == "run"
    found: dict[str, list[str]] = {}
    rest = argv[2:]
    while rest:
        option = rest.pop(0)
        assert option.startswith("--"), f"stray argument {option!r}"
        if option in FLAGS:
            value = ""
        else:
            assert rest and not rest[0].startswith("--"), f"{option} has no value"
            value = rest.pop(0)
        found.setdefault(option, []).append(value)
    for option, values in found.items():
        if option not in REPEATABLE:
            assert len(values) == 1, f"{option} given {len(values)} times"
    return found


def test_nop_argv_in_full(tmp_path: Path) -> None:
    prepared = _prepare(tmp_path)
    trial = prepared.trials[0]
    scratch = prepared.job.job_dir / ".sciencebench" / "scratch" / "t1"
    # A worker passes its own Pier; the job's --pier-bin is for --local only.
    argv = render_argv(prepared.job, trial, scratch, "pier-job-1", pier_bin="/opt/pier/bin/pier")
    assert argv == [
        "/opt/pier/bin/pier",
        "run",
        "--path", str(trial.task_dir),
        "--jobs-dir", str(scratch),
        "--job-name", "pier-job-1",
        "--n-attempts", "1",
        "--n-concurrent", "1",
        "--max-retries", "0",
        "--no-force-build",
        "--no-delete",
        "--yes",
        "--quiet",
        "--env", "docker",
        "--environment-import-path", POLICY_ENVIRONMENT,
        "--agent", "nop",
    ]  # fmt: skip
    assert POLICY_ENVIRONMENT == "sciencebench.network.environment:IsolatedDockerEnvironment"


def test_the_environment_class_is_always_the_policys(tmp_path: Path) -> None:
    prepared = _prepare(tmp_path)
    # A job.json written by someone else cannot swap the environment class.
    forged = prepared.job.model_copy(update={"environment_import_path": "evil:Env"})
    argv = render_argv(forged, prepared.trials[0], tmp_path, "j")
    assert _options(argv)["--environment-import-path"] == [POLICY_ENVIRONMENT]


def test_host_side_environment_keywords_are_appended(tmp_path: Path) -> None:
    prepared = _prepare(tmp_path)
    proxy = "r/p@sha256:" + "0" * 64
    argv = render_argv(
        prepared.job,
        prepared.trials[0],
        tmp_path,
        "j",
        environment_kwargs={"owner": "abc", "proxy_image": proxy},
    )
    assert _options(argv)["--ek"] == ["owner=abc", f"proxy_image={proxy}"]


def test_exactly_one_task_dir_and_private_jobs_dir(tmp_path: Path) -> None:
    prepared = _prepare(tmp_path, n_attempts=3, n_concurrent=4, max_retries=2)
    seen_paths = set()
    for index, trial in enumerate(prepared.trials):
        opts = _options(_argv(prepared, index))
        (path,) = opts["--path"]
        assert Path(path) == trial.task_dir
        assert Path(path).name == f"task_{trial.task_id}"
        assert (Path(path) / "task.toml").is_file()
        seen_paths.add(path)
        assert opts["--jobs-dir"] == [str(prepared.job.job_dir / ".sciencebench" / "scratch" / "t1")]
        # Attempts, concurrency and retries belong to sciencebench, never to Pier.
        assert opts["--n-attempts"] == ["1"]
        assert opts["--n-concurrent"] == ["1"]
        assert opts["--max-retries"] == ["0"]
        assert {"--no-force-build", "--no-delete", "--yes"} <= set(opts)
        assert "--force-build" not in opts and "--delete" not in opts
        assert opts["--env"] == ["docker"]
        assert opts["--environment-import-path"] == [POLICY_ENVIRONMENT]
    assert len(prepared.trials) == 6
    assert len(seen_paths) == 2


def test_timeouts_only_when_set(tmp_path: Path) -> None:
    opts = _options(_argv(_prepare(tmp_path)))
    assert not {
        "--agent-timeout-multiplier",
        "--verifier-timeout-multiplier",
        "--environment-build-timeout-multiplier",
    } & set(opts)

    opts = _options(_argv(_prepare(tmp_path, agent_timeout_multiplier=0.0223, job_name="t2")))
    assert opts["--agent-timeout-multiplier"] == ["0.0223"]
    assert "--verifier-timeout-multiplier" not in opts

    opts = _options(_argv(_prepare(tmp_path, verifier_timeout_multiplier=2, job_name="t3")))
    assert opts["--verifier-timeout-multiplier"] == ["2.0"]
    assert opts["--environment-build-timeout-multiplier"] == ["2.0"]
    assert "--agent-timeout-multiplier" not in opts


def test_codex_uses_the_adapter_never_both(tmp_path: Path) -> None:
    env = (
        f"OPENAI_API_KEY={CANARY_KEY}\nMODEL=my-route\nCODEX_BASE_URL=https://gw.example.edu:4000/v1\n"
        "CODEX_WIRE_API=chat\nCODEX_VERSION=0.42.0\nCODEX_REASONING_EFFORT=high\n"
    )
    argv = _argv(_prepare(tmp_path, agent="codex", env_text=env))
    opts = _options(argv)
    assert opts["--agent-import-path"] == [CODEX_ADAPTER]
    assert "--agent" not in opts
    assert opts["--model"] == ["my-route"]
    assert opts["--ak"] == [
        "base_url=https://gw.example.edu:4000/v1",
        "wire_api=chat",
        "version=0.42.0",
        "reasoning_effort=high",
        "command_model_name=my-route",  # the route exactly: Pier's Codex would send only its last part
    ]
    (ek,) = opts["--ek"]
    name, _, value = ek.partition("=")
    assert name == "inference_urls"
    assert json.loads(value) == ["https://gw.example.edu:4000/v1"]
    assert not any(CANARY_KEY in arg for arg in argv)


def test_codex_builtin_agent_when_adapter_is_off(tmp_path: Path) -> None:
    opts = _options(
        _argv(
            _prepare(tmp_path, agent="codex", env_text="OPENAI_API_KEY=k-123456\n", auto_agent_adapter=False)
        )
    )
    assert opts["--agent"] == ["codex"]
    assert "--agent-import-path" not in opts


def test_explicit_import_path_replaces_agent(tmp_path: Path) -> None:
    opts = _options(_argv(_prepare(tmp_path, agent="mini-swe-agent", agent_import_path="pkg.mod:Agent")))
    assert opts["--agent-import-path"] == ["pkg.mod:Agent"]
    assert "--agent" not in opts


def test_models_kwargs_and_agent_env_templates(tmp_path: Path) -> None:
    env = f"OPENAI_API_KEY={CANARY_KEY}\nOPENAI_BASE_URL=http://10.1.2.3:4000/v1\n"
    prepared = _prepare(
        tmp_path,
        agent="mini-swe-agent",
        env_text=env,
        models=["openai/a", "openai/b"],
        agent_kwargs=["max_steps=50", "cost_limit=0"],
        agent_env=[f"ZED_TOKEN={CANARY_AGENT_ENV}", f"AWS_REGION={CANARY_AGENT_ENV}x"],
        # An internal address: its workers' operator lists it (`worker --gateway`).
        cluster=Cluster(
            kits={"w1": EVERYTHING.model_copy(update={"gateways": ("http://10.1.2.3:4000",)})},
            where="live worker hosts",
        ),
    )
    argv = _argv(prepared)
    opts = _options(argv)
    assert opts["--agent"] == ["mini-swe-agent"]
    # One model per trial, each its own Pier run: the original's trial count, a timeout each.
    per_trial = [(t.task_id, _options(_argv(prepared, i))["--model"]) for i, t in enumerate(prepared.trials)]
    assert sorted(per_trial) == [(t, [m]) for t in prepared.job.task_ids for m in ("openai/a", "openai/b")]
    assert opts["--ak"] == ["max_steps=50", "cost_limit=0"]
    # Names only: Pier resolves ${NAME} from its own process environment.
    assert opts["--ae"] == ["AWS_REGION=${AWS_REGION}", "ZED_TOKEN=${ZED_TOKEN}"]
    assert json.loads(opts["--ek"][0].partition("=")[2]) == ["http://10.1.2.3:4000/v1"]
    text = "\x00".join(argv)
    for secret in (CANARY_KEY, CANARY_AGENT_ENV):
        assert secret not in text


def test_argv_is_the_same_for_every_attempt_of_a_task(tmp_path: Path) -> None:
    prepared = _prepare(tmp_path, n_attempts=2)
    by_task: dict[str, list[list[str]]] = {}
    for index, trial in enumerate(prepared.trials):
        by_task.setdefault(trial.task_id, []).append(_argv(prepared, index))
    for argvs in by_task.values():
        assert len(argvs) == 2
        assert argvs[0] == argvs[1]


@pytest.mark.parametrize("import_path", [POLICY_ENVIRONMENT, CODEX_ADAPTER])
def test_import_paths_given_to_pier_resolve(monkeypatch: pytest.MonkeyPatch, import_path: str) -> None:
    # Pier imports these by name on the worker; a typo would only show there.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    module, _, name = import_path.partition(":")
    assert isinstance(getattr(importlib.import_module(module), name), type)
