"""The inspection verdict, over `docker inspect` JSON captured from a real trial.

EGRESS and NONE were captured on Docker Engine 28.5.2 from
IsolatedDockerEnvironment trials (codex-like allowlist with a gateway, and
no allowlist) and trimmed to the fields inspection reads; the agent's
writable log mounts Pier added then were dropped, as the environment now
mounts nothing into the agent. Each deviation
test breaks exactly one thing on a copy and expects the matching failure.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from sciencebench.network.inspection import (
    Snapshot,
    engine_major,
    inspect_policy,
    policy_record,
)

pytestmark = pytest.mark.unit

EGRESS: dict[str, Any] = json.loads(
    """
{
 "engine_version": "28.5.2+dfsg4",
 "containers": [
  {
   "Id": "0a2f17ada2b2b67fbcc39da0a97fda3a4fbe540d2214d08b60eb801d56803351",
   "Name": "/task_002__fixtureegress-main-1",
   "Config": {
    "Labels": {
     "com.docker.compose.project": "task_002__fixtureegress",
     "com.docker.compose.service": "main",
     "org.sciencebench.network-role": "agent"
    }
   },
   "HostConfig": {
    "PidsLimit": 4096,
    "Memory": 2147483648,
    "MemorySwap": 2147483648,
    "LogConfig": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "2"}},
    "NetworkMode": "task_002__fixtureegress_sb-internal",
    "CapDrop": [
     "CAP_NET_ADMIN",
     "CAP_NET_RAW"
    ],
    "CapAdd": null,
    "Privileged": false,
    "Sysctls": null,
    "SecurityOpt": null
   },
   "Mounts": [],
   "NetworkSettings": {
    "Networks": {
     "task_002__fixtureegress_sb-internal": {
      "NetworkID": "638102bba2e1383289cc75ab6a0dc7449d85bf29a07eaf7c13d9ebdb6842f31c",
      "IPAddress": "172.19.0.2",
      "Gateway": "",
      "GlobalIPv6Address": ""
     }
    }
   }
  },
  {
   "Id": "035fc0f60e78d2e5f7bfe8860c35aa5f1445ca9af3b2c26e8d6d99f023876286",
   "Name": "/task_002__fixtureegress-sb-egress-proxy-1",
   "Config": {
    "Labels": {
     "com.docker.compose.project": "task_002__fixtureegress",
     "com.docker.compose.service": "sb-egress-proxy",
     "org.sciencebench.network-role": "proxy"
    }
   },
   "HostConfig": {
    "PidsLimit": 4096,
    "Memory": 2147483648,
    "MemorySwap": 2147483648,
    "LogConfig": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "2"}},
    "NetworkMode": "task_002__fixtureegress_sb-egress",
    "CapDrop": [
     "CAP_NET_ADMIN",
     "CAP_NET_RAW"
    ],
    "CapAdd": null,
    "Privileged": false,
    "Sysctls": {
     "net.ipv4.ip_forward": "0",
     "net.ipv6.conf.all.forwarding": "0"
    },
    "SecurityOpt": [
     "no-new-privileges:true"
    ]
   },
   "Mounts": [
    {
     "Type": "bind",
     "Source": "/var/tmp/jobs/fixture/trial/network-policy/task_002__fixtureegress/squid.conf",
     "Destination": "/etc/squid/squid.conf",
     "RW": false
    },
    {
     "Type": "bind",
     "Source": "/var/tmp/jobs/fixture/trial/network-policy/task_002__fixtureegress/squid.passwd",
     "Destination": "/etc/squid/sciencebench.passwd",
     "RW": false
    }
   ],
   "NetworkSettings": {
    "Networks": {
     "task_002__fixtureegress_sb-egress": {
      "NetworkID": "c897bd3b258fa52eff5348498baf8357e63a185caedb1cfa4f9352a6c0b19d4c",
      "IPAddress": "172.18.0.2",
      "Gateway": "172.18.0.1",
      "GlobalIPv6Address": ""
     },
     "task_002__fixtureegress_sb-internal": {
      "NetworkID": "638102bba2e1383289cc75ab6a0dc7449d85bf29a07eaf7c13d9ebdb6842f31c",
      "IPAddress": "172.19.0.1",
      "Gateway": "",
      "GlobalIPv6Address": ""
     }
    }
   }
  }
 ],
 "networks": [
  {
   "Name": "task_002__fixtureegress_sb-internal",
   "Id": "638102bba2e1383289cc75ab6a0dc7449d85bf29a07eaf7c13d9ebdb6842f31c",
   "Driver": "bridge",
   "Internal": true,
   "EnableIPv6": false,
   "EnableIPv4": true,
   "Options": {
    "com.docker.network.bridge.gateway_mode_ipv4": "isolated"
   },
   "IPAM": {
    "Driver": "default",
    "Options": null,
    "Config": [
     {
      "Subnet": "172.19.0.0/16"
     }
    ]
   },
   "Containers": {
    "035fc0f60e78d2e5f7bfe8860c35aa5f1445ca9af3b2c26e8d6d99f023876286": {
     "Name": "task_002__fixtureegress-sb-egress-proxy-1",
     "IPv4Address": "172.19.0.1/16"
    },
    "0a2f17ada2b2b67fbcc39da0a97fda3a4fbe540d2214d08b60eb801d56803351": {
     "Name": "task_002__fixtureegress-main-1",
     "IPv4Address": "172.19.0.2/16"
    }
   }
  },
  {
   "Name": "task_002__fixtureegress_sb-egress",
   "Id": "c897bd3b258fa52eff5348498baf8357e63a185caedb1cfa4f9352a6c0b19d4c",
   "Driver": "bridge",
   "Internal": false,
   "EnableIPv6": false,
   "EnableIPv4": true,
   "Options": {},
   "IPAM": {
    "Driver": "default",
    "Options": null,
    "Config": [
     {
      "Subnet": "172.18.0.0/16",
      "Gateway": "172.18.0.1"
     }
    ]
   },
   "Containers": {
    "035fc0f60e78d2e5f7bfe8860c35aa5f1445ca9af3b2c26e8d6d99f023876286": {
     "Name": "task_002__fixtureegress-sb-egress-proxy-1",
     "IPv4Address": "172.18.0.2/16"
    }
   }
  }
 ]
}
"""
)

NONE: dict[str, Any] = json.loads(
    """
{
 "engine_version": "28.5.2+dfsg4",
 "containers": [
  {
   "Id": "b0083ce581d67eee1a1f7265ebbd4cd5eadb1e2dfb2d57905f76d6a83692edf6",
   "Name": "/task_002__fixturenone-main-1",
   "Config": {
    "Labels": {
     "com.docker.compose.project": "task_002__fixturenone",
     "com.docker.compose.service": "main",
     "org.sciencebench.network-role": "agent"
    }
   },
   "HostConfig": {
    "PidsLimit": 4096,
    "Memory": 2147483648,
    "MemorySwap": 2147483648,
    "LogConfig": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "2"}},
    "NetworkMode": "none",
    "CapDrop": [
     "CAP_NET_ADMIN",
     "CAP_NET_RAW"
    ],
    "CapAdd": null,
    "Privileged": false,
    "Sysctls": null,
    "SecurityOpt": null
   },
   "Mounts": [],
   "NetworkSettings": {
    "Networks": {
     "none": {
      "NetworkID": "911deab17f1644678ec0631e22aa4bf2f56eb1a2e01bc2eb760e9c6f89d584b5",
      "IPAddress": "",
      "Gateway": "",
      "GlobalIPv6Address": ""
     }
    }
   }
  }
 ],
 "networks": [
  {
   "Name": "none",
   "Id": "911deab17f1644678ec0631e22aa4bf2f56eb1a2e01bc2eb760e9c6f89d584b5",
   "Driver": "null",
   "Internal": false,
   "EnableIPv6": false,
   "EnableIPv4": true,
   "Options": {},
   "IPAM": {
    "Driver": "default",
    "Options": null,
    "Config": null
   },
   "Containers": {
    "b0083ce581d67eee1a1f7265ebbd4cd5eadb1e2dfb2d57905f76d6a83692edf6": {
     "Name": "task_002__fixturenone-main-1",
     "IPv4Address": ""
    }
   }
  }
 ]
}
"""
)

AGENT_ID = "0a2f17ada2b2b67fbcc39da0a97fda3a4fbe540d2214d08b60eb801d56803351"
PROXY_ID = "035fc0f60e78d2e5f7bfe8860c35aa5f1445ca9af3b2c26e8d6d99f023876286"
INTERNAL = "task_002__fixtureegress_sb-internal"
EGRESS_NET = "task_002__fixtureegress_sb-egress"


def egress() -> dict[str, Any]:
    return copy.deepcopy(EGRESS)


def none() -> dict[str, Any]:
    return copy.deepcopy(NONE)


def container(snapshot: dict[str, Any], service: str) -> dict[str, Any]:
    return next(
        c for c in snapshot["containers"] if c["Config"]["Labels"]["com.docker.compose.service"] == service
    )


def network(snapshot: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in snapshot["networks"] if n["Name"] == name)


def verdict(snapshot: dict[str, Any], mode: str = "isolated-allowlist") -> list[str]:
    return inspect_policy(
        snapshot["engine_version"],
        snapshot["containers"],
        snapshot["networks"],
        mode=mode,  # type: ignore[arg-type]
    )


def only(failures: list[str], *fragments: str) -> None:
    """Exactly one failure, containing every fragment."""
    assert len(failures) == 1, failures
    for fragment in fragments:
        assert fragment in failures[0], failures


# --- compliant trials ----------------------------------------------------


def test_real_egress_trial_passes() -> None:
    assert verdict(egress()) == []


def test_real_no_network_trial_passes() -> None:
    assert verdict(none(), "none") == []


# --- one deviation each ----------------------------------------------------


def test_agent_on_an_extra_network_fails() -> None:
    snap = egress()
    agent = container(snap, "main")
    agent["NetworkSettings"]["Networks"][EGRESS_NET] = dict(
        container(snap, "sb-egress-proxy")["NetworkSettings"]["Networks"][EGRESS_NET]
    )
    only(verdict(snap), "main", "joins 2 network(s)", "expected exactly one")


def test_non_internal_network_fails() -> None:
    snap = egress()
    network(snap, INTERNAL)["Internal"] = False
    only(verdict(snap), INTERNAL, "not Internal")


def test_ipv6_on_fails() -> None:
    snap = egress()
    network(snap, INTERNAL)["EnableIPv6"] = True
    only(verdict(snap), INTERNAL, "EnableIPv6")


def test_host_gateway_present_fails() -> None:
    snap = egress()
    network(snap, INTERNAL)["IPAM"]["Config"][0]["Gateway"] = "172.19.0.1"
    only(verdict(snap), INTERNAL, "host gateway", "172.19.0.1")


def test_gateway_mode_not_isolated_fails() -> None:
    snap = egress()
    network(snap, INTERNAL)["Options"] = {}
    only(verdict(snap), "gateway_mode_ipv4", "expected 'isolated'")


def test_non_bridge_driver_fails() -> None:
    snap = egress()
    network(snap, INTERNAL)["Driver"] = "macvlan"
    only(verdict(snap), "driver is 'macvlan'")


def test_missing_ipam_config_fails() -> None:
    snap = egress()
    network(snap, INTERNAL)["IPAM"]["Config"] = None
    only(verdict(snap), "no IPAM config")


@pytest.mark.parametrize("service", ["main", "sb-egress-proxy"])
@pytest.mark.parametrize("cap", ["NET_ADMIN", "NET_RAW"])
def test_missing_cap_drop_fails(service: str, cap: str) -> None:
    snap = egress()
    host = container(snap, service)["HostConfig"]
    host["CapDrop"] = [c for c in host["CapDrop"] if c != f"CAP_{cap}"]
    only(verdict(snap), service, f"{cap} not in HostConfig.CapDrop")


def test_missing_cap_drop_in_no_network_mode_fails() -> None:
    snap = none()
    container(snap, "main")["HostConfig"]["CapDrop"] = None
    failures = verdict(snap, "none")
    assert len(failures) == 2 and all("not in HostConfig.CapDrop" in f for f in failures)


@pytest.mark.parametrize("service", ["main", "sb-egress-proxy"])
def test_cap_add_fails(service: str) -> None:
    snap = egress()
    container(snap, service)["HostConfig"]["CapAdd"] = ["CAP_SYS_ADMIN"]
    only(verdict(snap), service, "CapAdd")


@pytest.mark.parametrize("service", ["main", "sb-egress-proxy"])
def test_privileged_fails(service: str) -> None:
    snap = egress()
    container(snap, service)["HostConfig"]["Privileged"] = True
    only(verdict(snap), service, "Privileged")


@pytest.mark.parametrize("sysctl", ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"])
def test_proxy_forwarding_on_fails(sysctl: str) -> None:
    snap = egress()
    container(snap, "sb-egress-proxy")["HostConfig"]["Sysctls"][sysctl] = "1"
    only(verdict(snap), "sb-egress-proxy", sysctl, "'1'")


def test_proxy_forwarding_unset_fails() -> None:
    snap = egress()
    container(snap, "sb-egress-proxy")["HostConfig"]["Sysctls"] = None
    assert len(verdict(snap)) == 2


@pytest.mark.parametrize("version", ["27.5.1", "", "unknown"])
def test_old_or_unknown_engine_fails(version: str) -> None:
    snap = egress()
    snap["engine_version"] = version
    only(verdict(snap), "engine", "older than 28")


def test_agent_with_a_network_in_no_network_mode_fails() -> None:
    snap = none()
    container(snap, "main")["HostConfig"]["NetworkMode"] = "bridge"
    only(verdict(snap, "none"), "NetworkMode is 'bridge'", "expected 'none'")


def test_agent_without_network_in_egress_mode_fails() -> None:
    snap = egress()
    agent = container(snap, "main")
    agent["HostConfig"]["NetworkMode"] = "none"
    failures = verdict(snap)
    assert any("expected exactly one internal network" in f for f in failures), failures


def test_agent_in_host_network_mode_fails() -> None:
    snap = egress()
    agent = container(snap, "main")
    agent["HostConfig"]["NetworkMode"] = "host"
    agent["NetworkSettings"]["Networks"] = {"host": {"NetworkID": "h0st"}}
    snap["networks"].append({"Name": "host", "Id": "h0st", "Driver": "host", "IPAM": {"Config": []}})
    failures = verdict(snap)
    assert any("driver is 'host'" in f for f in failures), failures
    assert any("not Internal" in f for f in failures), failures


def test_unexpected_container_in_the_project_fails() -> None:
    snap = egress()
    sidecar = copy.deepcopy(container(snap, "main"))
    sidecar["Id"] = "f" * 64
    sidecar["Name"] = "/task_002__fixtureegress-db-1"
    sidecar["Config"]["Labels"]["com.docker.compose.service"] = "db"
    sidecar["NetworkSettings"]["Networks"] = {}
    snap["containers"].append(sidecar)
    only(verdict(snap), "db", "unexpected container")


def test_foreign_member_on_the_internal_network_fails() -> None:
    snap = egress()
    network(snap, INTERNAL)["Containers"]["e" * 64] = {"Name": "intruder", "IPv4Address": "172.19.0.9/16"}
    only(verdict(snap), INTERNAL, "unexpected member intruder")


def test_proxy_on_a_third_network_fails() -> None:
    snap = egress()
    container(snap, "sb-egress-proxy")["NetworkSettings"]["Networks"]["bridge"] = {"NetworkID": "b"}
    only(verdict(snap), "sb-egress-proxy", "joins 3 network(s)", "expected exactly 2")


def test_proxy_not_on_the_internal_network_fails() -> None:
    snap = egress()
    proxy = container(snap, "sb-egress-proxy")
    proxy["NetworkSettings"]["Networks"][INTERNAL]["NetworkID"] = "other"
    only(verdict(snap), "sb-egress-proxy", "not on the agent's internal network")


def test_docker_socket_mount_fails() -> None:
    snap = egress()
    container(snap, "main")["Mounts"].append(
        {"Type": "bind", "Source": "/var/run/docker.sock", "Destination": "/var/run/docker.sock", "RW": False}
    )
    only(verdict(snap), "main", "Docker socket")


@pytest.mark.parametrize("rw", [True, None])
def test_a_writable_bind_mount_fails_even_from_the_trial_directory(rw: bool | None) -> None:
    snap = none()
    mount: dict[str, Any] = {"Type": "bind", "Source": "/var/tmp/jobs/fixture/trial/artifacts"}
    mount |= {"Destination": "/logs/artifacts"} | ({"RW": rw} if rw is not None else {})
    container(snap, "main")["Mounts"].append(mount)
    failures = inspect_policy(
        snap["engine_version"], snap["containers"], snap["networks"], mode="none",
        mount_roots=["/var/tmp/jobs/fixture/trial"],
    )  # fmt: skip
    assert len(failures) == 1 and "is writable" in failures[0] and "/logs/artifacts" in failures[0], failures


def test_a_read_only_bind_mount_from_the_task_passes() -> None:
    snap = none()
    container(snap, "main")["Mounts"].append(
        {"Type": "bind", "Source": "/tasks/t/tests/grader.py", "Destination": "/tests/grader.py", "RW": False}
    )
    assert (
        inspect_policy(
            snap["engine_version"],
            snap["containers"],
            snap["networks"],
            mode="none",
            mount_roots=["/tasks/t"],
        )
        == []
    )


def test_missing_proxy_fails() -> None:
    snap = egress()
    snap["containers"] = [container(snap, "main")]
    network(snap, INTERNAL)["Containers"].pop(PROXY_ID)
    only(verdict(snap), "sb-egress-proxy: 0 containers")


def test_missing_agent_fails() -> None:
    snap = none()
    snap["containers"] = []
    only(verdict(snap, "none"), "main: 0 containers")


def test_proxy_in_no_network_mode_is_unexpected() -> None:
    snap = egress()
    failures = verdict(snap, "none")
    assert any("sb-egress-proxy" in f and "unexpected container" in f for f in failures), failures


# --- what is accepted --------------------------------------------------------


@pytest.mark.parametrize("drops", [["NET_ADMIN", "NET_RAW"], ["net_raw", "cap_net_admin"], ["ALL"]])
def test_cap_drop_spellings_are_accepted(drops: list[str]) -> None:
    snap = egress()
    container(snap, "main")["HostConfig"]["CapDrop"] = drops
    assert verdict(snap) == []


def test_empty_cap_add_list_is_accepted() -> None:
    snap = egress()
    container(snap, "main")["HostConfig"]["CapAdd"] = []
    assert verdict(snap) == []


def test_malformed_input_is_reported_not_raised() -> None:
    failures = inspect_policy("28.0.0", [{}], [{}], mode="isolated-allowlist")
    assert any("main: 0 containers" in f for f in failures)
    assert any("unexpected container" in f for f in failures)


@pytest.mark.parametrize(
    ("version", "major"), [("28.5.2+dfsg4", 28), ("29.0.0", 29), ("v28.1", 28), ("27", 27), ("x", None)]
)
def test_engine_major(version: str, major: int | None) -> None:
    assert engine_major(version) == major


# --- the record --------------------------------------------------------------


def test_policy_record_of_an_egress_trial() -> None:
    snap = egress()
    record = policy_record(
        Snapshot(snap["engine_version"], snap["containers"], snap["networks"]),
        mode="isolated-allowlist",
        session_id="task_002__fixtureegress",
        inference_domains=["api.openai.com", "gw"],
        gateway_authorities=["gw:4000"],
        proxy_image="img@sha256:" + "0" * 64,
    )
    assert record["policy"] == "isolated-bridge"
    assert record["container_id"] == AGENT_ID
    assert record["inference_domains"] == ["api.openai.com", "gw"]
    assert record["network_mode"] == "isolated-allowlist"
    assert record["internal_network"] == INTERNAL
    assert record["host_gateway"] is None
    assert record["proxy_forwarding"] is False
    json.dumps(record)


def test_policy_record_of_a_no_network_trial() -> None:
    snap = none()
    record = policy_record(
        Snapshot(snap["engine_version"], snap["containers"], snap["networks"]),
        mode="none",
        session_id="s",
        inference_domains=[],
        gateway_authorities=[],
        proxy_image=None,
    )
    assert record["network_mode"] == "none"
    assert record["internal_network"] is None
    assert record["container_id"] == snap["containers"][0]["Id"]


@pytest.mark.parametrize("service", ["main", "sb-egress-proxy"])
@pytest.mark.parametrize("value", [None, 0, -1, 4097])
def test_unbounded_or_too_high_pids_limit_fails(service: str, value: int | None) -> None:
    # A fork bomb in one trial must not exhaust the host's pids for all trials.
    snap = egress()
    host = container(snap, service)["HostConfig"]
    if value is None:
        del host["PidsLimit"]
    else:
        host["PidsLimit"] = value
    only(verdict(snap), service, "PidsLimit")


UNBOUNDED_LOGS = [
    {"Type": "json-file", "Config": {}},
    {"Type": "json-file", "Config": {"max-size": "100g"}},
    {"Type": "journald", "Config": {}},
]


@pytest.mark.parametrize("service", ["main", "sb-egress-proxy"])
def test_unbounded_container_logs_fail(service: str) -> None:
    # PID 1's stdout, which any process of the container may write, is a file on the host's disk
    # outside the writable layer the disk watch measures.
    for log_config in [None, *UNBOUNDED_LOGS]:
        snap = egress()
        container(snap, service)["HostConfig"]["LogConfig"] = log_config
        only(verdict(snap), service, "LogConfig")


def test_pids_limit_within_a_lower_bound_passes() -> None:
    snap = egress()
    for service in ("main", "sb-egress-proxy"):
        container(snap, service)["HostConfig"]["PidsLimit"] = 256
    assert verdict(snap) == []
