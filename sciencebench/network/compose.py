"""The compose override that puts a trial's containers under the policy (pure).

Pier composes `main` from its own files; this override (`policy_compose`,
whose docstring gives each mode) comes last: `main` gets `network_mode:
none`, or joins only an internal bridge with no route out but the proxy.
Every service drops NET_ADMIN and NET_RAW and is not privileged, and `main`
stops with SIGKILL: Pier runs `sh -c "sleep infinity"` as PID 1, which
ignores SIGTERM, so `compose down` would otherwise wait out the 10 s grace
period on every trial. A build for the trial gets `network: none`
(`build_network_problems` checks the rendered model for it).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sciencebench.core.capacity import DEFAULT_MEMORY_MB
from sciencebench.core.compose_policy import POLICY_LOGGING
from sciencebench.core.errors import PolicyRefused
from sciencebench.core.settings import DEFAULT_PIDS_LIMIT, MAX_PIDS_LIMIT, MIN_PIDS_LIMIT
from sciencebench.dockerhost.labels import MANAGED_LABEL, OWNER_LABEL
from sciencebench.network.squid import PROXY_PORT, SQUID_AUTH_FILE, SQUID_CONF_PATH

Mode = Literal["none", "isolated-allowlist"]

AGENT_SERVICE = "main"
PROXY_SERVICE = "sb-egress-proxy"
INTERNAL_NETWORK = "sb-internal"
EGRESS_NETWORK = "sb-egress"
DROPPED_CAPS = ("NET_ADMIN", "NET_RAW")
GATEWAY_MODE_OPTION = "com.docker.network.bridge.gateway_mode_ipv4"
FORWARDING_SYSCTLS = {"net.ipv4.ip_forward": "0", "net.ipv6.conf.all.forwarding": "0"}
NO_BUILD_NETWORK = {"network": "none"}
ROLE_LABEL = MANAGED_LABEL  # also what a worker's leftover sweep looks for


@dataclass(frozen=True)
class ProxyFiles:
    """Where the proxy's image and host-side configuration files are."""

    image: str
    squid_conf: str
    passwd: str
    # (name, address): the proxy's hosts file resolves each pinned gateway name to its checked address
    hosts: tuple[tuple[str, str], ...] = ()


def pids_limit_of(value: object) -> int:
    """The pids limit a `pids_limit` keyword names (None: the default); PolicyRefused for a bad one.

    Pier hands `--ek` values over JSON-decoded when they parse: an int, or
    the string of one. The bounds are `Settings.pids_limit`'s.
    """
    if value is None:
        return DEFAULT_PIDS_LIMIT
    try:
        limit = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        limit = None
    if limit is None or not MIN_PIDS_LIMIT <= limit <= MAX_PIDS_LIMIT:
        raise PolicyRefused(
            f"pids_limit {value!r} is not a number of processes in {MIN_PIDS_LIMIT}..{MAX_PIDS_LIMIT}"
        )
    return limit


def _literal(value: str) -> str:
    # Compose interpolates `$` in every string; host paths must stay literal.
    return value.replace("$", "$$")


def _hardening(role: str, owner: str, pids_limit: int, memory_mb: int) -> dict[str, Any]:
    labels = {ROLE_LABEL: role} | ({OWNER_LABEL: owner} if owner else {})
    memory = f"{memory_mb}M"
    return {
        "cap_drop": list(DROPPED_CAPS),
        "privileged": False,
        # Both spellings, equal: compose refuses distinct values, and a task with cpus or memory gets
        # Pier's `deploy.resources.limits`, where an unset pids differs from `pids_limit`.
        "pids_limit": pids_limit,
        # The memory Pier writes for a task that names it (the same spelling), and the capacity
        # code's default for one that does not; swap no further than that.
        "deploy": {"resources": {"limits": {"pids": pids_limit, "memory": memory}}},
        "memswap_limit": memory,
        "stop_signal": "SIGKILL",
        "logging": copy.deepcopy(POLICY_LOGGING),  # bounded output on the host's disk
        "labels": labels,
    }


def policy_compose(
    mode: Mode,
    proxy: ProxyFiles | None = None,
    owner: str = "",
    *,
    offline_build: bool = False,
    pids_limit: int = DEFAULT_PIDS_LIMIT,
    memory_mb: int | None = None,
    main_image: str | None = None,
) -> dict[str, Any]:
    """The compose override for `mode`; `proxy` is required exactly in egress mode.

    `owner` (the worker's `dockerhost.owner_id`) labels every container so
    that only the worker host state that started a trial sweeps its leftovers.
    `offline_build`: `main` is built for this trial, with no network.
    `pids_limit` bounds the processes of `main` and the proxy (it comes last
    in the merge, so a task's own `pids_limit` on `main` does not win).
    `memory_mb` (the task's; None: `DEFAULT_MEMORY_MB`, what the capacity
    code counts such a trial to hold) is the memory limit of `main` and the
    proxy, with no swap beyond it. `main_image`: the name `main` runs its
    image by, where the task's own compose file names one the worker pulled
    through a registry mirror (`core.mirrors`: the same digest).

    Raises ValueError when `proxy` and `mode` disagree (a programming error,
    not a policy decision).

    - `none` mode (no inference egress: nop, oracle, verifiers): `main` gets
      `network_mode: none`;
    - `isolated-allowlist` mode: `main` joins only `sb-internal`, an internal
      bridge with IPv6 off whose IPv4 gateway mode is `isolated` (the bridge
      gets no address, so there is no route to the host either); the proxy
      service joins `sb-internal` and `sb-egress` with IPv4/IPv6 forwarding off.

    When `main` is built for the trial (a Dockerfile-only task, a task's own
    `build:`, a verifier without an image, Pier's derived agent build), the
    override gives the build `network: none`; it adds `build` to nothing else,
    since a `build` key would turn a service that only names its image into a
    built one.
    """
    memory = memory_mb or DEFAULT_MEMORY_MB
    main: dict[str, Any] = _hardening("agent", owner, pids_limit, memory)
    if offline_build:
        main["build"] = dict(NO_BUILD_NETWORK)
    if main_image:
        main["image"] = _literal(main_image)
    if mode == "none":
        if proxy is not None:
            raise ValueError("network_mode none takes no proxy")
        main["network_mode"] = "none"
        return {"services": {AGENT_SERVICE: main}}
    if proxy is None:
        raise ValueError("isolated-allowlist mode needs the proxy files")

    main["networks"] = [INTERNAL_NETWORK]
    main["depends_on"] = {PROXY_SERVICE: {"condition": "service_healthy"}}
    proxy_service: dict[str, Any] = {
        **_hardening("proxy", owner, pids_limit, memory),
        "image": _literal(proxy.image),
        # The image is pinned and distributed ahead of time; never build it here.
        "pull_policy": "missing",
        "command": ["squid", "-N", "-d", "1", "-f", SQUID_CONF_PATH],
        "volumes": [
            {
                "type": "bind",
                "source": _literal(proxy.squid_conf),
                "target": SQUID_CONF_PATH,
                "read_only": True,
            },
            {"type": "bind", "source": _literal(proxy.passwd), "target": SQUID_AUTH_FILE, "read_only": True},
        ],
        "networks": [INTERNAL_NETWORK, EGRESS_NETWORK],
        **({"extra_hosts": [f"{name}:{address}" for name, address in proxy.hosts]} if proxy.hosts else {}),
        "sysctls": dict(FORWARDING_SYSCTLS),
        "security_opt": ["no-new-privileges:true"],
        "healthcheck": {
            "test": ["CMD", "bash", "-c", f"</dev/tcp/127.0.0.1/{PROXY_PORT}"],
            "interval": "1s",
            "timeout": "1s",
            "retries": 30,
        },
    }
    return {
        "services": {AGENT_SERVICE: main, PROXY_SERVICE: proxy_service},
        "networks": {
            INTERNAL_NETWORK: {
                "driver": "bridge",
                "internal": True,
                "enable_ipv6": False,
                "driver_opts": {GATEWAY_MODE_OPTION: "isolated"},
            },
            EGRESS_NETWORK: {"driver": "bridge", "enable_ipv6": False},
        },
    }


def build_network_problems(model: Mapping[str, Any]) -> list[str]:
    """Every build of a rendered compose model that would run with a network, or that builds the proxy.

    `model` is what `docker compose config --format json` printed. Each
    `build` must have `network: none`; only `main` may be built (the proxy
    image is pinned, never built).
    """
    services = model.get("services")
    problems: list[str] = []
    for name, service in services.items() if isinstance(services, Mapping) else ():
        build = service.get("build") if isinstance(service, Mapping) else None
        if build is None:
            continue
        if name != AGENT_SERVICE:
            problems.append(f"service {name}: built for the trial (only {AGENT_SERVICE!r} may be built)")
        if not isinstance(build, Mapping):
            problems.append(f"service {name}: build is not a mapping")
            continue
        network = build.get("network")
        if network != "none":
            problems.append(
                f"service {name}: build network {network or 'default'!r} (every build runs with network none)"
            )
    return problems
