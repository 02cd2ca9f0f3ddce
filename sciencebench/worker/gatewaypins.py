"""A trial's gateway names, resolved and checked on this worker when the trial runs.

`core.gateways.pin_gateways` decides; this module knows the host: its own
IPv4 addresses (every local address of its network namespace, from the
kernel's routing table, and for a worker in a container its machine's, as
its operator gives them: `host_addresses`) and its broker's. The pins travel to the trial's
environment, whose proxy then resolves each name only to its pinned address.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from sciencebench.core.errors import RefusedError
from sciencebench.core.gateways import pin_gateways, resolve_ipv4
from sciencebench.core.models import JobSpec
from sciencebench.core.settings import Settings

FIB_TRIE = Path("/proc/net/fib_trie")


def local_addresses(fib_trie: Path = FIB_TRIE) -> set[str]:
    """Every IPv4 address of this network namespace (`/32 host LOCAL` entries of the routing trie)."""
    found: set[str] = set()
    last = ""
    for line in fib_trie.read_text().splitlines():
        text = line.strip()
        if text.startswith("|-- "):
            last = text[4:]
        elif text.startswith("/32 host LOCAL") and last:
            found.add(last)
    return found


def broker_addresses(broker_url: str) -> set[str]:
    """The IPv4 addresses of every host a (`;`-separated) broker URL names."""
    hosts = {urlsplit(url).hostname for url in broker_url.split(";")}
    return {address for host in hosts if host for address in resolve_ipv4(host)}


def gateway_pins(job: JobSpec, settings: Settings) -> dict[str, str]:
    """Each unlisted gateway name of `job` pinned to an address checked now (RefusedError if none may be)."""
    if not job.agent.gateways or settings.gateways:
        return {}
    forbidden = local_addresses() | set(settings.host_addresses) | broker_addresses(settings.broker_url)
    try:
        return pin_gateways(job.agent.gateways, settings.gateways, forbidden)
    except ValueError as exc:
        raise RefusedError(str(exc)) from None
