"""Provider profiles: env files, provider translation, gateway authorities, redaction.

An env file holds credentials. Its values go to Pier only through Pier's
process environment on the worker; what leaves this module for records,
messages or logs is names, hashes and redacted text.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from dotenv.parser import parse_stream
from pydantic import BaseModel, ConfigDict

from sciencebench.errors import ProfileError

REDACTED = "<redacted>"
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SENSITIVE_WORDS = ("key", "token", "secret", "password", "authorization")
_LEADING_SPACE = re.compile(r"\s*")
_NEWLINE = re.compile(r"\r\n|\n|\r")  # python-dotenv's own line-break rule

DEFAULT_CODEX_MODEL = "gpt-5"
DEFAULT_CODEX_BASE_URL = "https://api.openai.com/v1"
CODEX_ADAPTER = "sciencebench.agents.codex:ScienceBenchCodex"


def parse_env_text(text: str, source: str) -> dict[str, str]:
    """Parse env-file text with python-dotenv's grammar, without interpolation.

    Accepts `KEY=value`, `export KEY=value`, comments, blank lines and quoted
    values. Raises ProfileError naming `source` and the line number of the
    first malformed line; the line's content is never echoed.
    """
    values: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text)):
        # A binding's text starts with the blank lines before it; count them
        # so the number names the offending line itself.
        leading = _LEADING_SPACE.match(binding.original.string)
        line = binding.original.line + len(_NEWLINE.findall(leading.group() if leading else ""))
        if binding.error:
            raise ProfileError(f"{source}: line {line}: not a KEY=value line")
        if binding.key is None:
            continue
        if not _KEY.fullmatch(binding.key):
            raise ProfileError(f"{source}: line {line}: invalid variable name")
        if binding.value is None:
            raise ProfileError(f"{source}: line {line}: variable has no '=value'")
        values[binding.key] = binding.value
    return values


class EnvFile(BaseModel):
    """An env file as a message carries it: where it is and what it hashed to."""

    model_config = ConfigDict(frozen=True)

    path: Path
    sha256: str


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
        if option == "--agent-env" and not _KEY.fullmatch(key):
            raise ProfileError(f"{option} #{position}: invalid variable name {key!r}")
        parsed[key] = value
    return parsed


def is_sensitive_key(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in _SENSITIVE_WORDS)


# --- gateway authorities ---------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f]|%0[ad]|%00", re.IGNORECASE)
_HOST = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$|^\[[0-9A-Fa-f:.]+\]$"
)


class Gateway(BaseModel):
    """A model gateway: where a harness sends inference, without credentials."""

    model_config = ConfigDict(frozen=True)

    scheme: Literal["http", "https"]
    host: str
    port: int
    path: str

    @property
    def authority(self) -> str:
        # An IPv6 literal needs its brackets, or the port is part of the address.
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL with user information and query removed."""
        return f"{self.scheme}://{self.authority}{self.path}"


def parse_gateway(url: str, variable: str) -> Gateway:
    """Validate a gateway URL: http(s), a valid host, a port in 1-65535.

    User information, query and fragment are dropped. Raises ProfileError
    naming the variable; the URL itself is not echoed (it may embed a key).
    """
    if _CONTROL.search(url):
        raise ProfileError(f"{variable}: contains control or encoded line-break characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ProfileError(f"{variable}: not a valid URL or port outside 1-65535") from None
    if parts.scheme not in ("http", "https"):
        raise ProfileError(f"{variable}: only http:// and https:// gateways are allowed")
    host = parts.hostname or ""
    if not host or not _HOST.match(host if ":" not in host else f"[{host}]"):
        raise ProfileError(f"{variable}: missing or invalid host")
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    if not 1 <= port <= 65535:
        raise ProfileError(f"{variable}: port outside 1-65535")
    scheme: Literal["http", "https"] = "https" if parts.scheme == "https" else "http"
    return Gateway(scheme=scheme, host=host.lower(), port=port, path=parts.path.rstrip("/"))


# --- provider translation --------------------------------------------------

PROVIDER_ID = "sciencebench"
PROVIDER_NAME = "sciencebench gateway"
CREDENTIAL_ENV = "OPENAI_API_KEY"
WIRE_APIS = ("responses", "chat")


def _toml_string(value: str) -> str:
    # JSON's escapes (\" \\ \n \uXXXX ...) are all valid in a TOML basic string.
    return json.dumps(value, ensure_ascii=True)


def render_provider_toml(gateway: Gateway, wire_api: str) -> str:
    """The Codex config.toml fragment selecting `gateway` as the only model provider.

    Top-level keys come first: Pier appends the fragment after its own
    top-level lines and before any MCP tables. Hosted web search is disabled
    both ways Codex has spelled it: top-level ``web_search = "disabled"``
    (current releases) and ``[tools] web_search = false`` (older ones; newer
    releases accept and ignore it). Raises ProfileError for an unknown wire API.
    """
    if wire_api not in WIRE_APIS:
        raise ProfileError(f"wire_api: must be one of {', '.join(WIRE_APIS)}")
    lines = [
        f"model_provider = {_toml_string(PROVIDER_ID)}",
        'web_search = "disabled"',
        "",
        f"[model_providers.{PROVIDER_ID}]",
        f"name = {_toml_string(PROVIDER_NAME)}",
        f"base_url = {_toml_string(gateway.url)}",
        f"env_key = {_toml_string(CREDENTIAL_ENV)}",
        f"wire_api = {_toml_string(wire_api)}",
        "supports_websockets = false",
        "",
        "[tools]",
        "web_search = false",
        "",
    ]
    return "\n".join(lines)


class Provider(BaseModel):
    """What the run record says about the model provider (no credentials)."""

    model_config = ConfigDict(frozen=True)

    protocol: str
    base_url: str | None
    credential_env: str | None


class AgentPlan(BaseModel):
    """How the harness is invoked: Pier agent arguments without secret values.

    `secret_env` lists the variable names whose values the worker must put
    into Pier's process environment (from the env file or --agent-env).
    """

    model_config = ConfigDict(frozen=True)

    harness: str
    agent: str | None
    agent_import_path: str | None
    models: list[str]
    agent_kwargs: dict[str, str]
    agent_env_names: list[str]
    provider: Provider | None
    gateways: list[Gateway]


_WIRE_APIS = ("responses", "chat")
# Variables naming a model gateway, per harness, in the order the seed lists them.
_GATEWAY_VARIABLES = {
    "codex": ("CODEX_BASE_URL", "OPENAI_BASE_URL"),
    "claude-code": ("ANTHROPIC_BASE_URL",),
    "mini-swe-agent": ("OPENAI_BASE_URL",),
}


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
    kwargs = dict(agent_kwargs)
    models = list(models)
    provider: Provider | None = None
    gateways: list[Gateway] = []

    if agent == "codex" and auto_provider:
        wire_api = env_values.get("CODEX_WIRE_API", "responses")
        if wire_api not in _WIRE_APIS:
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


# --- redaction -------------------------------------------------------------

_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)=(.*)$", re.DOTALL)
_AGENT_ENV_FLAGS = ("--ae", "--agent-env")
_CONFIG_KWARGS = ("config_toml", "config_toml_file")


def redact_argv(argv: list[str], secrets: list[str] | None = None) -> list[str]:
    """Return argv safe to print or record.

    Every `--agent-env` value becomes `<redacted>`; any `KEY=value` whose key
    looks sensitive (key, token, secret, password, authorization) becomes
    `KEY=<redacted>`; a provider config passed inline is replaced by a
    placeholder; finally any known secret value still present is masked.
    """
    out: list[str] = []
    previous = ""
    for arg in argv:
        redacted = arg
        match = _ASSIGNMENT.match(arg)
        if (previous in _AGENT_ENV_FLAGS and match) or (match and is_sensitive_key(match.group(1))):
            redacted = f"{match.group(1)}={REDACTED}"
        elif match and match.group(1) in _CONFIG_KWARGS:
            redacted = f"{match.group(1)}=<generated provider config>"
        out.append(redacted)
        previous = arg
    return [mask_secrets(arg, secrets or []) for arg in out]


def mask_secrets(text: str, secrets: list[str]) -> str:
    """Replace every occurrence of each (non-trivial) secret value in text."""
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text
