"""The harness registry: every fact about one harness in one entry (pure; the login node imports it).

A harness is a Pier agent sciencebench knows something about; its entry
(`Harness`, whose docstring lists the fields) says how Pier installs it,
sciencebench's adapter, its proxy allowlist rule, how `submit` turns a
provider profile into its keywords, and how `images bake` preinstalls it.
Every consumer looks a harness up here when it runs (`find`, `bakeable`,
...): adding a harness is one entry of `REGISTRY`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

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
from sciencebench.core.models import Provider

# (profile values, agent keywords, builtin) -> the record's provider, the gateway, the agent keywords.
Translate = Callable[[dict[str, str], dict[str, str], bool], tuple[Provider, Gateway, dict[str, str]]]


@dataclass(frozen=True)
class ProviderProfile:
    """How a provider profile (`--env-file`) becomes the harness's agent keywords (auto provider).

    `translate` is given the profile's values, the job's keywords and
    `builtin` (Pier's own agent or a custom class rather than the adapter);
    `credential` must be set (outside a dry run); `default_model` is used
    when neither `--model` nor MODEL names one; `adapter_refusal` says why
    the job's keywords cannot go to the adapter (None when they can).
    """

    translate: Translate
    credential: str
    default_model: str
    adapter_refusal: Callable[[Mapping[str, str]], str | None] = lambda _kwargs: None


@dataclass(frozen=True)
class Bake:
    """How `sciencebench images bake` preinstalls a harness from host-fetched artifacts (`bake.recipes`).

    Either `programs` are copied onto the default PATH and the first is run
    with `--version`, or (`wheels`) the Python package `name==version` is
    installed from its wheels into its own virtual environment with the
    image's python3, `programs` linked onto the PATH and `imports` checked
    with `env` set. `env` is added to the baked image. `wire_api_probe`: the
    baked binary is asked which wire APIs it accepts (recorded, checked at submit).
    """

    version: str  # the pinned release
    source: str  # the registry package its artifacts are fetched from
    programs: tuple[str, ...]
    wheels: bool = False
    imports: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    wire_api_probe: bool = False


@dataclass(frozen=True)
class Harness:
    """One harness: a Pier agent and everything sciencebench does differently for it.

    - `name`: Pier's agent name (`--agent NAME`);
    - `installed_by_pier`: Pier installs it into a derived image of every trial
      (online), unless a baked image replaces that install;
    - `adapter`, `auto_adapter`: sciencebench's adapter of Pier's agent (same
      name, so the same baked images), and whether `submit` runs it for
      `--agent NAME` by itself (`--no-auto-agent-adapter` turns that off);
    - `gateway_variables`: the allowlist rule, the profile variables naming its
      model gateways, which become the trial proxy's only hosts (docs/network-policy.md);
    - `profile`: how `submit` turns a provider profile into agent keywords
      (auto provider; `--no-auto-provider` turns it off);
    - `exact_model`: Pier's agent strips a model's provider prefix unless it is
      given `command_model_name` (so sciencebench gives it);
    - `bake`: how `sciencebench images bake` preinstalls it (also the choices of
      `images bake --agent`), and the pinned release `scripts/agent-artifacts.sh` fetches.
    """

    name: str
    installed_by_pier: bool = True
    adapter: str | None = None
    auto_adapter: bool = False
    gateway_variables: tuple[str, ...] = ()
    profile: ProviderProfile | None = None
    exact_model: bool = False
    bake: Bake | None = None
    version_hint: str = "--agent-kwarg version="  # how a job chooses the version it runs


def setting(env_values: Mapping[str, str], *names: str) -> str | None:
    """The first of `names` the profile sets to a non-empty value (empty means unset, as in the original)."""
    return next((value for name in names if (value := env_values.get(name, "").strip())), None)


def _first_set(env_values: Mapping[str, str], *names: str) -> str:
    """The first of `names` the profile sets to a non-empty value, else the last name (for messages)."""
    return next((name for name in names if env_values.get(name, "").strip()), names[-1])


def _codex_provider(
    env_values: dict[str, str], kwargs: dict[str, str], builtin: bool
) -> tuple[Provider, Gateway, dict[str, str]]:
    """The Codex provider of a profile: the record's provider, the gateway, the agent keywords.

    MODEL, CODEX_BASE_URL (else OPENAI_BASE_URL), CODEX_WIRE_API,
    CODEX_VERSION and CODEX_REASONING_EFFORT are read. `builtin`: Pier's own
    Codex agent or a custom class, which take the provider block as
    `config_toml`; sciencebench's adapter takes `base_url` and `wire_api`
    and renders the same block itself.
    """
    wire_api = (setting(env_values, "CODEX_WIRE_API") or "responses").lower()
    if wire_api not in WIRE_APIS:
        raise ProfileError("CODEX_WIRE_API: must be 'responses' or 'chat'")
    variable = _first_set(env_values, "CODEX_BASE_URL", "OPENAI_BASE_URL")
    raw_url = setting(env_values, "CODEX_BASE_URL", "OPENAI_BASE_URL") or DEFAULT_CODEX_BASE_URL
    gateway = parse_gateway(raw_url, variable)
    base_url = public_url(raw_url)
    added: dict[str, str] = {}
    if builtin:
        added["config_toml"] = render_provider_toml(gateway, wire_api)
    else:
        added |= {"base_url": base_url, "wire_api": wire_api}
    if version := setting(env_values, "CODEX_VERSION"):
        added["version"] = version
    if effort := setting(env_values, "CODEX_REASONING_EFFORT"):
        added["reasoning_effort"] = effort
    provider = Provider(protocol=wire_api, base_url=base_url, credential_env=CREDENTIAL_ENV)
    return provider, gateway, {**added, **kwargs}


def _codex_adapter_refusal(kwargs: Mapping[str, str]) -> str | None:
    if "config_toml" not in kwargs:
        return None
    return (
        "--agent-kwarg config_toml: the sciencebench Codex adapter writes the provider block itself "
        "from CODEX_BASE_URL in --env-file; add --no-auto-agent-adapter to give Pier's Codex agent "
        "your own config_toml (or --no-auto-provider to give it to the adapter unchanged)"
    )


def _registry(*entries: Harness) -> dict[str, Harness]:
    return {entry.name: entry for entry in entries}


# Pier 0.3.0's installed agents (pier/agents/installed/) and what sciencebench adds to them.
# Under --no-auto-provider Codex reads only OPENAI_BASE_URL (CODEX_* is not translated).
REGISTRY: Mapping[str, Harness] = _registry(
    Harness(
        "codex",
        adapter="sciencebench.agents.codex:ScienceBenchCodex",
        auto_adapter=True,
        gateway_variables=("OPENAI_BASE_URL",),
        profile=ProviderProfile(
            _codex_provider, CREDENTIAL_ENV, DEFAULT_CODEX_MODEL, adapter_refusal=_codex_adapter_refusal
        ),
        exact_model=True,
        bake=Bake("0.169.0", "npm:@openai/codex@0.169.0-linux-x64", ("codex", "rg"), wire_api_probe=True),
        version_hint="CODEX_VERSION in --env-file",
    ),
    Harness(
        "claude-code",
        gateway_variables=("ANTHROPIC_BASE_URL",),
        bake=Bake("2.1.332", "npm:@anthropic-ai/claude-code-linux-x64@2.1.332", ("claude",)),
    ),
    Harness(
        "mini-swe-agent",
        adapter="sciencebench.agents.mini_swe_agent:ScienceBenchMiniSweAgent",
        gateway_variables=(
            "OPENAI_BASE_URL",
            "OPENAI_API_BASE",
            "ANTHROPIC_BASE_URL",
            "GEMINI_API_BASE",
            "OPENROUTER_API_BASE",
        ),
        bake=Bake(
            "2.4.6",
            "pypi:mini-swe-agent==2.4.6",
            ("mini-swe-agent",),
            wheels=True,
            imports=("minisweagent", "litellm"),
            # LiteLLM would otherwise try to download its price table at every start.
            env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        ),
    ),
    Harness("cursor-cli"),
    Harness("gemini-cli", gateway_variables=("GOOGLE_GEMINI_BASE_URL", "GEMINI_API_BASE")),
    Harness("opencode"),
)


def find(name: str | None) -> Harness | None:
    """The registered harness `name`; None for another agent (oracle, nop, a custom one)."""
    return REGISTRY.get(name) if name is not None else None


def bakeable() -> list[str]:
    """The harnesses `sciencebench images bake` can preinstall, in registry order."""
    return [entry.name for entry in REGISTRY.values() if entry.bake is not None]


def bake_of(name: str) -> Bake:
    """How harness `name` is baked; KeyError when it cannot be."""
    entry = REGISTRY.get(name)
    if entry is None or entry.bake is None:
        raise KeyError(name)
    return entry.bake


def installed_by_pier(name: str) -> bool:
    """Whether Pier installs harness `name` into each trial's image (unless a baked image replaces it)."""
    entry = REGISTRY.get(name)
    return entry is not None and entry.installed_by_pier


def adapters() -> frozenset[str]:
    """The import paths of sciencebench's adapters (each runs its harness's baked images)."""
    return frozenset(entry.adapter for entry in REGISTRY.values() if entry.adapter is not None)
