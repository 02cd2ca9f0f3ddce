"""The policy's compose override, per mode."""

from __future__ import annotations

import pytest

from sciencebench.dockerhost.labels import OWNER_LABEL
from sciencebench.network.compose import ProxyFiles, build_network_problems, policy_compose

pytestmark = pytest.mark.unit

PROXY = ProxyFiles(
    image="127.0.0.1:5555/sciencebench/squid@sha256:" + "a" * 64,
    squid_conf="/jobs/j/task_002__abc/network-policy/s/squid.conf",
    passwd="/jobs/j/task_002__abc/network-policy/s/squid.passwd",
)


def test_none_mode_has_no_network_and_hardened_main() -> None:
    compose = policy_compose("none")
    assert set(compose) == {"services"}
    main = compose["services"]["main"]
    assert main["network_mode"] == "none"
    assert main["cap_drop"] == ["NET_ADMIN", "NET_RAW"]
    assert main["privileged"] is False
    assert main["stop_signal"] == "SIGKILL"
    assert "cap_add" not in main


def test_egress_mode_puts_main_on_the_internal_network_only() -> None:
    compose = policy_compose("isolated-allowlist", PROXY)
    main = compose["services"]["main"]
    assert main["networks"] == ["sb-internal"]
    assert "network_mode" not in main
    assert main["depends_on"] == {"sb-egress-proxy": {"condition": "service_healthy"}}
    assert main["cap_drop"] == ["NET_ADMIN", "NET_RAW"]
    assert main["stop_signal"] == "SIGKILL"


def test_internal_network_is_an_isolated_ipv4_only_internal_bridge() -> None:
    networks = policy_compose("isolated-allowlist", PROXY)["networks"]
    assert networks["sb-internal"] == {
        "driver": "bridge",
        "internal": True,
        "enable_ipv6": False,
        "driver_opts": {"com.docker.network.bridge.gateway_mode_ipv4": "isolated"},
    }
    assert networks["sb-egress"] == {"driver": "bridge", "enable_ipv6": False}


def test_proxy_is_pinned_hardened_and_does_not_forward() -> None:
    proxy = policy_compose("isolated-allowlist", PROXY)["services"]["sb-egress-proxy"]
    assert proxy["image"] == PROXY.image
    assert "build" not in proxy
    assert proxy["networks"] == ["sb-internal", "sb-egress"]
    assert proxy["sysctls"] == {"net.ipv4.ip_forward": "0", "net.ipv6.conf.all.forwarding": "0"}
    assert proxy["cap_drop"] == ["NET_ADMIN", "NET_RAW"]
    assert proxy["privileged"] is False
    assert "cap_add" not in proxy
    targets = {v["target"]: (v["source"], v["read_only"]) for v in proxy["volumes"]}
    assert targets == {
        "/etc/squid/squid.conf": (PROXY.squid_conf, True),
        "/etc/squid/sciencebench.passwd": (PROXY.passwd, True),
    }


def test_dollar_signs_in_host_paths_stay_literal_for_compose() -> None:
    files = ProxyFiles(image=PROXY.image, squid_conf="/jobs/$HOME/squid.conf", passwd="/p")
    proxy = policy_compose("isolated-allowlist", files)["services"]["sb-egress-proxy"]
    assert proxy["volumes"][0]["source"] == "/jobs/$$HOME/squid.conf"


def test_mode_and_proxy_must_agree() -> None:
    with pytest.raises(ValueError):
        policy_compose("none", PROXY)
    with pytest.raises(ValueError):
        policy_compose("isolated-allowlist")


def test_every_container_is_labelled_with_its_owner() -> None:
    compose = policy_compose("isolated-allowlist", PROXY, owner="abc123")
    for service in compose["services"].values():
        assert service["labels"][OWNER_LABEL] == "abc123"
    assert OWNER_LABEL not in policy_compose("none")["services"]["main"]["labels"]


# --- builds ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "isolated-allowlist"])
def test_a_built_main_gets_a_build_with_no_network_and_nothing_else(mode: str) -> None:
    proxy = PROXY if mode == "isolated-allowlist" else None
    built = policy_compose(mode, proxy, offline_build=True)  # type: ignore[arg-type]
    assert built["services"]["main"]["build"] == {"network": "none"}
    # A service that only names its image stays one: no `build` key at all.
    prebuilt = policy_compose(mode, proxy)  # type: ignore[arg-type]
    assert "build" not in prebuilt["services"]["main"]
    for compose in (built, prebuilt):
        assert all("build" not in s for n, s in compose["services"].items() if n != "main")


CONTEXT = "/jobs/j/task_001__x/agent-build-context"


@pytest.mark.parametrize(
    ("build", "says"),
    [
        ({"context": "/t/environment", "dockerfile": "Dockerfile"}, "build network 'default'"),
        ({"context": "/t/environment", "network": "host"}, "build network 'host'"),
        ({"context": "/t/environment", "network": "default"}, "build network 'default'"),
        ("/t/environment", "build is not a mapping"),
    ],
)
def test_a_rendered_build_with_a_network_is_a_problem(build: object, says: str) -> None:
    problems = build_network_problems({"services": {"main": {"build": build}}})
    assert len(problems) == 1 and says in problems[0], problems


def test_a_rendered_model_without_builds_or_with_offline_builds_passes() -> None:
    assert (
        build_network_problems({"services": {"main": {"image": "x"}, "sb-egress-proxy": {"image": "y"}}})
        == []
    )
    assert (
        build_network_problems({"services": {"main": {"build": {"context": "/c", "network": "none"}}}}) == []
    )
    assert build_network_problems({}) == []


def test_the_proxy_is_never_built() -> None:
    model = {"services": {"sb-egress-proxy": {"image": "y", "build": {"context": "/c", "network": "none"}}}}
    assert build_network_problems(model) == [
        "service sb-egress-proxy: built for the trial (only 'main' may be built)"
    ]


def test_no_build_keeps_the_network_not_even_pier_s_agent_install() -> None:
    agent_build = {"services": {"main": {"build": {"context": CONTEXT, "dockerfile": "Dockerfile"}}}}
    assert build_network_problems(agent_build) != []
    proxy = {"services": {"sb-egress-proxy": {"build": {"context": CONTEXT}}}}
    assert len(build_network_problems(proxy)) == 2


def test_every_policy_service_gets_a_pids_limit() -> None:
    # A fork bomb in one trial would otherwise reach every trial of the host.
    for compose in (policy_compose("none"), policy_compose("isolated-allowlist", PROXY)):
        for service in compose["services"].values():
            assert service["pids_limit"] == 4096
    small = policy_compose("isolated-allowlist", PROXY, pids_limit=256)
    assert {s["pids_limit"] for s in small["services"].values()} == {256}
