"""`ScienceBenchCodex`: Pier's Codex agent pointed at one model gateway.

Passed to Pier as ``--agent-import-path sciencebench.agents.codex:ScienceBenchCodex``
(never together with ``--agent codex``, so Pier's built-in agent cannot
shadow it) with ``--ak base_url=... --ak wire_api=...`` and Pier's own
``version`` and ``reasoning_effort`` keywords.

The adapter generates the Codex provider block and hands it to Pier's
``config_toml`` mechanism (Pier appends it to ``$CODEX_HOME/config.toml``):
a custom provider ``sciencebench`` reading its key from ``OPENAI_API_KEY``,
HTTP/SSE only (``supports_websockets = false``) and hosted web search off.
Its network allowlist is the gateway host alone; the environment adds the
gateway's port from ``inference_urls``.
"""

from __future__ import annotations

from typing import Any

from pier.agents.installed.codex import Codex
from pier.models.agent.network import NetworkAllowlist

from sciencebench.core.errors import ProfileError
from sciencebench.core.gateways import (
    DEFAULT_CODEX_BASE_URL,
    Gateway,
    parse_gateway,
    render_provider_toml,
)


class ScienceBenchCodex(Codex):
    """Pier's Codex agent with a generated gateway provider configuration.

    Keywords: `base_url` (default https://api.openai.com/v1), `wire_api`
    (`responses` or `chat`; current Codex releases accept only `responses`),
    plus Pier's `version`, `reasoning_effort`, ... An explicit `config_toml`
    or `config_toml_file` is refused: two provider blocks would conflict.
    Raises ProfileError for a bad base URL, wire API or an IPv6-literal host
    (Pier's allowlist cannot express one).
    """

    def __init__(
        self,
        *args: Any,
        base_url: str | None = None,
        wire_api: str = "responses",
        **kwargs: Any,
    ) -> None:
        if kwargs.get("config_toml") or kwargs.get("config_toml_file"):
            raise ProfileError(
                "ScienceBenchCodex generates the provider config; pass base_url/wire_api, not config_toml"
            )
        kwargs.pop("config_toml", None)
        kwargs.pop("config_toml_file", None)
        gateway = parse_gateway(base_url or DEFAULT_CODEX_BASE_URL, "base_url")
        if ":" in gateway.host:
            raise ProfileError("base_url: IPv6-literal gateway hosts are not supported")
        self._gateway = gateway
        self._wire_api = wire_api
        super().__init__(*args, config_toml=render_provider_toml(gateway, wire_api), **kwargs)

    @property
    def gateway(self) -> Gateway:
        """The one gateway this agent talks to."""
        return self._gateway

    def network_allowlist(self) -> NetworkAllowlist:
        """The gateway host only: with a custom provider Codex talks to nothing else."""
        return NetworkAllowlist(domains=[self._gateway.host])
