"""ScienceBenchCodex: the generated provider config, parsed back; no model call."""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pier.environments.base import ExecResult
from pier.models.agent.context import AgentContext

from sciencebench.agents.codex import ScienceBenchCodex, render_provider_toml
from sciencebench.core.errors import ProfileError
from sciencebench.core.gateways import parse_gateway
from sciencebench.network.egress import plan_egress

pytestmark = pytest.mark.unit


def make_agent(tmp_path: Path, **kwargs: Any) -> ScienceBenchCodex:
    return ScienceBenchCodex(logs_dir=tmp_path / "agent", model_name="openai/gpt-5", **kwargs)


def parsed(agent: ScienceBenchCodex) -> dict[str, Any]:
    assert agent._config_toml is not None
    return tomllib.loads(agent._config_toml)


def test_provider_block_for_a_responses_gateway(tmp_path: Path) -> None:
    config = parsed(make_agent(tmp_path, base_url="http://gw:4000/v1", wire_api="responses"))
    assert config["model_provider"] == "sciencebench"
    assert config["model_providers"]["sciencebench"] == {
        "name": "sciencebench gateway",
        "base_url": "http://gw:4000/v1",
        "env_key": "OPENAI_API_KEY",
        "wire_api": "responses",
        "supports_websockets": False,
    }


def test_hosted_web_search_is_disabled_in_both_spellings(tmp_path: Path) -> None:
    config = parsed(make_agent(tmp_path, base_url="http://gw:4000/v1"))
    assert config["web_search"] == "disabled"
    assert config["tools"] == {"web_search": False}


def test_chat_wire_api_is_passed_through(tmp_path: Path) -> None:
    config = parsed(make_agent(tmp_path, base_url="https://gateway.example.edu/v1", wire_api="chat"))
    assert config["model_providers"]["sciencebench"]["wire_api"] == "chat"
    assert config["model_providers"]["sciencebench"]["base_url"] == "https://gateway.example.edu:443/v1"


def test_without_base_url_nothing_is_generated_and_no_default_host_is_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # submit --no-auto-provider: no CODEX_* translation, so no base_url. Pier's own Codex
    # agent would allow api.openai.com by default; the adapter allows only what the job names.
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_BASE", raising=False)
    bare = make_agent(tmp_path)
    assert bare._config_toml is None
    assert bare.gateway is None
    assert bare.network_allowlist().domains == []
    # The policy then gives the agent no egress at all: nothing reaches api.openai.com by default.
    egress = plan_egress(
        allow_internet=False, uses_compose=False, allowlist_domains=bare.network_allowlist().domains,
        inference_urls=None, proxy_image=None,
    )  # fmt: skip
    assert egress.mode == "none"
    own = 'model_provider = "mine"\n[model_providers.mine]\nbase_url = "http://own-gw.example:4000/v1"\n'
    configured = make_agent(tmp_path, config_toml=own)
    assert configured._config_toml == own  # passed on unchanged
    assert configured.network_allowlist().domains == ["own-gw.example"]
    monkeypatch.setenv("OPENAI_BASE_URL", "https://env-gw.example/v1")
    assert make_agent(tmp_path).network_allowlist().domains == ["env-gw.example"]


def test_command_model_name_sends_the_route_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Pier's Codex agent sends only what follows the last '/' of the model unless
    # command_model_name is given; submit passes the model itself (MODEL is the exact route).
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    for kwargs, expected in (({}, "my-deployment"), ({"command_model_name": "openai/my-deployment"}, None)):
        agent = ScienceBenchCodex(
            logs_dir=tmp_path / "agent",
            model_name="openai/my-deployment",
            base_url="http://gw:4000/v1",
            **kwargs,
        )
        environment = RecordingEnvironment()
        asyncio.run(agent.run("fix the bug", environment, AgentContext()))
        run = next(c for c in environment.commands if "codex exec" in c)
        assert f"--model {shlex.quote(expected or 'openai/my-deployment')} " in run


def test_credentials_and_query_never_reach_the_config(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, base_url="http://user:hunter2@gw:4000/v1?api_key=abc")
    assert agent._config_toml is not None
    assert "hunter2" not in agent._config_toml and "abc" not in agent._config_toml
    assert parsed(agent)["model_providers"]["sciencebench"]["base_url"] == "http://gw:4000/v1"


def test_network_allowlist_is_the_gateway_host(tmp_path: Path) -> None:
    assert make_agent(tmp_path, base_url="http://gw:4000/v1").network_allowlist().domains == ["gw"]


def test_pier_keywords_still_work(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, base_url="http://gw:4000/v1", version="0.46.0", reasoning_effort="low")
    assert agent.version() == "0.46.0"
    assert "-c model_reasoning_effort=low" in agent.build_cli_flags()
    assert any("@openai/codex@0.46.0" in step.run for step in agent.install_spec().steps)
    assert agent.name() == "codex"


@pytest.mark.parametrize(
    "kwargs", [{"wire_api": "completions"}, {"base_url": "ftp://gw/"}, {"base_url": "http://[::1]:4000"}]
)
def test_bad_settings_are_refused(tmp_path: Path, kwargs: dict[str, str]) -> None:
    with pytest.raises(ProfileError):
        make_agent(tmp_path, **kwargs)


@pytest.mark.parametrize("key", ["config_toml", "config_toml_file"])
def test_an_explicit_config_toml_is_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(ProfileError, match="config_toml"):
        make_agent(tmp_path, base_url="http://gw:4000/v1", **{key: "x"})


def test_unknown_wire_api_in_the_pure_renderer() -> None:
    with pytest.raises(ProfileError):
        render_provider_toml(parse_gateway("http://gw:4000", "x"), "grpc")


class RecordingEnvironment:
    """Just enough of a Pier environment for Codex.run: records every command."""

    default_user = None

    def __init__(self) -> None:
        self.commands: list[str] = []

    async def exec(self, command: str, **_: Any) -> ExecResult:
        self.commands.append(command)
        return ExecResult(stdout="", stderr="", return_code=0)

    def agent_process_env(self, env: dict[str, str] | None) -> dict[str, str] | None:
        return env

    async def upload_file(self, *_: Any) -> None:
        raise AssertionError("no auth.json upload expected")


def test_pier_appends_the_block_to_a_parseable_config_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pier also writes `openai_base_url` first when OPENAI_BASE_URL is set; the
    # combined file must still parse (top-level keys before our tables).
    monkeypatch.setenv("OPENAI_BASE_URL", "http://gw:4000/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    agent = make_agent(tmp_path, base_url="http://gw:4000/v1")
    environment = RecordingEnvironment()
    asyncio.run(agent.run("fix the bug", environment, AgentContext()))
    setup = next(c for c in environment.commands if "config.toml" in c)
    # Replay only the tail that writes $CODEX_HOME/config.toml, in a private CODEX_HOME
    # (the head writes the key file under /tmp, which a test must not touch).
    writes = setup[setup.index('cat >>"$CODEX_HOME/config.toml"') :]
    assert "/tmp/codex-secrets" not in writes
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    script = f"set -eu\n{writes}\n"
    subprocess.run(
        ["bash", "-c", script],
        check=True,
        env={
            "CODEX_HOME": str(codex_home),
            "OPENAI_BASE_URL": "http://gw:4000/v1",
            "PATH": os.environ["PATH"],
        },
    )
    config = tomllib.loads((codex_home / "config.toml").read_text())
    assert config["openai_base_url"] == "http://gw:4000/v1"
    assert config["model_provider"] == "sciencebench"
    assert config["web_search"] == "disabled"
    assert config["model_providers"]["sciencebench"]["base_url"] == "http://gw:4000/v1"
    run = next(c for c in environment.commands if "codex exec" in c)
    assert "--model gpt-5" in run and shlex.quote("fix the bug") in run
