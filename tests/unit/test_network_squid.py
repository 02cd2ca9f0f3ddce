"""The proxy's squid.conf: what it allows, on which ports, and what it refuses to render."""

from __future__ import annotations

import hashlib
import re

import pytest

from sciencebench.core.gateways import Gateway, parse_gateway
from sciencebench.network.errors import PolicyRefused
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


def test_provider_domains_are_allowed_on_standard_ports_only() -> None:
    conf = render_squid_conf(["api.openai.com"], [])
    assert acl(conf, "allowed_domains") == ["dstdomain", "-n", "api.openai.com"]
    assert acl(conf, "standard_ports") == ["port", "80", "443"]
    assert acl(conf, "Safe_ports") == ["port", "80", "443"]
    assert acl(conf, "SSL_ports") == ["port", "443"]
    assert directives(conf, "http_access") == [
        "http_access deny !Safe_ports",
        "http_access deny CONNECT !SSL_ports",
        "http_access allow standard_ports allowed_domains authenticated",
        "http_access deny all",
    ]


def test_nonstandard_gateway_port_is_opened_for_its_host_only() -> None:
    conf = render_squid_conf(["api.openai.com", "gw"], [gw("http://gw:4000/v1")])
    assert acl(conf, "Safe_ports") == ["port", "80", "443", "4000"]
    # http gateway: no CONNECT to 4000.
    assert acl(conf, "SSL_ports") == ["port", "443"]
    assert acl(conf, "gateway_1_host") == ["dstdomain", "-n", "gw"]
    assert acl(conf, "gateway_1_port") == ["port", "4000"]
    rules = directives(conf, "http_access")
    assert "http_access allow gateway_1_port gateway_1_host authenticated" in rules
    # The only rule mentioning port 4000 is the gateway's; domains stay on 80/443.
    assert "http_access allow standard_ports allowed_domains authenticated" in rules
    assert rules[-1] == "http_access deny all"


def test_https_gateway_port_becomes_an_ssl_port() -> None:
    conf = render_squid_conf([], [gw("https://gateway.example.edu:8443/v1")])
    assert acl(conf, "SSL_ports") == ["port", "443", "8443"]
    assert acl(conf, "gateway_1_host") == ["dstdomain", "-n", "gateway.example.edu"]


def test_gateway_on_a_standard_port_joins_the_domain_rule() -> None:
    conf = render_squid_conf([], [gw("https://gateway.example.edu/v1")])
    assert acl(conf, "allowed_domains") == ["dstdomain", "-n", "gateway.example.edu"]
    assert not [line for line in conf.splitlines() if "gateway_1" in line]


def test_ip_gateways_use_dst_rules() -> None:
    conf = render_squid_conf([], [gw("http://10.0.0.5:4000/v1"), gw("http://10.0.0.6/v1")])
    assert acl(conf, "gateway_1_host") == ["dst", "10.0.0.5"]
    assert acl(conf, "allowed_ips") == ["dst", "10.0.0.6"]


def test_two_gateways_on_one_port_get_separate_host_rules() -> None:
    conf = render_squid_conf([], [gw("http://a:4000"), gw("http://b:4000")])
    assert acl(conf, "gateway_1_host")[-1] == "a"
    assert acl(conf, "gateway_2_host")[-1] == "b"
    assert acl(conf, "Safe_ports") == ["port", "80", "443", "4000"]


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
    ],
)
def test_allowlist_entries_that_could_inject_or_widen_are_refused(entry: str) -> None:
    with pytest.raises(PolicyRefused):
        render_squid_conf([entry], [])


def test_normalize_drops_entries_a_suffix_covers() -> None:
    assert normalize_domains(["API.Anthropic.com.", ".anthropic.com", "anthropic.com", "x.org"]) == [
        ".anthropic.com",
        "x.org",
    ]
    assert normalize_domains(["10.0.0.5", "::1"]) == ["10.0.0.5", "::1"]


def test_passwd_line_is_an_unsalted_md5_basic_ncsa_accepts() -> None:
    line = passwd_line("s3cret-token")
    assert line == f"agent:{hashlib.md5(b's3cret-token').hexdigest()}\n"
    assert re.fullmatch(r"agent:[0-9a-f]{32}\n", line)
