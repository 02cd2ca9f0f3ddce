"""Provider profiles on the login node: env files, `KEY=VALUE` options, provider translation.

An env file holds credentials. Its values go to Pier only through Pier's
process environment on the worker; what leaves this module for records,
messages or logs is names, hashes and validated gateway URLs.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

from sciencebench.core.agent_kwargs import agent_kwargs_problem, is_sensitive_name
from sciencebench.core.envfile import VARIABLE_NAME, EnvFile, parse_env_text
from sciencebench.core.errors import ProfileError
from sciencebench.core.gateways import Gateway, parse_gateway
from sciencebench.core.harnesses import find, setting
from sciencebench.core.models import AgentPlan, Provider


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
    """Whether a variable or keyword name looks like it holds a credential (key, token, secret, ...)."""
    return is_sensitive_name(key)


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


# A network proxy for the harness: refused with the way to reach a gateway behind one.
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")


def proxy_variable_problem(key: str, option: str) -> str | None:
    """Why a network-proxy variable may not come from a job, with the way round; None for other keys.

    The agent reaches nothing but its gateways, through the trial's own
    inference proxy; a proxy of the site's network cannot be chained there.
    """
    if key.upper() not in _PROXY_VARIABLES:
        return None
    return (
        f"{option}: refused: {key}: the agent reaches only its gateway, through the trial's own proxy, "
        "so a network proxy is not passed on; to reach a gateway behind a proxy, run a relay on a host "
        "the workers reach (e.g. LiteLLM with HTTPS_PROXY in its own environment) and set "
        "CODEX_BASE_URL/ANTHROPIC_BASE_URL/OPENAI_BASE_URL to it (docs/gateways.md)"
    )


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
    arguments of sciencebench's Codex adapter, or the provider block
    (`config_toml`) of Pier's own Codex agent or a custom `--agent-import-path`
    class; an empty value means unset; OPENAI_API_KEY stays in the
    environment. Raises ProfileError on a bad wire API, a bad gateway URL or a
    missing credential (unless `dry_run`). Any keyword may be given except
    those naming host files; credential-looking ones are redacted in records.
    """
    if problem := agent_kwargs_problem(agent_kwargs):
        raise ProfileError(problem)
    harness = find(agent)
    adapter = (
        harness.adapter
        if harness is not None and harness.auto_adapter and agent_import_path is None and auto_agent_adapter
        else None
    )
    profile = harness.profile if harness is not None and auto_provider else None
    if adapter and profile is not None and (refusal := profile.adapter_refusal(agent_kwargs)):
        raise ProfileError(refusal)
    kwargs = dict(agent_kwargs)
    models = list(models)
    provider: Provider | None = None
    gateways: list[Gateway] = [*config_toml_gateways(agent_kwargs.get("config_toml"))]

    if profile is not None:
        provider, gateway, kwargs = profile.translate(env_values, kwargs, not adapter)
        credential = profile.credential
        if not dry_run and not (env_values.get(credential) or agent_env.get(credential)):
            raise ProfileError(f"{credential}: required for --agent {agent} (set it in --env-file)")
        if not models:
            models = [setting(env_values, "MODEL") or profile.default_model]
        gateways.append(gateway)
    else:
        # The record names a provider only for a translated profile (Codex's), as the original's does.
        for variable in harness.gateway_variables if harness is not None else ():
            if value := setting(env_values, variable):
                gateways.append(parse_gateway(value, variable))

    if problem := agent_kwargs_problem(kwargs):  # the keywords taken from the env file too
        raise ProfileError(problem)
    if adapter:
        agent_import_path = adapter
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
