"""IsolatedDockerEnvironment without an engine: planning, refusals, the files it writes."""

from __future__ import annotations

import asyncio
import functools
import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

from pathlib import Path
from typing import Any

import pytest
from pier.models.agent.install import AgentInstallSpec, InstallStep
from pier.models.agent.network import NetworkAllowlist
from pier.models.task.config import EnvironmentConfig
from pier.models.trial.paths import TrialPaths

from sciencebench.core.errors import PolicyRefused, PolicyViolation
from sciencebench.core.settings import DEFAULT_PIDS_LIMIT
from sciencebench.dockerhost import hostlocks
from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL, MANAGED_LABEL, OWNER_LABEL
from sciencebench.network.egress import parse_inference_urls, plan_egress
from sciencebench.network.environment import IsolatedDockerEnvironment

pytestmark = pytest.mark.unit

PROXY_IMAGE = "127.0.0.1:5555/sciencebench/squid@sha256:" + "b" * 64
BASE_IMAGE = "127.0.0.1:5555/sciencebench/base@sha256:" + "c" * 64


def plan(**overrides: Any) -> Any:
    kwargs: dict[str, Any] = {
        "allow_internet": False,
        "uses_compose": False,
        "allowlist_domains": ["api.openai.com", "gw"],
        "inference_urls": ["http://gw:4000/v1"],
        "proxy_image": PROXY_IMAGE,
    }
    kwargs.update(overrides)
    return plan_egress(**kwargs)


# --- planning ------------------------------------------------------------------


def test_allow_internet_is_refused() -> None:
    with pytest.raises(PolicyRefused, match="allow_internet"):
        plan(allow_internet=True)


def test_no_allowlist_means_no_network_even_with_gateways() -> None:
    result = plan(allowlist_domains=[], proxy_image=None)
    assert result.mode == "none"
    assert result.inference_domains == [] and result.gateway_authorities == []


def test_allowlist_means_isolated_allowlist_with_gateway_authorities() -> None:
    result = plan()
    assert result.mode == "isolated-allowlist"
    # The gateway replaces the harness's allowlist: api.openai.com is not allowed.
    assert result.domains == ()
    assert result.inference_domains == ["gw"]
    assert result.gateway_authorities == ["gw:4000"]
    assert result.proxy_image == PROXY_IMAGE


def test_without_a_gateway_the_allowlist_hosts_are_used() -> None:
    result = plan(inference_urls=None)
    assert result.domains == ("api.openai.com", "gw") and result.gateways == ()


@functools.cache
def _pier_allowlists() -> dict[str, list[str]]:
    """Pier's own allowlists for harnesses sciencebench does not wrap, with a gateway URL set.

    claude-code and gemini-cli as Pier computes them; mini-swe-agent's as Pier's
    provider defaults give them (importing it costs seconds: it loads litellm).
    """
    from pier.agents.installed.claude_code import ClaudeCode
    from pier.agents.installed.gemini_cli import GeminiCli

    logs = Path("/nonexistent-logs")
    gateway = "http://gw:4000/v1"
    bedrock = ClaudeCode(
        logs_dir=logs, extra_env={"CLAUDE_CODE_USE_BEDROCK": "1", "ANTHROPIC_BASE_URL": gateway}
    )
    gemini = GeminiCli(logs_dir=logs, extra_env={"GOOGLE_GEMINI_BASE_URL": gateway})
    return {
        "claude-code bedrock": bedrock.network_allowlist().domains,
        "gemini-cli": gemini.network_allowlist().domains,
        "mini-swe-agent bedrock/...": [".amazonaws.com", "gw"],
        "mini-swe-agent openai/...": ["api.openai.com", "gw"],
    }


@pytest.mark.parametrize(
    "harness",
    ["claude-code bedrock", "gemini-cli", "mini-swe-agent bedrock/...", "mini-swe-agent openai/..."],
)
def test_a_gateway_replaces_pier_provider_defaults(harness: str) -> None:
    allowlist = _pier_allowlists()[harness]
    assert set(allowlist) - {"gw"}, allowlist  # Pier adds a provider default (a suffix or a host)
    result = plan(allowlist_domains=allowlist, inference_urls=["http://gw:4000/v1"])
    assert result.domains == () and result.inference_domains == ["gw"]
    assert result.gateway_authorities == ["gw:4000"]


@pytest.mark.parametrize("suffix", [".amazonaws.com", ".googleapis.com"])
def test_a_suffix_allowlist_without_a_gateway_is_refused_in_one_line(suffix: str) -> None:
    with pytest.raises(PolicyRefused) as info:
        plan(allowlist_domains=[suffix, "gw"], inference_urls=None)
    message = str(info.value)
    assert "\n" not in message and "domain suffix" in message and "gateway" in message


def test_egress_without_a_proxy_image_is_refused() -> None:
    with pytest.raises(PolicyRefused, match="SCIENCEBENCH_PROXY_IMAGE"):
        plan(proxy_image=None)


@pytest.mark.parametrize("ref", ["sciencebench/squid:latest", "squid@sha256:abc", "pending"])
def test_unpinned_proxy_image_is_refused(ref: str) -> None:
    with pytest.raises(PolicyRefused, match="proxy image"):
        plan(proxy_image=ref)


def test_compose_task_with_egress_is_refused_but_allowed_without() -> None:
    with pytest.raises(PolicyRefused, match=r"docker-compose\.yaml"):
        plan(uses_compose=True)
    assert plan(uses_compose=True, allowlist_domains=[]).mode == "none"


@pytest.mark.parametrize(
    ("value", "authorities"),
    [
        (None, []),
        ("", []),
        (["http://gw:4000/v1"], ["gw:4000"]),
        ('["http://gw:4000/v1", "https://gateway.example.edu/v1"]', ["gateway.example.edu:443", "gw:4000"]),
        ("http://gw:4000/v1", ["gw:4000"]),
        (["http://user:secret@gw:4000/v1?key=x"], ["gw:4000"]),
    ],
)
def test_inference_urls_forms(value: object, authorities: list[str]) -> None:
    assert sorted(g.authority for g in parse_inference_urls(value)) == authorities


@pytest.mark.parametrize(
    "value",
    [
        ["ftp://gw:21/"],
        ["http://gw:99999/"],
        ["http://gw%0d%0aevil:4000"],
        ["http://:4000"],
        [4000],
        "[not json",
    ],
)
def test_bad_inference_urls_are_refused_without_echoing_them(value: object) -> None:
    with pytest.raises(PolicyRefused) as info:
        parse_inference_urls(value)
    assert "evil" not in str(info.value)


def test_an_ipv6_gateway_is_refused_when_planned() -> None:
    with pytest.raises(PolicyRefused, match="IPv6"):
        plan(inference_urls=["http://[fd00::5]:4000/v1"])


def test_allowlist_entry_that_could_inject_squid_config_is_refused() -> None:
    with pytest.raises(PolicyRefused):
        plan(allowlist_domains=["api.openai.com\nhttp_access allow all"], inference_urls=None)


# --- the environment object ------------------------------------------------------


def make_env(
    tmp_path: Path,
    *,
    allowlist: list[str] | None,
    allow_internet: bool = False,
    session: str = "task_002__abc1234",
    **kwargs: Any,
) -> IsolatedDockerEnvironment:
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\n")
    trial_paths = TrialPaths(trial_dir=tmp_path / "trial")
    trial_paths.mkdir()  # type: ignore[no-untyped-call]
    return IsolatedDockerEnvironment(
        environment_dir=env_dir,
        environment_name="task_002",
        session_id=session,
        trial_paths=trial_paths,
        task_env_config=EnvironmentConfig(docker_image=BASE_IMAGE, allow_internet=allow_internet),
        network_allowlist=NetworkAllowlist(domains=allowlist) if allowlist is not None else None,
        **kwargs,
    )


def test_egress_environment_writes_proxy_files_and_compose_last(tmp_path: Path) -> None:
    env = make_env(
        tmp_path,
        allowlist=["api.openai.com", "gw"],
        inference_urls='["http://gw:4000/v1"]',
        proxy_image=PROXY_IMAGE,
    )
    env._prepare_egress_proxy_compose()
    policy_dir = tmp_path / "trial" / "network-policy" / "task_002__abc1234"
    compose_path = policy_dir / "docker-compose-policy.json"
    paths = env._docker_compose_paths
    assert paths[-1] == compose_path
    assert not any(p.name == "docker-compose-no-network.yaml" for p in paths)
    compose = json.loads(compose_path.read_text())
    assert compose["services"]["sb-egress-proxy"]["image"] == PROXY_IMAGE
    conf = (policy_dir / "squid.conf").read_text()
    assert "acl gateway_1_host dstdomain -n gw" in conf
    assert "acl gateway_1_port port 4000" in conf
    assert oct((policy_dir / "squid.passwd").stat().st_mode & 0o777) == "0o644"
    proxy_env = env.agent_process_env(None)
    assert proxy_env is not None
    token = proxy_env["HTTPS_PROXY"].split(":")[2].split("@")[0]
    assert proxy_env["HTTP_PROXY"] == f"http://agent:{token}@sb-egress-proxy:8080"
    # The token itself never lands on disk, only its digest.
    assert token not in (policy_dir / "squid.passwd").read_text()


def test_no_allowlist_environment_is_network_none(tmp_path: Path) -> None:
    env = make_env(tmp_path, allowlist=None, inference_urls=["http://gw:4000/v1"])
    env._prepare_egress_proxy_compose()
    paths = env._docker_compose_paths
    names = [p.name for p in paths]
    assert "docker-compose-no-network.yaml" in names
    assert names[-1] == "docker-compose-policy.json"
    compose = json.loads(paths[-1].read_text())
    assert compose == {
        "services": {
            "main": {
                "cap_drop": ["NET_ADMIN", "NET_RAW"],
                "privileged": False,
                "stop_signal": "SIGKILL",
                "logging": {"driver": "json-file", "options": {"max-size": "10m", "max-file": "2"}},
                "labels": {
                    "org.sciencebench.network-role": "agent",
                    "org.sciencebench.owner": hostlocks.owner_id(),
                },
                "network_mode": "none",
                "pids_limit": DEFAULT_PIDS_LIMIT,
                "deploy": {"resources": {"limits": {"pids": DEFAULT_PIDS_LIMIT, "memory": "2048M"}}},
                "memswap_limit": "2048M",  # the task names no memory_mb: the default request
            }
        }
    }
    assert env.agent_process_env(None) is None


def test_proxy_image_comes_from_the_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCIENCEBENCH_PROXY_IMAGE", PROXY_IMAGE)
    env = make_env(tmp_path, allowlist=["api.openai.com"])
    env._prepare_egress_proxy_compose()
    compose = json.loads(env._docker_compose_paths[-1].read_text())
    assert compose["services"]["sb-egress-proxy"]["image"] == PROXY_IMAGE


def test_start_refuses_internet_before_touching_docker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No DOCKER_HOST that answers: a refusal must come before any engine call.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    env = make_env(tmp_path, allowlist=None, allow_internet=True)
    with pytest.raises(PolicyRefused, match="allow_internet"):
        asyncio.run(env.start(force_build=False))
    assert not (tmp_path / "trial" / "network-policy").exists()


def test_bad_keywords_do_not_break_construction(tmp_path: Path) -> None:
    # Pier builds the environment while creating the trial; a raise there would
    # abort the whole job, so bad values surface from start() instead.
    env = make_env(tmp_path, allowlist=["gw"], inference_urls=["ftp://gw/"], proxy_image="nope")
    with pytest.raises(PolicyRefused):
        env._make_plan()


def test_policy_violation_lists_every_check_and_pickles() -> None:
    import pickle

    error = PolicyViolation(["a: not Internal", "b: CapAdd"])
    assert "2 check(s)" in str(error) and "a: not Internal; b: CapAdd" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert copy.violations == error.violations and str(copy) == str(error)
    assert copy.stage == "policy"


# --- builds ------------------------------------------------------------------------

INSTALL = AgentInstallSpec(agent_name="claude-code", steps=[InstallStep(run="true")])


def build_env(
    tmp_path: Path, *, docker_image: str | None, install: AgentInstallSpec | None = None, **kwargs: Any
) -> IsolatedDockerEnvironment:
    """A no-egress environment of a task with `docker_image` (None: Dockerfile only)."""
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN true\n")
    trial_paths = TrialPaths(trial_dir=tmp_path / "trial")
    trial_paths.mkdir()  # type: ignore[no-untyped-call]
    return IsolatedDockerEnvironment(
        environment_dir=env_dir, environment_name="task_002", session_id="task_002__abc1234",
        trial_paths=trial_paths,
        task_env_config=EnvironmentConfig(docker_image=docker_image, allow_internet=False),
        agent_install_spec=install, owner="owner-1", **kwargs,
    )  # fmt: skip


def override_build(env: IsolatedDockerEnvironment) -> object:
    env._prepare_egress_proxy_compose()
    return json.loads(env._docker_compose_paths[-1].read_text())["services"]["main"].get("build")


@pytest.mark.parametrize(
    ("docker_image", "install", "keywords", "force_build", "build"),
    [
        (None, None, {}, False, {"network": "none"}),  # a Dockerfile-only task
        (BASE_IMAGE, None, {}, False, None),  # prebuilt: no `build` key that would make it built
        (BASE_IMAGE, None, {}, True, {"network": "none"}),  # force_build rebuilds the Dockerfile
        (BASE_IMAGE, INSTALL, {"agent_install": "baked"}, False, {"network": "none"}),  # Pier's derived build
        (BASE_IMAGE, INSTALL, {}, False, {"network": "none"}),  # the online install's too, were it Pier's
        (BASE_IMAGE, INSTALL, {"agent_install": "online"}, False, {"network": "none"}),
    ],
)
def test_every_build_gets_no_network(
    tmp_path: Path,
    docker_image: str | None,
    install: AgentInstallSpec | None,
    keywords: dict[str, str],
    force_build: bool,
    build: object,
) -> None:
    env = build_env(tmp_path, docker_image=docker_image, install=install, **keywords)
    env._force_build = force_build
    assert override_build(env) == build


def test_a_task_compose_build_gets_no_network_even_with_a_docker_image(tmp_path: Path) -> None:
    env = build_env(tmp_path, docker_image=BASE_IMAGE)
    (tmp_path / "task" / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    build: .\n"
    )
    assert override_build(env) == {"network": "none"}


def test_an_online_install_of_a_dockerfile_task_is_refused_before_docker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    env = build_env(tmp_path, docker_image=None, install=INSTALL, agent_install="online")
    with pytest.raises(PolicyRefused, match="needs a task with a pinned docker_image"):
        asyncio.run(env.start(force_build=False))
    assert not (tmp_path / "trial" / "agent-build-context").exists()  # Pier's start never ran


def test_a_bad_agent_install_keyword_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    env = build_env(tmp_path, docker_image=BASE_IMAGE, install=INSTALL, agent_install="sometimes")
    with pytest.raises(PolicyRefused, match="agent_install: expected one of online, baked"):
        asyncio.run(env.start(force_build=False))


def test_an_online_install_of_an_agent_without_pinned_artifacts_is_refused_before_docker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    install = AgentInstallSpec(agent_name="cursor-cli", steps=[InstallStep(run="true")])
    env = build_env(tmp_path, docker_image=BASE_IMAGE, install=install)
    with pytest.raises(PolicyRefused, match="cursor-cli cannot be installed online: sciencebench pins no"):
        asyncio.run(env.start(force_build=False))


def test_an_online_install_the_engine_cannot_make_fails_as_pier_s_install_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An Engine that refuses the connection (on loopback: docker-py leaks the socket of a missing unix path).
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")
    env = build_env(tmp_path, docker_image=BASE_IMAGE, install=INSTALL, agent_artifacts=str(tmp_path / "a"))
    with pytest.raises(RuntimeError, match=r"^Agent install failed: "):
        asyncio.run(env.start(force_build=False))
    assert not (tmp_path / "trial" / "agent-build-context").exists()  # Pier's start never ran


def test_the_online_install_carries_the_trials_labels(tmp_path: Path) -> None:
    # The task image's code runs there: the trial's disk watch and cleanup find it by these.
    env = build_env(tmp_path, docker_image=BASE_IMAGE, install=INSTALL)
    assert env._install_labels() == {
        COMPOSE_PROJECT_LABEL: "task_002__abc1234", MANAGED_LABEL: "install", OWNER_LABEL: "owner-1"
    }  # fmt: skip


def test_a_symlinked_task_directory_is_refused(tmp_path: Path) -> None:
    env = build_env(tmp_path / "real", docker_image=BASE_IMAGE)
    (tmp_path / "real" / "task" / "task.toml").write_text("")
    (tmp_path / "task").symlink_to(tmp_path / "real" / "task")
    env.environment_dir = tmp_path / "task" / "environment"
    assert env._task_dir == tmp_path / "task"
    # Refused as such, before anything resolves it (the review would find its `environment` inside one).
    with pytest.raises(PolicyRefused, match="the task directory task is a symlink"):
        env._check_task_files()
