"""Provider profiles on the login node: env files, `KEY=VALUE` options, provider translation.

An env file holds credentials. Its values go to Pier only through Pier's
process environment on the worker; what leaves this module for records,
messages or logs is names, hashes and validated gateway URLs.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

from sciencebench.core.agent_kwargs import agent_kwarg_problem
from sciencebench.core.envfile import VARIABLE_NAME, EnvFile, parse_env_text
from sciencebench.core.errors import ProfileError
from sciencebench.core.gateways import (
    DEFAULT_CODEX_BASE_URL,
    DEFAULT_CODEX_MODEL,
    WIRE_APIS,
    Gateway,
    parse_gateway,
    render_provider_toml,
)
from sciencebench.core.harness import CODEX_ADAPTER
from sciencebench.core.models import AgentPlan, Provider

_SENSITIVE_WORDS = ("key", "token", "secret", "password", "authorization")


def read_env_file(path: Path) -> tuple[EnvFile, dict[str, str]]:
    """Read and parse an env file; return its identity and its values."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ProfileError(f"--env-file {path}: no such file") from None
    except OSError as exc:
        raise ProfileError(f"--env-file {path}: unreadable ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProfileError(f"--env-file {path}: not UTF-8 text") from None
    values = parse_env_text(text, f"--env-file {path}")
    return EnvFile(path=path.resolve(), sha256=hashlib.sha256(data).hexdigest()), values


def parse_assignments(items: list[str], option: str) -> dict[str, str]:
    """Parse repeated `KEY=VALUE` options; the value is never echoed in errors."""
    parsed: dict[str, str] = {}
    for position, item in enumerate(items, start=1):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ProfileError(f"{option} #{position}: expected KEY=VALUE")
        if option == "--agent-env" and not VARIABLE_NAME.fullmatch(key):
            raise ProfileError(f"{option} #{position}: invalid variable name {key!r}")
        parsed[key] = value
    return parsed


def is_sensitive_key(key: str) -> bool:
    """Whether a variable or keyword name looks like it holds a credential."""
    lowered = key.lower()
    return any(word in lowered for word in _SENSITIVE_WORDS)


# --- provider translation --------------------------------------------------


def config_toml_gateways(config_toml: str | None) -> list[Gateway]:
    """The gateways an explicit Codex `config_toml` names (`base_url` of its model providers).

    They join the proxy's allowlist like CODEX_BASE_URL would. Raises
    ProfileError when the TOML does not parse or a base URL is not a valid gateway.
    """
    if not config_toml:
        return []
    try:
        parsed = tomllib.loads(config_toml)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"--agent-kwarg config_toml: not valid TOML ({exc})") from None
    providers = parsed.get("model_providers") or {}
    urls = [p.get("base_url") for p in providers.values() if isinstance(p, dict)]
    if isinstance(parsed.get("openai_base_url"), str):
        urls.append(parsed["openai_base_url"])
    return [parse_gateway(url, "config_toml base_url") for url in urls if isinstance(url, str)]


# Variables naming a model gateway, per harness (the base URL variables the harness reads).
# The worker's proxy allows these gateways and nothing else: a harness's own provider
# allowlist is used only when none is set (docs/network-policy.md).
_GATEWAY_VARIABLES = {
    "codex": ("CODEX_BASE_URL", "OPENAI_BASE_URL"),
    "claude-code": ("ANTHROPIC_BASE_URL",),
    "mini-swe-agent": (
        "OPENAI_BASE_URL", "OPENAI_API_BASE", "ANTHROPIC_BASE_URL", "GEMINI_API_BASE", "OPENROUTER_API_BASE",
    ),
    "gemini-cli": ("GOOGLE_GEMINI_BASE_URL", "GEMINI_API_BASE"),
}  # fmt: skip


def plan_agent(
    *,
    agent: str,
    env_values: dict[str, str],
    models: list[str],
    agent_kwargs: dict[str, str],
    agent_env: dict[str, str],
    agent_import_path: str | None,
    auto_provider: bool,
    auto_agent_adapter: bool,
    dry_run: bool,
) -> AgentPlan:
    """Translate the seed's provider profile into Pier agent arguments.

    With `--agent codex` (and auto provider on) MODEL, CODEX_BASE_URL,
    CODEX_WIRE_API, CODEX_VERSION and CODEX_REASONING_EFFORT become keyword
    arguments of sciencebench's Codex adapter; OPENAI_API_KEY stays in the
    environment. Raises ProfileError on a bad wire API, a bad gateway URL or a
    missing credential (unless `dry_run`).
    """
    sensitive = sorted(key for key in agent_kwargs if is_sensitive_key(key))
    if sensitive:
        raise ProfileError(
            f"--agent-kwarg {sensitive[0]}: looks like a credential; put it in --env-file "
            "(kwargs travel on Pier's command line)"
        )
    problems = [problem for key in sorted(agent_kwargs) if (problem := agent_kwarg_problem(key))]
    if problems:
        raise ProfileError(problems[0])
    adapter = agent == "codex" and agent_import_path is None and auto_agent_adapter
    if "config_toml" in agent_kwargs and adapter:
        raise ProfileError(
            "--agent-kwarg config_toml: the sciencebench Codex adapter writes the provider block itself "
            "from CODEX_BASE_URL in --env-file; add --no-auto-agent-adapter to give Pier's Codex agent "
            "your own config_toml"
        )
    kwargs = dict(agent_kwargs)
    models = list(models)
    provider: Provider | None = None
    gateways: list[Gateway] = [*config_toml_gateways(agent_kwargs.get("config_toml"))]

    if agent == "codex" and auto_provider:
        wire_api = env_values.get("CODEX_WIRE_API", "responses")
        if wire_api not in WIRE_APIS:
            raise ProfileError("CODEX_WIRE_API: must be 'responses' or 'chat'")
        base_variable = "CODEX_BASE_URL" if "CODEX_BASE_URL" in env_values else "OPENAI_BASE_URL"
        gateway = parse_gateway(env_values.get(base_variable, DEFAULT_CODEX_BASE_URL), base_variable)
        if not dry_run and not (env_values.get("OPENAI_API_KEY") or agent_env.get("OPENAI_API_KEY")):
            raise ProfileError("OPENAI_API_KEY: required for --agent codex (set it in --env-file)")
        if not models:
            models = [env_values.get("MODEL", DEFAULT_CODEX_MODEL)]
        if agent_import_path is None and not auto_agent_adapter:
            # Pier's built-in Codex agent takes the provider block as config_toml.
            kwargs.setdefault("config_toml", render_provider_toml(gateway, wire_api))
        else:
            kwargs.setdefault("base_url", gateway.url)
            kwargs.setdefault("wire_api", wire_api)
        if "CODEX_VERSION" in env_values:
            kwargs.setdefault("version", env_values["CODEX_VERSION"])
        if "CODEX_REASONING_EFFORT" in env_values:
            kwargs.setdefault("reasoning_effort", env_values["CODEX_REASONING_EFFORT"])
        provider = Provider(protocol=wire_api, base_url=gateway.url, credential_env="OPENAI_API_KEY")
        gateways.append(gateway)
    else:
        for variable in _GATEWAY_VARIABLES.get(agent, ()):
            if variable in env_values:
                gateways.append(parse_gateway(env_values[variable], variable))
        if gateways:
            credential = next(
                (key for key in env_values if is_sensitive_key(key) and key.endswith(("_KEY", "_TOKEN"))),
                None,
            )
            provider = Provider(protocol="native", base_url=gateways[0].url, credential_env=credential)

    if agent_import_path is None and agent == "codex" and auto_agent_adapter:
        agent_import_path = CODEX_ADAPTER
    return AgentPlan(
        harness=agent,
        # An explicit import path replaces --agent, so Pier's built-in agent cannot shadow it.
        agent=None if agent_import_path else agent,
        agent_import_path=agent_import_path,
        models=models,
        agent_kwargs=kwargs,
        agent_env_names=sorted(agent_env),
        provider=provider,
        gateways=list(dict.fromkeys(gateways)),
    )
