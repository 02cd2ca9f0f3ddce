"""A gateway name is checked where it resolves, and the proxy uses only the address checked.

The worker resolves every gateway name its operator did not list when the
trial runs (`core.gateways.pin_gateways`, `worker.gatewaypins`): a name that
resolves to an internal address, to this worker's own or to its broker's, or
to nothing, is refused; otherwise the proxy is pinned to the address checked
(its hosts file and a `dst` rule), so a name rebound after the check gains
nothing. Names here resolve through this machine's own resolver (`localhost`)
or a resolver given as a function; nothing is sent anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sciencebench.core.errors import PolicyRefused, RefusedError, SettingsError
from sciencebench.core.gateways import parse_gateway, parse_pins, pin_gateways, resolve_ipv4
from sciencebench.core.settings import Settings
from sciencebench.network.compose import PROXY_SERVICE, ProxyFiles, policy_compose
from sciencebench.network.egress import plan_egress
from sciencebench.network.squid import render_squid_conf
from sciencebench.worker.gatewaypins import broker_addresses, gateway_pins, local_addresses
from tests.fixtures.job_files import codex_job

pytestmark = pytest.mark.unit

PROXY_IMAGE = "127.0.0.1:5555/sciencebench/squid@sha256:" + "a" * 64
PUBLIC = "93.184.216.34"  # never contacted: only compared


def gw(url: str) -> list:
    return [parse_gateway(url, "X")]


def resolver(table: dict[str, list[str]]):
    return lambda host: table.get(host, [])


def test_a_name_that_resolves_to_loopback_here_is_refused() -> None:
    assert "127.0.0.1" in resolve_ipv4("localhost")  # this machine's own resolver
    with pytest.raises(ValueError) as caught:
        pin_gateways(gw("https://localhost:2375/v1"), [])
    assert "localhost resolves to 127.0.0.1, a loopback address" in str(caught.value)
    assert "worker --gateway https://localhost:2375" in str(caught.value)


@pytest.mark.parametrize(
    "addresses",
    [["169.254.169.254"], ["10.0.0.5"], [PUBLIC, "172.17.0.1"], ["100.64.0.1"], ["0.0.0.0"]],
    ids=["metadata", "private", "one-of-two", "shared", "unspecified"],
)
def test_any_internal_address_among_a_names_answers_refuses_it(addresses: list[str]) -> None:
    with pytest.raises(ValueError, match=r"resolves to .*address"):
        pin_gateways(gw("https://api.example.edu/v1"), [], resolve=resolver({"api.example.edu": addresses}))


def test_the_workers_and_the_brokers_own_addresses_are_refused() -> None:
    table = resolver({"api.example.edu": [PUBLIC]})
    with pytest.raises(ValueError, match="an address of this worker or its broker"):
        pin_gateways(gw("https://api.example.edu/v1"), [], forbidden={PUBLIC}, resolve=table)


def test_a_name_that_does_not_resolve_is_refused_not_left_to_the_proxy() -> None:
    # A resolver that fails now and answers an internal address later must not win.
    with pytest.raises(ValueError, match="does not resolve to an IPv4 address here"):
        pin_gateways(gw("https://api.example.edu/v1"), [], resolve=resolver({}))


def test_a_public_name_is_pinned_to_the_first_address_checked() -> None:
    table = resolver({"api.example.edu": [PUBLIC, "93.184.216.35"]})
    assert pin_gateways(gw("https://api.example.edu/v1"), [], resolve=table) == {"api.example.edu": PUBLIC}


def test_listed_gateways_and_address_literals_are_not_pinned() -> None:
    listed = gw("https://localhost:2375")
    assert pin_gateways(gw("https://localhost:2375/v1"), listed, resolve=resolver({})) == {}
    assert pin_gateways(gw(f"https://{PUBLIC}/v1"), [], resolve=resolver({})) == {}


@pytest.mark.parametrize(
    "value",
    [
        '["x"]',
        '{"gw.test": "::1"}',
        '{"10.0.0.1": "10.0.0.2"}',
        '{"gw.test": "gw.other"}',
        '{"a b": "1.2.3.4"}',
    ],
)
def test_pins_are_checked_again_where_they_are_used(value: str) -> None:
    with pytest.raises(ValueError, match="gateway pins"):
        parse_pins(value)
    with pytest.raises(PolicyRefused, match="gateway pins"):
        plan_egress(allow_internet=False, uses_compose=False, allowlist_domains=["gw.test"],
                    inference_urls=["http://gw.test:4000/v1"], proxy_image=PROXY_IMAGE,
                    gateway_pins=value)  # fmt: skip


def test_a_pin_for_a_host_that_is_no_gateway_is_refused() -> None:
    with pytest.raises(PolicyRefused, match=r"other\.test is not a gateway's host"):
        plan_egress(allow_internet=False, uses_compose=False, allowlist_domains=["gw.test"],
                    inference_urls=["http://gw.test:4000/v1"], proxy_image=PROXY_IMAGE,
                    gateway_pins=json.dumps({"other.test": PUBLIC}))  # fmt: skip


def test_the_proxy_resolves_a_pinned_name_to_its_address_and_connects_to_nothing_else() -> None:
    plan = plan_egress(allow_internet=False, uses_compose=False, allowlist_domains=["gw.test"],
                       inference_urls=["https://gw.test:8443/v1"], proxy_image=PROXY_IMAGE,
                       gateway_pins=json.dumps({"gw.test": PUBLIC}))  # fmt: skip
    conf = render_squid_conf(plan.domains, plan.gateways, dict(plan.pins))
    assert f"acl gateway_1_address dst {PUBLIC}" in conf
    assert "http_access allow gateway_1_host gateway_1_port gateway_1_address CONNECT authenticated" in conf
    # The first rule still denies every other name before anything is resolved.
    assert conf.split("\n\n")[-1].startswith("http_access deny !allowed_hosts")
    proxy = ProxyFiles(image=PROXY_IMAGE, squid_conf="/c", passwd="/p", hosts=plan.pins)
    service = policy_compose("isolated-allowlist", proxy)["services"][PROXY_SERVICE]
    assert service["extra_hosts"] == [f"gw.test:{PUBLIC}"]
    unpinned = ProxyFiles(image=PROXY_IMAGE, squid_conf="/c", passwd="/p")
    assert "extra_hosts" not in policy_compose("isolated-allowlist", unpinned)["services"][PROXY_SERVICE]


def test_this_hosts_addresses_come_from_the_routing_table(tmp_path: Path) -> None:
    assert "127.0.0.1" in local_addresses()  # this machine's own table
    trie = tmp_path / "fib_trie"
    trie.write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 203.0.113.7\n        /32 host LOCAL\n"
        "     |-- 203.0.113.255\n        /32 link BROADCAST\n"
        "     |-- 198.51.100.0\n        /24 link UNICAST\n"
    )
    assert local_addresses(trie) == {"203.0.113.7"}
    assert broker_addresses("redis://:secret@localhost:6379/0;redis://127.0.0.2:6380") == {
        "127.0.0.1",
        "127.0.0.2",
    }


def test_the_worker_refuses_a_job_whose_gateway_name_resolves_to_loopback(tmp_path: Path) -> None:
    job, _, _ = codex_job(tmp_path)
    gateway = parse_gateway("https://localhost:8443/v1", "X")
    job = job.model_copy(update={"agent": job.agent.model_copy(update={"gateways": (gateway,)})})
    with pytest.raises(RefusedError, match=r"localhost resolves to 127\.0\.0\.1, a loopback address"):
        gateway_pins(job, Settings())
    listed = Settings(gateways=tuple(gw("https://localhost:8443")))
    assert gateway_pins(job, listed) == {}


def test_an_address_literal_of_the_worker_or_its_broker_is_refused() -> None:
    # A global address of the worker itself (its Docker API, its sshd) passes admission's
    # internal-range check; only the worker knows it is its own.
    with pytest.raises(ValueError, match="is an address of this worker or its broker"):
        pin_gateways(gw(f"https://{PUBLIC}:2375/v1"), [], forbidden={PUBLIC}, resolve=resolver({}))
    listed = gw(f"https://{PUBLIC}:2375")
    assert pin_gateways(gw(f"https://{PUBLIC}:2375/v1"), listed, forbidden={PUBLIC}) == {}


def test_a_gateway_on_the_machine_of_a_worker_in_a_container_is_refused(tmp_path: Path) -> None:
    # A container's routing table holds its own addresses only: the machine's come from its operator.
    job, _, _ = codex_job(tmp_path)
    literal = parse_gateway(f"https://{PUBLIC}:2375/v1", "X")
    job = job.model_copy(update={"agent": job.agent.model_copy(update={"gateways": (literal,)})})
    assert gateway_pins(job, Settings()) == {}  # not known as this machine's: left to the proxy
    in_container = Settings.from_env({"SCIENCEBENCH_HOST_ADDRESSES": f"198.51.100.9, {PUBLIC}"})
    assert in_container.host_addresses == ("198.51.100.9", PUBLIC)
    with pytest.raises(RefusedError, match=f"{PUBLIC} is an address of this worker or its broker"):
        gateway_pins(job, in_container)
    with pytest.raises(SettingsError, match="not an IP address"):
        Settings.from_env({"SCIENCEBENCH_HOST_ADDRESSES": "worker-host.example"})


def test_the_worker_takes_its_machines_addresses_by_option(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from sciencebench import cli
    from sciencebench.worker import main as worker_main

    seen: list[Settings] = []
    monkeypatch.setattr(worker_main, "run_worker", lambda **kw: seen.append(kw["settings"]))
    monkeypatch.setenv("SCIENCEBENCH_PROXY_IMAGE", PROXY_IMAGE)
    base = ["worker", "--jobs-root", "/srv/jobs", "--selection-root", "/srv/sel"]
    done = CliRunner().invoke(cli.main, [*base, "--host-address", PUBLIC, "--host-address", "[2001:db8::1]"])
    assert done.exit_code == 0, done.output
    assert seen[0].host_addresses == (PUBLIC, "2001:db8::1")
    bad = CliRunner().invoke(cli.main, [*base, "--host-address", "worker-host.example"])
    assert bad.exit_code == 2 and "--host-address:" in bad.stderr and "Traceback" not in bad.output
    assert len(bad.stderr.strip().splitlines()) == 1 and len(seen) == 1
