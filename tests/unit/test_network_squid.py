"""The proxy's squid.conf: what it allows, on which ports, and what it refuses to render."""

from __future__ import annotations

import hashlib
import re

import pytest

from sciencebench.core.errors import PolicyRefused
from sciencebench.core.gateways import Gateway, parse_gateway
from sciencebench.network.squid import normalize_domains, passwd_line, render_squid_conf

pytestmark = pytest.mark.unit


def gw(url: str) -> Gateway:
    return parse_gateway(url, "test")


def directives(conf: str, name: str) -> list[str]:
    return [line for line in conf.splitlines() if line.startswith(name + " ")]


def acl(conf: str, acl_name: str) -> list[str]:
    for line in directives(conf, "acl"):
        parts = line.split()
        if parts[1] == acl_name:
            return parts[2:]
    raise AssertionError(f"acl {acl_name} missing")


# ACL types whose match never needs DNS, with the options they may carry in our rendering.
NO_DNS_ACLS = {("proxy_auth", "REQUIRED"), ("method", "CONNECT"), ("port", None), ("dstdomain", "-n")}


def acls(conf: str) -> dict[str, list[str]]:
    return {line.split()[1]: line.split()[2:] for line in directives(conf, "acl")}


def decide(conf: str, host: str, port: int, *, connect: bool = False, authenticated: bool = True) -> str:
    """What the rendered http_access rules answer for one request: allow, deny or 407.

    Evaluates the only ACL types the rendering may use (it refuses others), as
    squid does: the first rule whose ACLs all match decides; an unauthenticated
    request that reaches `authenticated` in an otherwise matching rule is
    challenged (407).
    """
    table = acls(conf)

    def matches(name: str) -> bool | None:
        if name == "all":
            return True
        kind, *values = table[name]
        if kind == "dstdomain":
            assert values[0] == "-n", conf
            return host in values[1:]
        if kind == "port":
            return str(port) in values
        if kind == "method":
            return connect
        if kind == "proxy_auth":
            return None if not authenticated else True
        raise AssertionError(f"unexpected acl type {kind}")

    for rule in directives(conf, "http_access"):
        _, action, *names = rule.split()
        challenged = False
        for name in names:
            result = matches(name.lstrip("!"))
            if result is None:
                challenged = True
                break
            if result == name.startswith("!"):
                break
        else:
            return action
        if challenged:
            return "407"
    return "deny"


CONFS = {
    "ip gateway": (["10.1.2.3"], ["http://10.1.2.3:4000/v1"]),
    "name gateway": (["gw.example.edu"], ["http://gw.example.edu:4000/v1"]),
    "https gateway": ([], ["https://gw.example.edu:8443/v1"]),
    "default ports": ([], ["https://gw.example.edu/v1", "http://10.1.2.3/v1"]),
    "plain domains": (["api.openai.com", "10.0.0.5"], []),
}


def render(name: str) -> str:
    domains, urls = CONFS[name]
    return render_squid_conf(domains, [gw(url) for url in urls])


@pytest.mark.parametrize("name", sorted(CONFS))
def test_no_rule_can_resolve_a_name_or_an_address(name: str) -> None:
    conf = render(name)
    for kind, *values in acls(conf).values():
        option = values[0] if kind != "port" else None
        assert (kind, option) in NO_DNS_ACLS, f"acl type {kind} {values}"
    # Whatever squid would resolve for (dst, dst_as, srcdomain, a reverse lookup, ...) is absent.
    assert not re.search(r"\b(dst|dst_as|srcdomain|srcdom_regex|dstdom_regex|url_regex|external)\b", conf)
    # The defaults of these name %>A, which makes squid reverse-resolve every client.
    assert "%>A" not in conf and len(directives(conf, "url_rewrite_extras")) == 1
    assert len(directives(conf, "store_id_extras")) == 1


@pytest.mark.parametrize("name", sorted(CONFS))
def test_unknown_hosts_are_denied_by_the_first_rule(name: str) -> None:
    conf = render(name)
    rules = directives(conf, "http_access")
    assert rules[0] == "http_access deny !allowed_hosts"
    assert rules[-1] == "http_access deny all"
    domains, urls = CONFS[name]
    assert acls(conf)["allowed_hosts"] == [
        "dstdomain",
        "-n",
        *sorted({*domains, *(gw(u).host for u in urls)}),
    ]
    for port in (80, 443, 4000, 8443, 8181):
        for connect in (False, True):
            assert decide(conf, "data.attacker.example", port, connect=connect) == "deny"
            assert decide(conf, "data.attacker.example", port, connect=connect, authenticated=False) == "deny"


def test_ip_literal_gateway_is_a_literal_on_exactly_its_port() -> None:
    conf = render("ip gateway")
    assert acls(conf)["gateway_1_host"] == ["dstdomain", "-n", "10.1.2.3"]
    assert decide(conf, "10.1.2.3", 4000) == "allow"
    assert decide(conf, "10.1.2.3", 4000, authenticated=False) == "407"
    # The Codex adapter's allowlist names the gateway host: still only its port.
    assert decide(conf, "10.1.2.3", 80) == "deny"
    assert decide(conf, "10.1.2.3", 443, connect=True) == "deny"
    assert decide(conf, "10.1.2.3", 4000, connect=True) == "deny"  # an http gateway gets no tunnel


def test_hostname_gateway_on_exactly_its_port() -> None:
    conf = render("name gateway")
    assert decide(conf, "gw.example.edu", 4000) == "allow"
    assert decide(conf, "gw.example.edu", 80) == "deny"
    assert decide(conf, "gw.example.edu", 443, connect=True) == "deny"
    assert decide(conf, "github.com", 4000) == "deny"
    assert "allowed_domains" not in acls(conf)


def test_https_gateway_gets_connect_to_its_port_only() -> None:
    conf = render("https gateway")
    assert decide(conf, "gw.example.edu", 8443, connect=True) == "allow"
    assert decide(conf, "gw.example.edu", 8443) == "deny"
    assert decide(conf, "gw.example.edu", 443, connect=True) == "deny"


def test_a_url_without_a_port_gets_the_schemes_default_only() -> None:
    conf = render("default ports")
    assert decide(conf, "gw.example.edu", 443, connect=True) == "allow"
    assert decide(conf, "gw.example.edu", 80) == "deny"
    assert decide(conf, "10.1.2.3", 80) == "allow"
    assert decide(conf, "10.1.2.3", 443, connect=True) == "deny"
    assert decide(conf, "10.1.2.3", 443) == "deny"


def test_plain_allowlist_hosts_keep_80_and_connect_443() -> None:
    conf = render("plain domains")
    for host in ("api.openai.com", "10.0.0.5"):
        assert decide(conf, host, 80) == "allow"
        assert decide(conf, host, 443, connect=True) == "allow"
        assert decide(conf, host, 443) == "allow"
        assert decide(conf, host, 80, connect=True) == "deny"
        assert decide(conf, host, 4000) == "deny"
    assert decide(conf, "10.0.0.6", 80) == "deny"
    assert decide(conf, "openai.com", 80) == "deny" and decide(conf, "x.api.openai.com", 80) == "deny"


def test_two_gateways_on_one_port_get_separate_host_rules() -> None:
    conf = render_squid_conf([], [gw("http://a:4000"), gw("http://b:4000")])
    assert acls(conf)["gateway_1_host"][-1] == "a"
    assert acls(conf)["gateway_2_host"][-1] == "b"
    assert decide(conf, "a", 4000) == decide(conf, "b", 4000) == "allow"


def test_proxy_requires_basic_auth_with_the_mounted_file() -> None:
    conf = render_squid_conf(["api.openai.com"], [])
    assert "auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/sciencebench.passwd" in conf
    assert acl(conf, "authenticated") == ["proxy_auth", "REQUIRED"]
    assert all(
        line.endswith(" authenticated") for line in directives(conf, "http_access") if " allow " in line
    )


def test_empty_allowlist_is_refused() -> None:
    with pytest.raises(PolicyRefused):
        render_squid_conf([], [])


@pytest.mark.parametrize(
    "entry",
    [
        "api.openai.com\nhttp_access allow all",
        "a b",
        "*.openai.com",
        "api.openai.com:443",
        "x/y",
        "",
        ".10.0.0.1",
        ".amazonaws.com",
        ".googleapis.com",
        "::1",
        "010.1.2.3",
        "1.2.3",
    ],
)
def test_allowlist_entries_that_could_inject_or_widen_are_refused(entry: str) -> None:
    with pytest.raises(PolicyRefused):
        render_squid_conf([entry], [])
    with pytest.raises(PolicyRefused):
        normalize_domains([entry])


def test_a_suffix_is_refused_with_one_clear_line() -> None:
    with pytest.raises(
        PolicyRefused, match=r"'\.amazonaws\.com' is a domain suffix; the proxy allows exact hosts"
    ):
        render_squid_conf([".amazonaws.com"], [])


def test_ipv6_gateways_are_refused() -> None:
    with pytest.raises(PolicyRefused, match="IPv6"):
        render_squid_conf([], [gw("http://[::1]:4000/v1")])


def test_normalize_canonicalizes_and_deduplicates() -> None:
    assert normalize_domains(["API.Anthropic.com.", "api.anthropic.com", "x.org"]) == [
        "api.anthropic.com",
        "x.org",
    ]
    assert normalize_domains(["10.0.0.5", "10.0.0.5"]) == ["10.0.0.5"]


def test_passwd_line_is_an_unsalted_md5_basic_ncsa_accepts() -> None:
    line = passwd_line("s3cret-token")
    assert line == f"agent:{hashlib.md5(b's3cret-token').hexdigest()}\n"
    assert re.fullmatch(r"agent:[0-9a-f]{32}\n", line)


def test_through_a_gateway_host_only_its_gateways_port_and_method_are_reachable() -> None:
    # An https gateway gets a CONNECT tunnel: on any other port of its host that would be a raw TCP
    # connection to whatever listens there (a Docker API, a Redis), so each gateway gets exactly its own.
    gateways = [gw("https://gw.example.edu:8443/v1"), gw("http://gw.example.edu:4000/v1"),
                gw("https://10.1.2.3/v1")]  # fmt: skip
    conf = render_squid_conf(["gw.example.edu", "10.1.2.3", "api.openai.com"], gateways)
    allowed = {(g.host, g.port, g.scheme == "https") for g in gateways}
    ports = {*range(1, 1025), 2375, 2376, 3999, 4001, 6379, 8080, 8442, 8444, 65535}
    for host in ("gw.example.edu", "10.1.2.3"):
        for port in sorted(ports):
            for connect in (False, True):
                expected = "allow" if (host, port, connect) in allowed else "deny"
                assert decide(conf, host, port, connect=connect) == expected, (host, port, connect)
    # With a gateway configured the harness's allowlist is not used (network.egress.plan_egress),
    # and a gateway host never falls back to its standard ports.
    assert decide(conf, "gw.example.edu", 443, connect=True) == "deny"
    assert decide(conf, "gw.example.edu", 80) == "deny"
