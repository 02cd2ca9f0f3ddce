"""The inference proxy's configuration: a pure rendering of the allowlist.

Two kinds of destinations are allowed, nothing else: each configured
gateway on exactly its own port, and (only when no gateway is configured)
the harness's provider allowlist, exact hosts only, on ports 80 and 443
(`render_squid_conf`). No rule resolves a denied name: it never reaches
the resolver, so an agent cannot smuggle data out through DNS. A gateway
name the worker pinned resolves from the proxy's hosts file only.
Every name and address is validated before it reaches squid.conf, so a
value can never add a directive.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence

from sciencebench.core.errors import PolicyRefused
from sciencebench.core.gateways import Gateway

PROXY_PORT = 8080
PROXY_USER = "agent"
STANDARD_PORTS = (80, 443)
# In-container paths of the files the environment bind-mounts into the proxy.
SQUID_CONF_PATH = "/etc/squid/squid.conf"
SQUID_AUTH_FILE = "/etc/squid/sciencebench.passwd"

# squid 5's default url_rewrite_extras/store_id_extras without `%>A`.
# squid's native access-log fields, then squid's error id and the reply's Retry-After ("-" when none).
ACCESS_LOG_FORMAT = "%ts.%03tu %6tr %>a %Ss/%03>Hs %<st %rm %ru %[un %Sh/%<a %mt %err_code %{Retry-After}<h"
_HELPER_EXTRAS = "%>a %un %>rm myip=%la myport=%lp"

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_DOMAIN = re.compile(rf"^(?:{_LABEL}\.)*{_LABEL}$")


def normalize_domains(domains: Iterable[str]) -> list[str]:
    """Sorted, de-duplicated allowlist entries safe to put into squid.conf.

    An entry is an exact domain (`api.openai.com`) or an IPv4 address
    (harness base URLs may name one). Raises PolicyRefused for anything else:
    a leading-dot suffix (`.amazonaws.com`: anyone can own a name under it),
    a wildcard, whitespace, a port, a path, an IPv6 address (the proxy's
    egress network has no IPv6), or a name that only looks like an address.
    """
    return sorted({_host_entry(raw, "allowlist entry") for raw in domains})


def _host_entry(raw: str, what: str) -> str:
    """One exact host for a `dstdomain -n` list (canonical IPv4 or lowercase name), or PolicyRefused."""
    entry = raw.strip().lower().rstrip(".")
    if entry.startswith(".") or "*" in entry:
        raise PolicyRefused(
            f"{what} {raw!r} is a domain suffix; the proxy allows exact hosts only "
            "(anyone can own a name under a public suffix)"
        )
    try:
        address = ipaddress.ip_address(entry.strip("[]"))
    except ValueError:
        address = None
    if address is not None:
        if address.version != 4:
            raise PolicyRefused(f"{what} {raw!r} is an IPv6 address; the proxy's egress network has no IPv6")
        return str(address)
    # A name of digits and dots that is no IPv4 address (010.1.2.3, 1.2.3) could be read as one.
    if not _DOMAIN.match(entry) or entry.rsplit(".", 1)[-1].isdigit():
        raise PolicyRefused(f"{what} {raw!r} is not an exact domain or an IPv4 address")
    return entry


def passwd_line(token: str) -> str:
    """The proxy's credential file line for `agent:<token>`.

    squid's `basic_ncsa_auth` accepts an unsalted hex MD5 digest. The token is
    a fresh 192-bit random string per trial, so a salt would add nothing, and
    this avoids needing `htpasswd` in the proxy image.
    """
    digest = hashlib.md5(token.encode(), usedforsecurity=False).hexdigest()
    return f"{PROXY_USER}:{digest}\n"


def render_squid_conf(
    domains: Sequence[str],
    gateways: Sequence[Gateway],
    pins: Mapping[str, str] | None = None,
    *,
    port: int = PROXY_PORT,
    auth_file: str = SQUID_AUTH_FILE,
) -> str:
    """squid.conf allowing `domains` on ports 80/443 and each gateway on exactly its own port.

    `domains` are allowlist entries as `normalize_domains` accepts them;
    gateways come from `sciencebench.core.gateways.parse_gateway` (their port
    is the URL's, or the scheme's default when the URL has none). A gateway
    host is allowed only on its gateway port, even when `domains` names it:
    an http gateway for plain requests, an https gateway for `CONNECT` only.

    Every host, name or address, is matched by `dstdomain -n` (string
    comparison): squid never resolves a name or an address to decide a
    request, and a request for any other host is denied by the first rule, so
    a denied request causes no DNS query. Requests need basic proxy
    authentication as `agent`. Raises PolicyRefused when there is nothing to
    allow (a proxy that allows nothing is a bug) or for an entry
    `normalize_domains` refuses.

    - each configured gateway (`inference_urls`) on exactly its own port: an
      http gateway for plain requests, an https gateway for `CONNECT` only;
    - the harness's provider allowlist, exact hosts only, on the standard
      ports 80 and 443 (`CONNECT` to 443 only). The environment uses it only
      when no gateway is configured (`network.environment.plan_egress`).

    Every host, name or IPv4 literal, is matched by `dstdomain -n`, and the
    first rule denies every other host. So squid looks up only the names it
    forwards to, never a denied one (a `dst` rule would make squid resolve
    every requested name before denying it, which sends the name, and whatever
    data an agent puts into it, to the resolver). A leading-dot suffix is
    refused (anyone can own a name under a public suffix such as `.amazonaws.com`).

    `pins` (gateway host -> IPv4 address the worker checked) add a `dst` rule
    to that gateway's: squid resolves the name from the proxy's hosts file,
    where the environment writes the same address, and connects to nothing else.
    """
    if not domains and not gateways:
        raise PolicyRefused("inference proxy requested with an empty allowlist")
    endpoints = sorted({(_host_entry(g.host, "gateway host"), g.port, g.scheme) for g in gateways})
    gateway_hosts = {host for host, _, _ in endpoints}
    plain = [d for d in normalize_domains(domains) if d not in gateway_hosts]
    lines = [
        "# Generated by sciencebench.network.squid for one trial; do not edit.",
        f"http_port {port}",
        "visible_hostname sciencebench-inference-proxy",
        "pid_filename /tmp/squid.pid",
        "coredump_dir /tmp",
        "cache deny all",
        # squid's native format, then its own error (a reset or refused connection to the gateway)
        # and the gateway's Retry-After: what `worker.pier.provider` reads of a trial's model calls.
        f"logformat sciencebench {ACCESS_LOG_FORMAT}",
        "access_log stdio:/tmp/squid-access.log sciencebench",
        "cache_log /tmp/squid-cache.log",
        "log_mime_hdrs off",
        "forwarded_for delete",
        # No peer protocols, no ICMP pinger: the proxy talks to nothing but allowed hosts.
        "icp_port 0",
        "htcp_port 0",
        "pinger_enable off",
        "shutdown_lifetime 1 seconds",
        # squid's default helper formats contain %>A (the client's host name), which
        # makes squid reverse-resolve every client address; neither helper runs here.
        f'url_rewrite_extras "{_HELPER_EXTRAS}"',
        f'store_id_extras "{_HELPER_EXTRAS}"',
        "",
        f"auth_param basic program /usr/lib/squid/basic_ncsa_auth {auth_file}",
        "auth_param basic realm sciencebench-inference-proxy",
        "acl authenticated proxy_auth REQUIRED",
        "acl CONNECT method CONNECT",
        # -n everywhere: a host is compared as written, never resolved (no
        # forward lookup of a name, no reverse lookup of an address).
        f"acl allowed_hosts dstdomain -n {' '.join(sorted(gateway_hosts | set(plain)))}",
    ]
    # The first rule: a host that is not allowed is denied before anything else is looked at.
    rules = ["http_access deny !allowed_hosts"]
    for index, (host, gw_port, scheme) in enumerate(endpoints, start=1):
        lines.append(f"acl gateway_{index}_host dstdomain -n {host}")
        lines.append(f"acl gateway_{index}_port port {gw_port}")
        method = "CONNECT" if scheme == "https" else "!CONNECT"
        pinned = ""
        if address := (pins or {}).get(host):
            lines.append(f"acl gateway_{index}_address dst {_host_entry(address, 'pinned address')}")
            pinned = f" gateway_{index}_address"
        # Authentication last, so a refused destination gets 403, not a 407.
        allowed = f"gateway_{index}_host gateway_{index}_port{pinned}"
        rules.append(f"http_access allow {allowed} {method} authenticated")
    if plain:
        lines.append(f"acl allowed_domains dstdomain -n {' '.join(plain)}")
        lines.append(f"acl standard_ports port {' '.join(map(str, STANDARD_PORTS))}")
        lines.append("acl tls_port port 443")
        rules.append("http_access allow allowed_domains standard_ports !CONNECT authenticated")
        rules.append("http_access allow allowed_domains tls_port CONNECT authenticated")
    return "\n".join([*lines, "", *rules, "http_access deny all", ""])
