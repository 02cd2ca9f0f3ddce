"""`ScienceBenchMiniSweAgent`: Pier's mini-swe-agent whose proxy allowlist is its configured gateway.

Pier's mini-swe-agent allows its model provider's default host as well as
any configured base URL: with `--model openai/...` and
`OPENAI_BASE_URL=http://gw:4000/v1`, the trial's proxy lets the agent reach
`gw` *and* `api.openai.com`. With this adapter, when a base URL variable is
set, the allowlist is those gateways' hosts alone; without one (or with a
`config_yaml`, which may name others), it is Pier's. Everything else, its
name (so a baked image is recognised as its preinstalled install) included,
is Pier's.
"""

from __future__ import annotations

from pier.agents.installed.mini_swe_agent import MiniSweAgent
from pier.agents.network import allowlist_from_urls
from pier.models.agent.network import NetworkAllowlist

from sciencebench.core.harnesses import REGISTRY

# The variables Pier's mini-swe-agent reads a provider base URL from (its registry entry's).
BASE_URL_VARIABLES = REGISTRY["mini-swe-agent"].gateway_variables


class ScienceBenchMiniSweAgent(MiniSweAgent):
    """Pier's MiniSweAgent; with a configured base URL, the proxy allows that host only."""

    def network_allowlist(self) -> NetworkAllowlist:
        """The configured gateways' hosts, else Pier's allowlist."""
        configured = allowlist_from_urls([self._get_env(variable) for variable in BASE_URL_VARIABLES])
        if configured.domains and not self._config_yaml:
            return configured
        allowlist: NetworkAllowlist = super().network_allowlist()
        return allowlist
