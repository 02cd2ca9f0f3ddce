"""profiles.py: env files, provider translation and gateway URLs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from sciencebench.core.envfile import parse_env_text
from sciencebench.core.errors import ProfileError
from sciencebench.core.gateways import Gateway, parse_gateway
from sciencebench.core.harnesses import REGISTRY
from sciencebench.core.models import AgentPlan
from sciencebench.login.options import SubmitOptions
from sciencebench.login.profiles import (
    is_sensitive_key,
    parse_assignments,
    plan_agent,
    proxy_variable_problem,
    read_env_file,
)
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit
CODEX_ADAPTER = REGISTRY["codex"].adapter

CANARY = "canary-Zq9xK2pW7vLm"


def plan(agent: str = "codex", env: dict[str, str] | None = None, **kw: object) -> AgentPlan:
    args: dict[str, object] = {
        "agent": agent,
        "env_values": {"OPENAI_API_KEY": CANARY} if env is None else env,
        "models": [],
        "agent_kwargs": {},
        "agent_env": {},
        "agent_import_path": None,
        "auto_provider": True,
        "auto_agent_adapter": True,
        "dry_run": False,
    }
    args.update(kw)
    return plan_agent(**args)  # type: ignore[arg-type]


# --- env-file grammar ------------------------------------------------------------


def test_env_file_grammar() -> None:
    text = (
        "# a provider profile\n"
        "\n"
        "MODEL=gpt-5\n"
        "export OPENAI_API_KEY=sk-test-123\n"
        "   \n"
        'CODEX_BASE_URL="https://gw.example.edu/v1"\n'
        "CODEX_WIRE_API='responses'\n"
        "CODEX_VERSION=latest # the newest one\n"
        'QUOTED_HASH="keep # this"\n'
        "SINGLE='keep # this too'\n"
        "URL_FRAGMENT=http://gw.example/#anchor\n"
        "EMPTY=\n"
        "SPACED = padded value  \n"
        "NO_INTERPOLATION=${MODEL}\n"
        "\t# indented comment\n"
    )
    assert parse_env_text(text, "profile.env") == {
        "MODEL": "gpt-5",
        "OPENAI_API_KEY": "sk-test-123",
        "CODEX_BASE_URL": "https://gw.example.edu/v1",
        "CODEX_WIRE_API": "responses",
        "CODEX_VERSION": "latest",
        "QUOTED_HASH": "keep # this",
        "SINGLE": "keep # this too",
        "URL_FRAGMENT": "http://gw.example/#anchor",
        "EMPTY": "",
        "SPACED": "padded value",
        "NO_INTERPOLATION": "${MODEL}",
    }


def test_env_file_later_assignment_wins_and_crlf_is_accepted() -> None:
    assert parse_env_text("A=1\r\nB=2\r\nA=3\r\n", "f") == {"A": "3", "B": "2"}


def test_env_file_empty_text() -> None:
    assert parse_env_text("", "f") == {}
    assert parse_env_text("\n\n# only comments\n", "f") == {}


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (f"this is not {CANARY}\n", 1),
        (f"A=1\nB=2\nthis is not {CANARY}\n", 3),
        (f"A=1\n\n\nthis is not {CANARY}\n", 4),
        (f"# comment\n\nA=1\n\n# another\n\nbad line {CANARY}\n", 7),
        (f'A=1\nB="{CANARY}\n', 2),
        (f"\r\n\r\nthis is not {CANARY}\r\n", 3),
    ],
)
def test_malformed_line_is_reported_by_number_without_its_content(text: str, line: int) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_env_text(text, "--env-file /x/profile.env")
    message = str(caught.value)
    assert message == f"--env-file /x/profile.env: line {line}: not a KEY=value line"
    assert CANARY not in message


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (f"1KEY={CANARY}\n", 1),
        (f"A=1\nMY-KEY={CANARY}\n", 2),
        (f"A=1\n\nMY.KEY={CANARY}\n", 3),
        (f"'A\n'={CANARY}\n", 1),  # a quoted name with a line break in it
        (f"'A B'={CANARY}\n", 1),
    ],
)
def test_invalid_key_is_reported_by_number(text: str, line: int) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_env_text(text, "f")
    assert str(caught.value) == f"f: line {line}: invalid variable name"
    assert CANARY not in str(caught.value)


def test_name_without_value_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"^f: line 2: variable has no '=value'$"):
        parse_env_text("A=1\nOPENAI_API_KEY\n", "f")


def test_read_env_file_identity(tmp_path: Path) -> None:
    path = tmp_path / "codex.env"
    data = b"OPENAI_API_KEY=sk-1\nMODEL=m\n"
    path.write_bytes(data)
    identity, values = read_env_file(path)
    assert values == {"OPENAI_API_KEY": "sk-1", "MODEL": "m"}
    assert identity.path == path.resolve()
    assert identity.sha256 == hashlib.sha256(data).hexdigest()


def test_read_env_file_missing(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"no such file"):
        read_env_file(tmp_path / "missing.env")


def test_read_env_file_directory(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"unreadable"):
        read_env_file(tmp_path)


def test_read_env_file_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "x.env"
    path.write_bytes(b"KEY=\xff\xfe\n")
    with pytest.raises(ProfileError, match="not UTF-8"):
        read_env_file(path)


def test_read_env_file_malformed_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.env"
    path.write_text(f"A=1\n{CANARY} oops\n")
    with pytest.raises(ProfileError) as caught:
        read_env_file(path)
    assert str(caught.value) == f"--env-file {path}: line 2: not a KEY=value line"


# --- repeated KEY=VALUE options -------------------------------------------------


def test_parse_assignments() -> None:
    assert parse_assignments(["A=1", "B=x=y", "C="], "--agent-env") == {"A": "1", "B": "x=y", "C": ""}
    assert parse_assignments(["reasoning.summary=auto"], "--agent-kwarg") == {"reasoning.summary": "auto"}


@pytest.mark.parametrize("item", [CANARY, f"={CANARY}"])
def test_parse_assignments_without_key_never_echoes(item: str) -> None:
    with pytest.raises(ProfileError, match=r"^--agent-env #2: expected KEY=VALUE$"):
        parse_assignments(["A=1", item], "--agent-env")


@pytest.mark.parametrize("key", ["1A", "A-B", "A B", "A\n"])
def test_agent_env_names_must_be_variable_names(key: str) -> None:
    with pytest.raises(ProfileError, match="invalid variable name"):
        parse_assignments([f"{key}={CANARY}"], "--agent-env")


@pytest.mark.parametrize(
    ("key", "sensitive"),
    [
        ("OPENAI_API_KEY", True),
        ("ANTHROPIC_AUTH_TOKEN", True),
        ("DB_PASSWORD", True),
        ("HTTP_AUTHORIZATION", True),
        ("client_secret", True),
        ("MODEL", False),
        ("CODEX_BASE_URL", False),
        ("CODEX_VERSION", False),
    ],
)
def test_is_sensitive_key(key: str, sensitive: bool) -> None:
    assert is_sensitive_key(key) is sensitive


# --- codex translation -------------------------------------------------------------


def test_codex_defaults() -> None:
    result = plan()
    assert result.agent is None
    assert result.agent_import_path == CODEX_ADAPTER
    assert result.models == ["gpt-5"]
    assert set(result.agent_kwargs) == {"base_url", "wire_api"}
    assert result.agent_kwargs["wire_api"] == "responses"
    base = urlsplit(result.agent_kwargs["base_url"])
    assert (base.scheme, base.hostname, base.port or 443, base.path) == (
        "https",
        "api.openai.com",
        443,
        "/v1",
    )
    assert result.provider is not None
    assert result.provider.protocol == "responses"
    assert result.provider.base_url == result.agent_kwargs["base_url"]
    assert result.provider.credential_env == "OPENAI_API_KEY"
    assert [g.authority for g in result.gateways] == ["api.openai.com:443"]
    assert CANARY not in result.model_dump_json()


def test_codex_profile_translation() -> None:
    env = {
        "MODEL": "my-deployment",
        "OPENAI_API_KEY": CANARY,
        "CODEX_BASE_URL": "http://host.docker.internal:4001/v1/",
        "CODEX_WIRE_API": "chat",
        "CODEX_VERSION": "0.42.0",
        "CODEX_REASONING_EFFORT": "high",
    }
    result = plan(env=env)
    assert result.models == ["my-deployment"]
    assert result.agent_kwargs == {
        "base_url": "http://host.docker.internal:4001/v1/",
        "wire_api": "chat",
        "version": "0.42.0",
        "reasoning_effort": "high",
    }
    assert result.provider is not None
    assert result.provider.protocol == "chat"
    # As written, without credentials or query: no port is added, nothing else changes.
    assert result.provider.base_url == "http://host.docker.internal:4001/v1/"
    assert [g.authority for g in result.gateways] == ["host.docker.internal:4001"]
    assert CANARY not in result.model_dump_json()


def test_codex_explicit_models_and_kwargs_win_over_the_profile() -> None:
    env = {"MODEL": "profile-model", "OPENAI_API_KEY": CANARY, "CODEX_REASONING_EFFORT": "high"}
    result = plan(env=env, models=["a", "b"], agent_kwargs={"reasoning_effort": "low"})
    assert result.models == ["a", "b"]
    assert result.agent_kwargs["reasoning_effort"] == "low"


def test_codex_openai_base_url_is_the_fallback_gateway() -> None:
    result = plan(env={"OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": "https://fallback.example/v1"})
    assert result.agent_kwargs["base_url"] == "https://fallback.example/v1"
    both = {
        "OPENAI_API_KEY": CANARY,
        "OPENAI_BASE_URL": "https://fallback.example/v1",
        "CODEX_BASE_URL": "https://primary.example/v1",
    }
    assert plan(env=both).agent_kwargs["base_url"] == "https://primary.example/v1"


# --- the profile as the original reads it (issue 25) -------------------------------------


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_codex_base_url_falls_back_to_the_default(empty: str) -> None:
    result = plan(env={"OPENAI_API_KEY": CANARY, "CODEX_BASE_URL": empty})
    assert result.agent_kwargs["base_url"] == "https://api.openai.com/v1"
    assert [g.authority for g in result.gateways] == ["api.openai.com:443"]
    # ... and to OPENAI_BASE_URL first, as `CODEX_BASE_URL or OPENAI_BASE_URL` does.
    fallback = {"OPENAI_API_KEY": CANARY, "CODEX_BASE_URL": empty, "OPENAI_BASE_URL": "http://gw:4000/v1"}
    assert plan(env=fallback).agent_kwargs["base_url"] == "http://gw:4000/v1"


@pytest.mark.parametrize(
    ("given", "wire_api"),
    [("Responses", "responses"), ("CHAT", "chat"), (" chat ", "chat"), ("", "responses")],
)
def test_codex_wire_api_is_case_insensitive_and_empty_means_default(given: str, wire_api: str) -> None:
    result = plan(env={"OPENAI_API_KEY": CANARY, "CODEX_WIRE_API": given})
    assert result.agent_kwargs["wire_api"] == wire_api
    assert result.provider is not None and result.provider.protocol == wire_api


@pytest.mark.parametrize("variable", ["CODEX_REASONING_EFFORT", "CODEX_VERSION"])
def test_empty_optional_codex_fields_are_unset(variable: str) -> None:
    # An empty CODEX_REASONING_EFFORT= would otherwise become `-c model_reasoning_effort=`.
    result = plan(env={"OPENAI_API_KEY": CANARY, variable: ""})
    assert set(result.agent_kwargs) == {"base_url", "wire_api"}


def test_an_empty_model_means_the_default_model() -> None:
    assert plan(env={"OPENAI_API_KEY": CANARY, "MODEL": ""}).models == ["gpt-5"]


@pytest.mark.parametrize("wire_api", ["grpc", "respond", "chat2"])
def test_codex_bad_wire_api(wire_api: str) -> None:
    with pytest.raises(ProfileError, match=r"^CODEX_WIRE_API: must be 'responses' or 'chat'$"):
        plan(env={"OPENAI_API_KEY": CANARY, "CODEX_WIRE_API": wire_api})


def test_codex_requires_a_key_unless_dry_run() -> None:
    with pytest.raises(ProfileError, match="OPENAI_API_KEY: required"):
        plan(env={})
    with pytest.raises(ProfileError, match="OPENAI_API_KEY: required"):
        plan(env={"OPENAI_API_KEY": ""})
    assert plan(env={}, dry_run=True).models == ["gpt-5"]
    from_agent_env = plan(env={}, agent_env={"OPENAI_API_KEY": CANARY})
    assert from_agent_env.agent_env_names == ["OPENAI_API_KEY"]
    assert CANARY not in from_agent_env.model_dump_json()


def test_codex_bad_gateway_names_the_variable() -> None:
    with pytest.raises(ProfileError, match=r"^CODEX_BASE_URL: only http"):
        plan(env={"OPENAI_API_KEY": CANARY, "CODEX_BASE_URL": "ftp://gw.example/v1"})


def test_no_auto_provider_leaves_codex_untranslated() -> None:
    env = {"OPENAI_API_KEY": CANARY, "MODEL": "m", "CODEX_WIRE_API": "bogus", "CODEX_VERSION": "1"}
    result = plan(env=env, auto_provider=False)
    assert result.models == []
    assert result.agent_kwargs == {}
    assert result.provider is None
    assert result.gateways == []
    # The adapter is a separate switch.
    assert result.agent_import_path == CODEX_ADAPTER


def test_no_auto_agent_adapter_uses_pier_builtin_codex() -> None:
    result = plan(auto_agent_adapter=False)
    assert result.agent == "codex"
    assert result.agent_import_path is None


# Keywords Pier 0.3.0's built-in Codex agent understands (pier/agents/installed/codex.py);
# Pier's BaseAgent swallows any other keyword silently.
PIER_CODEX_KWARGS = {
    "config_toml",
    "config_toml_file",
    "reasoning_effort",
    "reasoning_summary",
    "version",
    "prompt_template_path",
}


def test_no_auto_agent_adapter_still_translates_the_profile_for_pier_codex() -> None:
    # --no-auto-agent-adapter only swaps the adapter for Pier's own agent; the
    # profile must still reach that agent. `base_url`/`wire_api` are keywords
    # of sciencebench's adapter only: the built-in agent drops them, so the
    # agent would talk to api.openai.com while the record names the gateway.
    env = {"OPENAI_API_KEY": CANARY, "CODEX_BASE_URL": "https://gw.example.edu:4000/v1"}
    result = plan(env=env, auto_agent_adapter=False)
    assert result.agent == "codex"
    assert set(result.agent_kwargs) <= PIER_CODEX_KWARGS
    assert "https://gw.example.edu:4000/v1" in result.agent_kwargs.get("config_toml", "")


def test_explicit_agent_import_path_replaces_the_agent() -> None:
    result = plan(agent_import_path="my_pkg.agents:Custom")
    assert result.agent is None
    assert result.agent_import_path == "my_pkg.agents:Custom"
    other = plan(agent="mini-swe-agent", env={}, agent_import_path="my_pkg.agents:Mini")
    assert (other.agent, other.agent_import_path) == (None, "my_pkg.agents:Mini")


def test_nop_has_no_provider() -> None:
    result = plan(agent="nop", env={"OPENAI_API_KEY": CANARY})
    assert result.agent == "nop"
    assert result.agent_import_path is None
    assert result.provider is None
    assert result.gateways == []
    assert result.models == []


def test_agent_env_names_sorted_values_absent() -> None:
    result = plan(agent="nop", env={}, agent_env={"ZED": CANARY, "ALPHA": CANARY})
    assert result.agent_env_names == ["ALPHA", "ZED"]
    assert CANARY not in result.model_dump_json()


def test_claude_code_gateway_from_anthropic_base_url() -> None:
    env = {
        "ANTHROPIC_AUTH_TOKEN": CANARY,
        "ANTHROPIC_BASE_URL": f"https://user:{CANARY}@gw.example.edu:8443/anthropic/?key={CANARY}",
        "ANTHROPIC_CUSTOM_HEADERS": "",
    }
    result = plan(agent="claude-code", env=env, models=["anthropic/claude-opus-4-7"])
    assert result.agent == "claude-code"
    assert result.agent_import_path is None
    assert result.models == ["anthropic/claude-opus-4-7"]
    assert result.agent_kwargs == {}
    assert result.gateways == [Gateway(scheme="https", host="gw.example.edu", port=8443, path="/anthropic")]
    # The original names a provider only for the Codex profile it translates.
    assert result.provider is None
    assert CANARY not in result.model_dump_json()


def test_claude_code_without_gateway() -> None:
    result = plan(agent="claude-code", env={"ANTHROPIC_API_KEY": CANARY})
    assert result.provider is None
    assert result.gateways == []


def test_claude_code_bad_gateway() -> None:
    with pytest.raises(ProfileError, match=r"^ANTHROPIC_BASE_URL: port outside 1-65535"):
        plan(agent="claude-code", env={"ANTHROPIC_BASE_URL": "https://gw.example:0"})


def test_mini_swe_agent_gateway() -> None:
    env = {"OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": "http://10.0.0.5:4000/v1"}
    result = plan(agent="mini-swe-agent", env=env)
    assert [g.authority for g in result.gateways] == ["10.0.0.5:4000"]
    assert result.provider is None


@pytest.mark.parametrize(
    ("agent", "variable"),
    [
        ("mini-swe-agent", "ANTHROPIC_BASE_URL"),
        ("mini-swe-agent", "OPENROUTER_API_BASE"),
        ("gemini-cli", "GOOGLE_GEMINI_BASE_URL"),
        ("gemini-cli", "GEMINI_API_BASE"),
    ],
)
def test_every_base_url_the_harness_reads_becomes_a_gateway(agent: str, variable: str) -> None:
    # The worker's proxy allows the job's gateways only, so each one the harness can use must be passed.
    result = plan(agent=agent, env={"SOME_API_KEY": CANARY, variable: "http://gw.example.edu:4000/v1"})
    assert [g.authority for g in result.gateways] == ["gw.example.edu:4000"]


# --- gateway URLs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://gw.example.edu/v1", ("https", "gw.example.edu", 443, "/v1")),
        ("http://gw.example.edu/v1/", ("http", "gw.example.edu", 80, "/v1")),
        ("http://GW.Example.EDU:4000", ("http", "gw.example.edu", 4000, "")),
        ("HTTPS://gw:1/x", ("https", "gw", 1, "/x")),
        ("http://127.0.0.1:65535/v1", ("http", "127.0.0.1", 65535, "/v1")),
        ("http://host.docker.internal:4001/v1", ("http", "host.docker.internal", 4001, "/v1")),
    ],
)
def test_gateway_accepted(url: str, expected: tuple[str, str, int, str]) -> None:
    gateway = parse_gateway(url, "CODEX_BASE_URL")
    assert (gateway.scheme, gateway.host, gateway.port, gateway.path) == expected
    assert gateway.authority == f"{expected[1]}:{expected[2]}"
    assert gateway.url == f"{expected[0]}://{expected[1]}:{expected[2]}{expected[3]}"


def test_gateway_user_info_query_and_fragment_are_stripped() -> None:
    gateway = parse_gateway(f"https://me:{CANARY}@gw.example.edu:8443/v1?api_key={CANARY}#{CANARY}", "X")
    assert gateway.url == "https://gw.example.edu:8443/v1"
    assert gateway.authority == "gw.example.edu:8443"
    assert CANARY not in gateway.model_dump_json()


def test_ipv6_gateway_url_keeps_brackets_and_round_trips() -> None:
    gateway = parse_gateway("http://[::1]:4000/v1", "X")
    assert gateway.host == "::1"
    assert gateway.authority == "[::1]:4000"
    assert gateway.url == "http://[::1]:4000/v1"
    assert parse_gateway(gateway.url, "X") == gateway


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://gw.example/v1", "only http:// and https://"),
        ("file:///etc/passwd", "only http:// and https://"),
        ("gw.example:4000/v1", "only http:// and https://"),
        ("ws://gw.example/v1", "only http:// and https://"),
        ("", "only http:// and https://"),
        ("http:///v1", "missing or invalid host"),
        ("http://ho_st/v1", "missing or invalid host"),
        ("http://-bad-.example/v1", "missing or invalid host"),
        ("http://bad host/v1", "missing or invalid host"),
        ("http://gw.example:0/v1", "port outside 1-65535"),
        ("http://gw.example:65536/v1", "port outside 1-65535"),
        ("http://gw.example:99999/v1", "port outside 1-65535"),
        ("http://gw.example:http/v1", "port outside 1-65535"),
        ("http://gw.example/v1\nX-Injected: 1", "control or encoded line-break"),
        ("http://gw.example/v1\r", "control or encoded line-break"),
        ("http://gw.example/v1\x00", "control or encoded line-break"),
        ("http://gw.example/v1\t", "control or encoded line-break"),
        ("http://gw.example/v1%0aX-Injected:%201", "control or encoded line-break"),
        ("http://gw.example/v1%0D%0A", "control or encoded line-break"),
        ("http://gw.example/%00", "control or encoded line-break"),
    ],
)
def test_gateway_refused(url: str, why: str) -> None:
    with pytest.raises(ProfileError, match=f"^CODEX_BASE_URL: .*{why}"):
        parse_gateway(url, "CODEX_BASE_URL")


@pytest.mark.parametrize(
    "url",
    [
        f"ftp://u:{CANARY}@gw.example/",
        f"http://u:{CANARY}@gw.example:99999/",
        f"http://u:{CANARY}@gw.example/%0a",
        f"http://{CANARY}_x/v1",
    ],
)
def test_gateway_errors_never_echo_the_url(url: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_gateway(url, "CODEX_BASE_URL")
    assert CANARY not in str(caught.value)


# --- proxies, adapters and keywords (issue 25) -------------------------------------------


@pytest.mark.parametrize("key", ["HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "ALL_PROXY"])
def test_a_network_proxy_is_refused_with_the_way_to_reach_a_gateway_behind_one(key: str) -> None:
    problem = proxy_variable_problem(key, "--env-file")
    assert problem is not None
    assert problem.startswith(f"--env-file: refused: {key}: ")
    assert "to reach a gateway behind a proxy" in problem and "docs/gateways.md" in problem
    assert "\n" not in problem
    assert proxy_variable_problem("OPENAI_BASE_URL", "--env-file") is None


def test_no_auto_provider_wires_no_codex_variable_and_no_default_gateway() -> None:
    env = {"OPENAI_API_KEY": CANARY, "CODEX_BASE_URL": "https://codex-gw.example/v1"}
    result = plan(env=env, auto_provider=False)
    # CODEX_BASE_URL is not translated: it neither configures the agent nor opens the proxy;
    # the default gateway (api.openai.com) is not added either.
    assert result.gateways == []
    assert result.agent_kwargs == {}
    native = plan(env={**env, "OPENAI_BASE_URL": "https://native.example/v1"}, auto_provider=False)
    assert [g.host for g in native.gateways] == ["native.example"]
    own = 'model_provider = "m"\n[model_providers.m]\nbase_url = "http://own.example:4000/v1"\n'
    # The adapter takes a config_toml of the job's own then (nothing is generated to conflict with it).
    configured = plan(env=env, auto_provider=False, agent_kwargs={"config_toml": own})
    assert configured.agent_import_path == CODEX_ADAPTER
    assert configured.agent_kwargs == {"config_toml": own}
    assert [g.authority for g in configured.gateways] == ["own.example:4000"]


def test_a_custom_codex_class_gets_the_generated_provider_block() -> None:
    # base_url/wire_api are keywords of sciencebench's adapter only: Pier's base agent would
    # swallow them and the class would talk to the default host. config_toml is Pier Codex's own.
    env = {"OPENAI_API_KEY": CANARY, "CODEX_BASE_URL": "https://gw.example.edu:4000/v1"}
    result = plan(env=env, agent_import_path="my_pkg.agents:MyCodex")
    assert result.agent_import_path == "my_pkg.agents:MyCodex"
    assert set(result.agent_kwargs) == {"config_toml"}
    builtin = plan(env=env, auto_agent_adapter=False)
    assert result.agent_kwargs["config_toml"] == builtin.agent_kwargs["config_toml"]
    assert 'base_url = "https://gw.example.edu:4000/v1"' in result.agent_kwargs["config_toml"]
    assert [g.authority for g in result.gateways] == ["gw.example.edu:4000"]


@pytest.mark.parametrize("key", ["max_thinking_tokens", "api_key", "auth_token", "Secret_Header"])
def test_credential_looking_keywords_travel(key: str) -> None:
    # The original passes them on and redacts them in its record; only host-file names are refused.
    result = plan(agent="claude-code", env={}, agent_kwargs={key: "16000"})
    assert result.agent_kwargs == {key: "16000"}


@pytest.mark.parametrize("key", ["config_toml_file", "prompt_template_path", "skills_dir"])
def test_keywords_naming_host_files_are_still_refused(key: str) -> None:
    with pytest.raises(ProfileError, match=f"^--agent-kwarg {key}: names a file on the worker hosts"):
        plan(agent="claude-code", env={}, agent_kwargs={key: "/etc/shadow"})


@pytest.mark.parametrize("source", ["env_file", "agent_env"])
def test_submit_refuses_a_proxy_variable_in_one_line_naming_the_way_round(
    tmp_path: Path, source: str
) -> None:
    selection = make_selection(tmp_path / "sel", ["002"])
    kw: dict[str, object] = {"agent_env": ["HTTPS_PROXY=http://proxy.example:3128"]}
    if source == "env_file":
        (tmp_path / "p.env").write_text("ANTHROPIC_AUTH_TOKEN=x\nHTTPS_PROXY=http://proxy.example:3128\n")
        kw = {"env_file": tmp_path / "p.env"}
    option = "--env-file" if source == "env_file" else "--agent-env"
    opts = SubmitOptions(path=selection, agent="claude-code", jobs_dir=tmp_path / "jobs", **kw)  # type: ignore[arg-type]
    with pytest.raises(
        ProfileError, match=f"^{option}: refused: HTTPS_PROXY: .*to reach a gateway behind a proxy"
    ):
        prepare(opts)
