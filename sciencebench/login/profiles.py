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
from sciencebench.core.gateways import (
    CREDENTIAL_ENV,
    DEFAULT_CODEX_BASE_URL,
    DEFAULT_CODEX_MODEL,
    WIRE_APIS,
    Gateway,
    parse_gateway,
    public_url,
    render_provider_toml,
)
from sciencebench.core.harness import CODEX_ADAPTER
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


# Variables naming a model gateway, per harness (the base URL variables the harness reads).
# The worker's proxy allows these gateways and nothing else: a harness's own provider
# allowlist is used only when none is set (docs/network-policy.md). Under
# --no-auto-provider Codex reads only OPENAI_BASE_URL (CODEX_* is not translated).
_GATEWAY_VARIABLES = {
    "codex": ("OPENAI_BASE_URL",),
    "claude-code": ("ANTHROPIC_BASE_URL",),
    "mini-swe-agent": (
        "OPENAI_BASE_URL", "OPENAI_API_BASE", "ANTHROPIC_BASE_URL", "GEMINI_API_BASE", "OPENROUTER_API_BASE",
    ),
    "gemini-cli": ("GOOGLE_GEMINI_BASE_URL", "GEMINI_API_BASE"),
}  # fmt: skip
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


def _setting(env_values: dict[str, str], *names: str) -> str | None:
    """The first of `names` the profile sets to a non-empty value (empty means unset, as in the original)."""
    return next((value for name in names if (value := env_values.get(name, "").strip())), None)


def _first_set(env_values: dict[str, str], *names: str) -> str:
    """The first of `names` the profile sets to a non-empty value, else the last name (for messages)."""
    return next((name for name in names if env_values.get(name, "").strip()), names[-1])


def _codex_provider(
    env_values: dict[str, str], kwargs: dict[str, str], *, builtin: bool
) -> tuple[Provider, Gateway, dict[str, str]]:
    """The Codex provider of a profile: the record's provider, the gateway, the agent keywords.

    `builtin`: Pier's own Codex agent or a custom class, which take the
    provider block as `config_toml`; sciencebench's adapter takes `base_url`
    and `wire_api` and renders the same block itself.
    """
    wire_api = (_setting(env_values, "CODEX_WIRE_API") or "responses").lower()
    if wire_api not in WIRE_APIS:
        raise ProfileError("CODEX_WIRE_API: must be 'responses' or 'chat'")
    variable = _first_set(env_values, "CODEX_BASE_URL", "OPENAI_BASE_URL")
    raw_url = _setting(env_values, "CODEX_BASE_URL", "OPENAI_BASE_URL") or DEFAULT_CODEX_BASE_URL
    gateway = parse_gateway(raw_url, variable)
    base_url = public_url(raw_url)
    added: dict[str, str] = {}
    if builtin:
        added["config_toml"] = render_provider_toml(gateway, wire_api)
    else:
        added |= {"base_url": base_url, "wire_api": wire_api}
    if version := _setting(env_values, "CODEX_VERSION"):
        added["version"] = version
    if effort := _setting(env_values, "CODEX_REASONING_EFFORT"):
        added["reasoning_effort"] = effort
    provider = Provider(protocol=wire_api, base_url=base_url, credential_env=CREDENTIAL_ENV)
    return provider, gateway, {**added, **kwargs}


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
    adapter = agent == "codex" and agent_import_path is None and auto_agent_adapter
    if "config_toml" in agent_kwargs and adapter and auto_provider:
        raise ProfileError(
            "--agent-kwarg config_toml: the sciencebench Codex adapter writes the provider block itself "
            "from CODEX_BASE_URL in --env-file; add --no-auto-agent-adapter to give Pier's Codex agent "
            "your own config_toml (or --no-auto-provider to give it to the adapter unchanged)"
        )
    kwargs = dict(agent_kwargs)
    models = list(models)
    provider: Provider | None = None
    gateways: list[Gateway] = [*config_toml_gateways(agent_kwargs.get("config_toml"))]

    if agent == "codex" and auto_provider:
        provider, gateway, kwargs = _codex_provider(env_values, kwargs, builtin=not adapter)
        if not dry_run and not (env_values.get("OPENAI_API_KEY") or agent_env.get("OPENAI_API_KEY")):
            raise ProfileError("OPENAI_API_KEY: required for --agent codex (set it in --env-file)")
        if not models:
            models = [_setting(env_values, "MODEL") or DEFAULT_CODEX_MODEL]
        gateways.append(gateway)
    else:
        # The record names a provider only for the translated Codex profile, as the original's does.
        for variable in _GATEWAY_VARIABLES.get(agent, ()):
            if value := _setting(env_values, variable):
                gateways.append(parse_gateway(value, variable))

    if problem := agent_kwargs_problem(kwargs):  # the keywords taken from the env file too
        raise ProfileError(problem)
    if adapter:
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
