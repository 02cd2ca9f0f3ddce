"""Model gateways: validated gateway URLs, the operator's rule, the Codex provider block (pure).

A gateway is where a harness sends inference. Both sides need it: the login
node validates the URLs of a provider profile, the worker's network policy
turns their authorities into proxy rules, and the Codex adapter renders the
provider block from one. Which gateways a trial may reach is the operator's
choice (`allowed_by`): an internal address only when listed. A gateway
named by a host name the operator did not list is resolved on the worker at
trial time and its proxy pinned to the addresses checked (`pin_gateways`).
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict

from sciencebench.core.errors import ProfileError

DEFAULT_CODEX_MODEL = "gpt-5"
# The policy environment's keyword (`--ek`) that carries a trial's pins (`pin_gateways`).
PINS_KEYWORD = "gateway_pins"
DEFAULT_CODEX_BASE_URL = "https://api.openai.com/v1"

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
        """`host:port`, an IPv6 host in brackets."""
        # An IPv6 literal needs its brackets, or the port is part of the address.
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL with user information and query removed."""
        return f"{self.scheme}://{self.authority}{self.path}"

    @property
    def origin(self) -> str:
        """`scheme://host:port`: what an operator's list names (`allowed_by`)."""
        return f"{self.scheme}://{self.authority}"


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


def parse_gateway_list(values: Iterable[str], variable: str) -> tuple[Gateway, ...]:
    """Gateways of an operator's list: each value may hold several URLs, comma- or space-separated."""
    urls = [url for value in values for url in re.split(r"[,\s]+", value) if url]
    return tuple(dict.fromkeys(parse_gateway(url, variable) for url in urls))


# The kinds of address a job may not name unless the operator lists it, in the order they are named.
_SHARED = ipaddress.ip_network("100.64.0.0/10")


def internal_kind(host: str) -> str | None:
    """What internal address `host` is ("loopback", "private", ...), None for a name or a global address.

    An IPv4 address in a legacy form (`2130706433`, `0x7f.1`) counts as the
    address it stands for: the resolver reads it so. A name is not looked up.
    """
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(host))
        except (OSError, ValueError):
            return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    kinds = (
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("unspecified", address.is_unspecified),
        ("multicast", address.is_multicast),
        ("shared", address in _SHARED),
        ("unique-local", isinstance(address, ipaddress.IPv6Address) and address.is_private),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
        ("non-global", not address.is_global),
    )
    return next((kind for kind, matched in kinds if matched), None)


def allowed_by(gateway: Gateway, listed: Sequence[Gateway]) -> bool:
    """Whether an operator's list allows `gateway`.

    With a list, a gateway must match an entry's scheme, host and port (any
    path). Without one, any gateway but an internal address (`internal_kind`).
    """
    if listed:
        return any((g.scheme, g.host, g.port) == (gateway.scheme, gateway.host, gateway.port) for g in listed)
    return internal_kind(gateway.host) is None


def refusal_reason(gateway: Gateway, listed: Sequence[str]) -> str:
    """Why a list (`listed`: the origins it names) does not allow `gateway`, for one line."""
    kind = internal_kind(gateway.host)
    why = f"a {kind} address" if kind else "not one of the allowed gateways"
    return f"{why} (allowed: {', '.join(listed[:4])})" if listed else why


def resolve_ipv4(host: str) -> tuple[str, ...]:
    """The IPv4 addresses `host` resolves to here, in the resolver's order (the proxy has no IPv6)."""
    try:
        found = socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()
    return tuple(dict.fromkeys(str(info[4][0]) for info in found))


def pin_gateways(
    gateways: Sequence[Gateway],
    listed: Sequence[Gateway],
    forbidden: Collection[str] = (),
    resolve: Callable[[str], Sequence[str]] = resolve_ipv4,
) -> dict[str, str]:
    """The address the proxy must use for each gateway name, checked now; ValueError says why not.

    With an operator's list nothing is pinned (admission matched every gateway
    against it: the list is the operator's word); nor is a gateway named by an
    address (admission checked it). A name is resolved here, and every
    address it gives must be neither internal (`internal_kind`) nor in
    `forbidden` (this worker's and the broker's addresses): a name that
    resolves to any such address, or to none, is refused. The proxy then
    connects to the first address, whatever a later lookup says (a name
    rebound between check and connect gains nothing).
    """
    pins: dict[str, str] = {}
    for gateway in gateways:
        if listed or _is_address(gateway.host):
            continue
        addresses = resolve(gateway.host)
        if not addresses:
            raise ValueError(
                f"gateway {gateway.url}: {gateway.host} does not resolve to an IPv4 address here"
            )
        for address in addresses:
            kind = internal_kind(address)
            why = f"a {kind} address" if kind else "an address of this worker or its broker"
            if kind or address in forbidden:
                raise ValueError(
                    f"gateway {gateway.url}: {gateway.host} resolves to {address}, {why}; this "
                    f"worker reaches it only when its operator lists it (worker --gateway {gateway.origin})"
                )
        pins[gateway.host] = addresses[0]
    return pins


def parse_pins(value: object) -> dict[str, str]:
    """Pins as the worker hands them to the trial's environment (a JSON object), checked again."""
    if isinstance(value, str):
        value = json.loads(value) if value else {}
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("gateway pins: expected a JSON object of host name to IPv4 address")
    pins: dict[str, str] = {}
    for host, address in value.items():
        if not isinstance(host, str) or not _HOST.match(host) or _is_address(host):
            raise ValueError("gateway pins: a key is not a host name")
        if not isinstance(address, str) or not _is_address(address) or ":" in address:
            raise ValueError(f"gateway pins: {host} is not pinned to an IPv4 address")
        pins[host.lower()] = str(ipaddress.IPv4Address(address))
    return pins


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def public_url(url: str) -> str:
    """A URL without user information, query or fragment (broker, gateway).

    A `;`-separated failover list (as Celery accepts for brokers) is cleaned
    URL by URL, so no later entry keeps its password.
    """
    if ";" in url:
        return ";".join(public_url(part) for part in url.split(";"))
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:  # a port outside 0-65535 is not worth a traceback in a record
        port = None
    if port:
        host = f"{host}:{port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def masked_url(url: str) -> str:
    """A URL as a user may see it in an error: its password `***`, its query and fragment dropped.

    Unlike `public_url` it keeps the user name, so a user can tell which
    account the URL names; a `;`-separated failover list is masked URL by URL.
    """
    if ";" in url:
        return ";".join(masked_url(part) for part in url.split(";"))
    parts = urlsplit(url)
    public = urlsplit(public_url(url))
    user = parts.username
    if user is None and parts.password is None:
        return public.geturl()
    account = (user or "") + (":***" if parts.password is not None else "")
    return urlunsplit((public.scheme, f"{account}@{public.netloc}", public.path, "", ""))


# --- the Codex provider block ----------------------------------------------

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
