"""Inspection of a started trial: the verdict is a pure function of `docker inspect` JSON.

`collect_snapshot` is the only part that talks to Docker (through the SDK,
so `DOCKER_HOST` is honoured); `inspect_policy` turns what it collected into
a list of failed checks, empty when the trial may proceed; `policy_record`
is what the trial directory keeps as `network-policy-<session>.json`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import docker

from sciencebench.core.capacity import DEFAULT_MEMORY_MB
from sciencebench.core.compose_policy import POLICY_LOGGING
from sciencebench.core.harness import POLICY_NAME
from sciencebench.core.settings import DEFAULT_PIDS_LIMIT
from sciencebench.core.versions import parse_version
from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL as PROJECT_LABEL
from sciencebench.dockerhost.labels import COMPOSE_SERVICE_LABEL as SERVICE_LABEL
from sciencebench.network.compose import (
    AGENT_SERVICE,
    DROPPED_CAPS,
    FORWARDING_SYSCTLS,
    GATEWAY_MODE_OPTION,
    PROXY_SERVICE,
    Mode,
)

MIN_ENGINE_MAJOR = 28
INSPECT_TIMEOUT_SEC = 15.0

Json = Mapping[str, Any]


@dataclass(frozen=True)
class Snapshot:
    """What Docker says about one compose project, as `docker inspect` JSON."""

    engine_version: str
    containers: list[dict[str, Any]]
    networks: list[dict[str, Any]]


def collect_snapshot(project: str, timeout_sec: float = INSPECT_TIMEOUT_SEC) -> Snapshot:
    """Inspect every container of compose `project` and every network they join.

    Raises docker.errors.DockerException (or requests' errors beneath it) when
    the Engine cannot be reached or answers with an error within `timeout_sec`
    per request.
    """
    client = docker.from_env(timeout=max(1, int(timeout_sec)))
    try:
        engine_version = str(client.version().get("Version", ""))
        containers = [
            dict(c.attrs)
            for c in client.containers.list(all=True, filters={"label": f"{PROJECT_LABEL}={project}"})
        ]
        network_ids = sorted(
            {
                str(endpoint.get("NetworkID"))
                for c in containers
                for endpoint in ((c.get("NetworkSettings") or {}).get("Networks") or {}).values()
                if endpoint.get("NetworkID")
            }
        )
        networks = [dict(client.api.inspect_network(net_id)) for net_id in network_ids]
    finally:
        client.close()
    return Snapshot(engine_version=engine_version, containers=containers, networks=networks)


def engine_major(version: str) -> int | None:
    """The major version of an Engine version string (`28.5.2+dfsg4` -> 28), or None."""
    parsed = parse_version(version)
    return parsed[0] if parsed else None


def _name(container: Json) -> str:
    labels = (container.get("Config") or {}).get("Labels") or {}
    service = labels.get(SERVICE_LABEL)
    name = str(container.get("Name") or container.get("Id", "?")[:12]).lstrip("/")
    return f"{service} ({name})" if service else name


def _caps(values: Sequence[str] | None) -> set[str]:
    return {v.upper().removeprefix("CAP_") for v in values or []}


def _container_checks(container: Json, mount_roots: Sequence[str] | None) -> list[str]:
    """Checks every container must pass, whatever its role.

    No added capability, NET_ADMIN and NET_RAW dropped, not privileged, no
    host devices, no host pid/ipc/uts/user namespace, seccomp and
    AppArmor confined, SELinux labels on, every bind mount read-only (a
    missing `RW` counts as writable), and every bind mount's source inside
    one of `mount_roots` (Pier's trial directory, the task directory); with
    `mount_roots` None, no bind mount may touch the Docker socket.
    """
    name = _name(container)
    host = container.get("HostConfig") or {}
    failures: list[str] = []
    dropped = _caps(host.get("CapDrop"))
    for cap in DROPPED_CAPS:
        if cap not in dropped and "ALL" not in dropped:
            failures.append(f"{name}: {cap} not in HostConfig.CapDrop")
    if host.get("Privileged"):
        failures.append(f"{name}: Privileged is true")
    if host.get("CapAdd"):
        failures.append(f"{name}: CapAdd is {sorted(host['CapAdd'])}, expected none")
    if host.get("Devices") or host.get("DeviceCgroupRules"):
        failures.append(f"{name}: has host devices")
    # (CgroupnsMode is "host" by default on cgroup v1 hosts: not checked.)
    for key in ("PidMode", "IpcMode", "UTSMode", "UsernsMode"):
        if str(host.get(key) or "").lower() == "host":
            failures.append(f"{name}: {key} is host")
    for option in host.get("SecurityOpt") or []:
        text = str(option).lower().replace("=", ":")
        if "unconfined" in text or text.startswith("label:disable"):
            failures.append(f"{name}: SecurityOpt {option!r}")
    for mount in container.get("Mounts") or []:
        source = str(mount.get("Source", ""))
        if any(str(mount.get(key, "")).endswith("docker.sock") for key in ("Source", "Destination")):
            failures.append(f"{name}: mounts the Docker socket ({mount.get('Destination')})")
        elif mount_roots is not None and mount.get("Type") == "bind" and not _within(source, mount_roots):
            failures.append(f"{name}: bind mount of {source!r} outside the trial and task directories")
        if mount.get("Type") == "bind" and mount.get("RW") is not False:
            failures.append(
                f"{name}: bind mount of {source!r} at {mount.get('Destination')!r} is writable "
                "(a container writes no host directory)"
            )
    return failures


def _log_checks(container: Json) -> list[str]:
    """The container's output is kept as the policy says (`POLICY_LOGGING`): bounded on the host's disk."""
    config = (container.get("HostConfig") or {}).get("LogConfig") or {}
    kept = {"driver": config.get("Type"), "options": dict(config.get("Config") or {})}
    if kept != POLICY_LOGGING:
        return [f"{_name(container)}: HostConfig.LogConfig is {kept!r}, expected {POLICY_LOGGING!r}"]
    return []


def _pids_checks(container: Json, pids_limit: int) -> list[str]:
    """A missing, 0 or negative PidsLimit is unlimited; above `pids_limit` is too high."""
    value = (container.get("HostConfig") or {}).get("PidsLimit")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return [f"{_name(container)}: HostConfig.PidsLimit is {value!r} (unlimited)"]
    if value > pids_limit:
        return [f"{_name(container)}: HostConfig.PidsLimit {value} is above {pids_limit}"]
    return []


def _cpu_checks(container: Json, cpus: int | None) -> list[str]:
    """The task's cpus are the agent's limit (NanoCpus, no quota beside it); none required when unset.

    Pier writes them into compose (`deploy.resources.limits`); a task's own
    compose file could set others, and compose merges them: what the Engine
    applied is what counts.
    """
    host = container.get("HostConfig") or {}
    nano = host.get("NanoCpus")
    quota = host.get("CpuQuota") or host.get("CpuPeriod")
    if cpus is None or (nano == cpus * 1_000_000_000 and not quota):
        return []
    return [
        f"{_name(container)}: HostConfig.NanoCpus is {nano!r} (quota {host.get('CpuQuota')!r}), "
        f"expected the task's {cpus} cpus"
    ]


def _memory_checks(container: Json, memory_mb: int) -> list[str]:
    """The container's memory limit is `memory_mb` and its memory plus swap no more (no swap beyond it)."""
    name = _name(container)
    host = container.get("HostConfig") or {}
    memory, swap = host.get("Memory"), host.get("MemorySwap")
    failures: list[str] = []
    if memory != memory_mb << 20:
        failures.append(f"{name}: HostConfig.Memory is {memory!r}, expected {memory_mb} MB")
    if isinstance(swap, int) and swap < 0:
        failures.append(f"{name}: HostConfig.MemorySwap is {swap} (unlimited swap)")
    elif swap != memory_mb << 20:
        failures.append(f"{name}: HostConfig.MemorySwap is {swap!r}, expected {memory_mb} MB (no swap)")
    return failures


def _within(source: str, roots: Sequence[str]) -> bool:
    """Whether a bind source lies under a root, as written and with symlinks followed on this host.

    The Engine runs on this host, so a symlink it would follow here (one
    swapped in after the task was checked) is followed here too.
    """
    path = PurePosixPath(source)
    if ".." in path.parts:
        return False
    real = PurePosixPath(os.path.realpath(source))
    return any(path.is_relative_to(PurePosixPath(root)) for root in roots) and any(
        real.is_relative_to(PurePosixPath(os.path.realpath(root))) for root in roots
    )


def _endpoints(container: Json) -> dict[str, Json]:
    return dict((container.get("NetworkSettings") or {}).get("Networks") or {})


def _find_network(networks: Sequence[Json], key: str, endpoint: Json) -> Json | None:
    wanted = endpoint.get("NetworkID")
    for network in networks:
        if (wanted and network.get("Id") == wanted) or (not wanted and network.get("Name") == key):
            return network
    return None


def _internal_network_checks(network: Json, label: str) -> list[str]:
    failures: list[str] = []
    if network.get("Driver") != "bridge":
        failures.append(f"{label}: driver is {network.get('Driver')!r}, expected 'bridge'")
    if network.get("Internal") is not True:
        failures.append(f"{label}: not Internal")
    if network.get("EnableIPv6") is not False:
        failures.append(f"{label}: EnableIPv6 is {network.get('EnableIPv6')!r}, expected false")
    mode = (network.get("Options") or {}).get(GATEWAY_MODE_OPTION)
    if mode != "isolated":
        failures.append(f"{label}: {GATEWAY_MODE_OPTION} is {mode!r}, expected 'isolated'")
    configs = (network.get("IPAM") or {}).get("Config") or []
    if not configs:
        failures.append(f"{label}: no IPAM config")
    gateways = [c["Gateway"] for c in configs if c.get("Gateway")]
    if gateways:
        failures.append(f"{label}: has a host gateway {gateways}")
    return failures


def inspect_policy(
    engine_version: str,
    containers: Sequence[Json],
    networks: Sequence[Json],
    *,
    mode: Mode,
    agent_service: str = AGENT_SERVICE,
    proxy_service: str = PROXY_SERVICE,
    mount_roots: Sequence[str] | None = None,
    pids_limit: int = DEFAULT_PIDS_LIMIT,
    cpus: int | None = None,
    memory_mb: int | None = None,
) -> list[str]:
    """Every check the started trial fails; an empty list means it complies.

    `containers` are `docker inspect` objects of all containers of the trial's
    compose project (identified by their compose service label), `networks`
    the `docker network inspect` objects of every network they join. `mode`
    is what the environment configured: `none` (the agent has no network at
    all) or `isolated-allowlist` (agent on one internal isolated bridge shared
    only with the proxy). `mount_roots` are the host directories bind mounts
    may come from (the trial's and the task's). The agent and the proxy must
    have a `HostConfig.PidsLimit` in 1..`pids_limit` and bounded logs
    (`POLICY_LOGGING`) and `memory_mb` (the task's; None: `DEFAULT_MEMORY_MB`)
    as their memory limit with no swap beyond it; the agent has the task's
    `cpus` as its limit when the task sets them. Never raises
    on malformed input: a missing field is a failed check.
    """
    failures: list[str] = []
    major = engine_major(engine_version)
    if major is None or major < MIN_ENGINE_MAJOR:
        failures.append(f"engine: version {engine_version!r} is older than {MIN_ENGINE_MAJOR}")

    by_service: dict[str, list[Json]] = {}
    for container in containers:
        labels = (container.get("Config") or {}).get("Labels") or {}
        by_service.setdefault(str(labels.get(SERVICE_LABEL, "")), []).append(container)
        failures.extend(_container_checks(container, mount_roots))
        if labels.get(SERVICE_LABEL) in (agent_service, proxy_service):
            failures.extend(_pids_checks(container, pids_limit))
            failures.extend(_log_checks(container))
            failures.extend(_memory_checks(container, memory_mb or DEFAULT_MEMORY_MB))

    expected = {agent_service} | ({proxy_service} if mode == "isolated-allowlist" else set())
    for service, members in sorted(by_service.items()):
        if service not in expected:
            failures.extend(f"{_name(c)}: unexpected container in the trial" for c in members)
    for service in sorted(expected):
        count = len(by_service.get(service, []))
        if count != 1:
            failures.append(f"{service}: {count} containers, expected exactly 1")
    agents = by_service.get(agent_service, [])
    proxies = by_service.get(proxy_service, [])
    if len(agents) != 1:
        return failures
    agent = agents[0]
    failures.extend(_cpu_checks(agent, cpus))
    agent_mode = (agent.get("HostConfig") or {}).get("NetworkMode")

    if mode == "none":
        if agent_mode != "none":
            failures.append(f"{_name(agent)}: NetworkMode is {agent_mode!r}, expected 'none'")
        return failures

    endpoints = _endpoints(agent)
    if agent_mode == "none" or len(endpoints) != 1:
        failures.append(
            f"{_name(agent)}: joins {len(endpoints)} network(s) {sorted(endpoints)} with "
            f"NetworkMode {agent_mode!r}, expected exactly one internal network"
        )
        return failures
    ((key, endpoint),) = endpoints.items()
    internal = _find_network(networks, key, endpoint)
    if internal is None:
        failures.append(f"network {key}: not inspected")
        return failures
    failures.extend(_internal_network_checks(internal, f"network {key}"))

    proxy = proxies[0] if len(proxies) == 1 else None
    allowed_members = {agent.get("Id")} | ({proxy.get("Id")} if proxy else set())
    for member_id, member in sorted((internal.get("Containers") or {}).items()):
        if member_id not in allowed_members:
            failures.append(f"network {key}: unexpected member {member.get('Name', member_id)}")

    if proxy is None:
        return failures
    proxy_endpoints = _endpoints(proxy)
    if len(proxy_endpoints) != 2:
        failures.append(
            f"{_name(proxy)}: joins {len(proxy_endpoints)} network(s) "
            f"{sorted(proxy_endpoints)}, expected exactly 2"
        )
    if not any(e.get("NetworkID") == internal.get("Id") for e in proxy_endpoints.values()):
        failures.append(f"{_name(proxy)}: not on the agent's internal network {key}")
    sysctls = (proxy.get("HostConfig") or {}).get("Sysctls") or {}
    for sysctl, value in FORWARDING_SYSCTLS.items():
        if sysctls.get(sysctl) != value:
            failures.append(f"{_name(proxy)}: sysctl {sysctl} is {sysctls.get(sysctl)!r}, expected {value!r}")
    return failures


def policy_record(
    snapshot: Snapshot,
    *,
    mode: Mode,
    session_id: str,
    inference_domains: Sequence[str],
    gateway_authorities: Sequence[str],
    proxy_image: str | None,
    agent_service: str = AGENT_SERVICE,
) -> dict[str, Any]:
    """The `network-policy-<session>.json` document of a trial that passed inspection.

    `host_gateway` is null and `proxy_forwarding` false because inspection
    just proved both; `internal_network` is null in `none` mode.
    """
    agent = next(
        c
        for c in snapshot.containers
        if ((c.get("Config") or {}).get("Labels") or {}).get(SERVICE_LABEL) == agent_service
    )
    internal = sorted(_endpoints(agent)) if mode == "isolated-allowlist" else []
    return {
        "policy": POLICY_NAME,
        "session_id": session_id,
        "container_id": agent.get("Id"),
        "inference_domains": list(inference_domains),
        "gateway_authorities": list(gateway_authorities),
        "network_mode": mode,
        "internal_network": internal[0] if internal else None,
        "host_gateway": None,
        "proxy_forwarding": False,
        "proxy_image": proxy_image,
        "engine_version": snapshot.engine_version,
    }
