"""`ScienceBenchCodex`: Pier's Codex agent pointed at one model gateway.

Passed to Pier as `--agent-import-path sciencebench.agents.codex:ScienceBenchCodex`
(never together with `--agent codex`, so Pier's built-in agent cannot
shadow it) with `--ak base_url=... --ak wire_api=...` and Pier's own
`version` and `reasoning_effort` keywords. It generates the Codex provider
block for Pier's `config_toml` mechanism; its network allowlist is the
gateway host alone. Without `base_url` it generates nothing and never
allows Pier's default `api.openai.com` (the class docstring says more).
"""

from __future__ import annotations

import contextlib
import tomllib
from typing import Any

from pier.agents.installed.codex import Codex
from pier.agents.network import allowlist_from_urls, collect_url_values
from pier.models.agent.network import NetworkAllowlist

from sciencebench.core.errors import ProfileError
from sciencebench.core.gateways import (
    WIRE_APIS,
    Gateway,
    parse_gateway,
    render_provider_toml,
)


class ScienceBenchCodex(Codex):
    """Pier's Codex agent with a generated gateway provider configuration.

    Keywords: `base_url`, `wire_api` (`responses` or `chat`; current Codex
    releases accept only `responses`), plus Pier's `version`,
    `reasoning_effort`, `command_model_name`, ... With `base_url` an explicit
    `config_toml` or `config_toml_file` is refused: two provider blocks would
    conflict; without it (no generated provider) `config_toml` is the job's.
    Raises ProfileError for a bad base URL, wire API or an IPv6-literal host
    (Pier's allowlist cannot express one).

    The provider block (Pier appends it to `$CODEX_HOME/config.toml`): a custom
    provider `sciencebench` reading its key from `OPENAI_API_KEY`, HTTP/SSE
    only (`supports_websockets = false`) and hosted web search off. The
    environment adds the gateway's port from `inference_urls`.

    Without `base_url` (`submit --no-auto-provider`) a `config_toml` of the
    job's own is passed on unchanged, and the allowlist is only the hosts the
    job configured (`OPENAI_BASE_URL`, the `base_url` entries of that
    `config_toml`).
    """

    def __init__(
        self,
        *args: Any,
        base_url: str | None = None,
        wire_api: str = "responses",
        **kwargs: Any,
    ) -> None:
        if wire_api not in WIRE_APIS:
            raise ProfileError(f"wire_api: must be one of {', '.join(WIRE_APIS)}")
        if base_url is None:  # --no-auto-provider: the job's own configuration, nothing generated
            self._gateway: Gateway | None = None
            self._wire_api = wire_api
            super().__init__(*args, **kwargs)
            return
        if kwargs.get("config_toml") or kwargs.get("config_toml_file"):
            raise ProfileError(
                "ScienceBenchCodex generates the provider config; pass base_url/wire_api, not config_toml"
            )
        kwargs.pop("config_toml", None)
        kwargs.pop("config_toml_file", None)
        gateway = parse_gateway(base_url, "base_url")
        if ":" in gateway.host:
            raise ProfileError("base_url: IPv6-literal gateway hosts are not supported")
        self._gateway = gateway
        self._wire_api = wire_api
        super().__init__(*args, config_toml=render_provider_toml(gateway, wire_api), **kwargs)

    @property
    def gateway(self) -> Gateway | None:
        """The one gateway this agent talks to; None when the job configures Codex itself."""
        return self._gateway

    def network_allowlist(self) -> NetworkAllowlist:
        """The gateway host only, or the hosts the job configured: no default provider host."""
        if self._gateway is not None:
            return NetworkAllowlist(domains=[self._gateway.host])
        urls: list[str] = [
            value for key in ("OPENAI_BASE_URL", "OPENAI_API_BASE") if (value := self._get_env(key))
        ]
        if self._config_toml:
            with contextlib.suppress(tomllib.TOMLDecodeError):
                urls += collect_url_values(tomllib.loads(self._config_toml))
        return allowlist_from_urls(urls)
