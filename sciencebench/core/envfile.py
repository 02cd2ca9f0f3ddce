"""Env files: python-dotenv's grammar without interpolation, a file's identity, the key policy.

An env file holds credentials. Messages and job specs carry only its
identity (`EnvFile`: path and SHA-256); each side parses the file itself.
Its values, `--agent-env` values and a task.toml's env tables reach the
environment of Pier or of its `docker compose` on a worker host, which holds
the Docker socket. So a key that would change the harness is refused by
`harness_key_problem`, and an env file's or `--agent-env`'s key must also be
on an allowlist (`agent_key_problem`): at submit and again on the worker.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

from dotenv.parser import parse_stream
from pydantic import BaseModel, ConfigDict

from sciencebench.core.errors import ProfileError

VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LEADING_SPACE = re.compile(r"\s*")
_NEWLINE = re.compile(r"\r\n|\n|\r")  # python-dotenv's own line-break rule


class EnvFile(BaseModel):
    """An env file as a message carries it: where it is and what it hashed to."""

    model_config = ConfigDict(frozen=True)

    path: Path
    sha256: str


@dataclass(frozen=True)
class _KeyRule:
    """Names a job may not set, and why (one rationale per group)."""

    reason: str
    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    suffixes: tuple[str, ...] = ()
    exempt_prefixes: tuple[str, ...] = ()

    def matches(self, upper: str) -> bool:
        """Whether the upper-cased name `upper` is one of this group's."""
        if self.exempt_prefixes and upper.startswith(self.exempt_prefixes):
            return False
        return upper in self.names or upper.startswith(self.prefixes) or upper.endswith(self.suffixes)


# The variables Pier sets for `docker compose` (its DockerEnvironmentEnvVars upper-cased, and the
# Windows container name): they place Pier's bind mounts, build context and images.
PIER_COMPOSE_VARIABLES = frozenset({
    "MAIN_IMAGE_NAME", "CONTEXT_DIR", "HOST_VERIFIER_LOGS_PATH", "HOST_AGENT_LOGS_PATH",
    "HOST_ARTIFACTS_PATH", "ENV_VERIFIER_LOGS_PATH", "ENV_AGENT_LOGS_PATH", "ENV_ARTIFACTS_PATH",
    "PREBUILT_IMAGE_NAME", "PIER_CONTAINER_NAME",
})  # fmt: skip

# Every value a job sets (env file, --agent-env, a task.toml env table) lands in the environment
# of Pier or of its `docker compose` on a worker host, which holds the Docker socket (root). A
# name that makes one of those processes load code, read or upload a file, trust a certificate
# or talk to another endpoint would hand the job the host; provider credentials, base URLs and
# the names agents document (OPENAI_*, ANTHROPIC_*, CODEX_BASE_URL, ...) stay allowed.
# fmt: off
_KEY_RULES = (
    _KeyRule(
        "the dynamic loader and the C library load code and files named here",
        names=frozenset({"GCONV_PATH", "GLIBC_TUNABLES", "HOSTALIASES", "RES_OPTIONS", "LOCALDOMAIN",
                         "LOCPATH", "NLSPATH", "TZDIR"}),
        prefixes=("LD_", "MALLOC_"),
    ),
    _KeyRule(
        "OpenSSL and TLS clients load engines, providers, key logs and trust from these",
        prefixes=("OPENSSL_", "SSL"),
        suffixes=("_CA_BUNDLE",),
    ),
    _KeyRule(
        "an interpreter, shell or tool runs startup code or plugins named here",
        names=frozenset({"BASH_ENV", "ENV", "IFS", "PS4", "SHELLOPTS", "BASHOPTS", "PROMPT_COMMAND",
                         "CDPATH", "GLOBIGNORE", "SHELL", "VIRTUAL_ENV", "GEM_HOME", "GEM_PATH"}),
        prefixes=("PYTHON", "PERL", "RUBY", "NODE_", "NPM_", "GIT_", "BASH_FUNC_", "PIP_", "UV_", "GO"),
        # Google's provider credentials are not Go runtime settings (GODEBUG, GOFLAGS, GOROOT, ...).
        exempt_prefixes=("GOOGLE_",),
    ),
    _KeyRule(
        "the harness finds its programs, home and scratch files here",
        names=frozenset({"PATH", "HOME", "TMPDIR", "TMP", "TEMP"}),
        prefixes=("XDG_",),
    ),
    _KeyRule(
        "the Docker, compose and BuildKit clients take their daemon, plugins and files from these",
        prefixes=("DOCKER_", "COMPOSE_", "BUILDKIT_", "BUILDX_"),
    ),
    _KeyRule(
        "Pier's compose variables place its bind mounts, build context and images",
        names=PIER_COMPOSE_VARIABLES,
        prefixes=("PIER_",),
    ),
    _KeyRule("sciencebench's and LiteLLM's own settings", prefixes=("SCIENCEBENCH_", "LITELLM_")),
    _KeyRule(
        "Pier or LiteLLM would read (or upload into the container) a file of the worker named here",
        names=frozenset({
            "CODEX_FORCE_AUTH_JSON", "GOOGLE_APPLICATION_CREDENTIALS", "AWS_SHARED_CREDENTIALS_FILE",
            "AWS_CONFIG_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AZURE_FEDERATED_TOKEN_FILE",
            "AZURE_CERTIFICATE_PATH", "GCS_PATH_SERVICE_ACCOUNT", "CHATGPT_AUTH_FILE", "CHATGPT_TOKEN_DIR",
            "XAI_OAUTH_AUTH_FILE", "XAI_OAUTH_TOKEN_DIR", "GITHUB_COPILOT_ACCESS_TOKEN_FILE",
            "GITHUB_COPILOT_TOKEN_DIR", "TIKTOKEN_CACHE_DIR", "CUSTOM_TIKTOKEN_CACHE_DIR", "HF_HOME",
            "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "CONFIG_FILE_PATH", "WORKER_CONFIG",
            "PROMETHEUS_MULTIPROC_DIR", "DATA_GYM_CACHE_DIR", "NETRC",
        }),
        # A token read from a file is sent on (botocore's container provider, huggingface_hub).
        suffixes=("_AUTH_JSON_PATH", "_TOKEN_FILE", "_TOKEN_PATH"),
    ),
    _KeyRule("proxies would route the harness's own traffic", suffixes=("_PROXY",)),
)
# fmt: on


def harness_key_problem(key: str) -> str | None:
    """Why `key` may not come from a job (env file, `--agent-env`, task.toml env), or None when it may.

    The answer starts with the key and names its group's reason, never a
    value. Matching is case-insensitive; a name that is not a shell
    variable name (possible as a task.toml key) is refused too.

    Refused: a key that would change the harness rather than inform the agent
    (the loader and C library, OpenSSL, interpreters and shells, the Docker and
    compose clients, Pier's compose variables, proxies, sciencebench's and
    LiteLLM's settings, files Pier or LiteLLM would read).
    """
    if not VARIABLE_NAME.fullmatch(key):
        return f"{key!r} is not a variable name"
    upper = key.upper()
    rule = next((rule for rule in _KEY_RULES if rule.matches(upper)), None)
    return f"{key}: {rule.reason}" if rule is not None else None


@dataclass(frozen=True)
class _Allowlist:
    """The keys an env file or `--agent-env` may set: exact names, prefixes, suffixes (case-sensitive)."""

    names: frozenset[str]
    prefixes: tuple[str, ...]
    suffixes: tuple[str, ...]

    def allows(self, key: str) -> bool:
        """Whether `key` is one of the names agents read."""
        return key in self.names or key.startswith(self.prefixes) or key.endswith(self.suffixes)


# What an env file or --agent-env may set (docs/gateways.md lists it): sciencebench's profile
# values (MODEL, CODEX_*, OPENAI_*), and the names Pier 0.3's installed agents read from its
# environment (pier/agents/installed/*.py and the provider keys of pier/agents/utils.py;
# tests/unit/test_harness_keys.py derives them from Pier's source). The prefixes are the agents'
# own namespaces; the suffixes name provider credentials and gateways (`<PROVIDER>_API_KEY`,
# `..._TOKEN`, `..._BASE_URL`, `..._API_BASE`, `..._API_VERSION`), values that are sent to a
# gateway, never a file, program or option a host tool would load. The denylist still applies
# first (e.g. `CODEX_AUTH_JSON_PATH`, `GOOGLE_APPLICATION_CREDENTIALS`, `*_TOKEN_FILE`).
# fmt: off
AGENT_KEYS = _Allowlist(
    names=frozenset({
        "MODEL", "MAX_THINKING_TOKENS", "DISABLE_PROMPT_CACHING",
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
        "AWS_DEFAULT_REGION", "AWS_BEARER_TOKEN_BEDROCK",
        "AZURE_RESOURCE_NAME", "VERTEXAI_PROJECT", "VERTEXAI_LOCATION",
        "GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION", "GOOGLE_GENAI_USE_VERTEXAI",
    }),
    prefixes=("OPENAI_", "ANTHROPIC_", "CODEX_", "CLAUDE_CODE_", "GEMINI_", "MSWEA_"),
    suffixes=("_API_KEY", "_TOKEN", "_BASE_URL", "_API_BASE", "_API_VERSION"),
)
# fmt: on


def agent_key_problem(key: str) -> str | None:
    """Why `key` may not be set by an env file or `--agent-env`, or None when it may.

    First the denylist (`harness_key_problem`, its reasons), then the
    allowlist `AGENT_KEYS`. The answer starts with the key, never a value.

    An env file's and `--agent-env`'s keys reach Pier's own process on the
    worker host, where Pier and the libraries it runs (git, curl, Java tools,
    Kerberos, ...) read variables no denylist can name in full
    (`JAVA_TOOL_OPTIONS`, `KRB5_CONFIG`, `CURL_HOME`, `WGETRC`). So those keys
    must also be on an allowlist, `AGENT_KEYS`: the values sciencebench's
    profiles read and the names Pier's installed agents read (provider
    credentials, base URLs and the agents' documented settings), with the
    denylist as a second line. Task env tables go into containers through
    compose and keep the denylist alone.
    """
    if problem := harness_key_problem(key):
        return problem
    if AGENT_KEYS.allows(key):
        return None
    return (
        f"{key}: not a key agents read (an env file and --agent-env may set provider credentials, "
        "base URLs and the names the agents document; see docs/gateways.md)"
    )


def parse_env_text(text: str, source: str) -> dict[str, str]:
    """Parse env-file text with python-dotenv's grammar, without interpolation.

    Accepts `KEY=value`, `export KEY=value`, comments, blank lines and quoted
    values. Raises ProfileError naming `source` and the line number of the
    first malformed line (or a value with a NUL character, which no process
    environment can hold); the line's content is never echoed.
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
        if not VARIABLE_NAME.fullmatch(binding.key):
            raise ProfileError(f"{source}: line {line}: invalid variable name")
        if binding.value is None:
            raise ProfileError(f"{source}: line {line}: variable has no '=value'")
        if "\x00" in binding.value:
            raise ProfileError(f"{source}: line {line}: value contains a NUL character")
        values[binding.key] = binding.value
    return values
