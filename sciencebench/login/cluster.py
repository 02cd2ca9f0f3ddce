"""What the hosts that would run a job bring, and whether that is enough: checked at submit and dry run alike.

A job needs of its hosts what its agent and selection ask: the inference
proxy for a model agent, Pier's online agent install where a task has no
baked agent image, roots serving its jobs directory, selection and env file,
and an operator who allows its gateways. A worker reports what it brings at
start (`HostKit`: `--agent-install`, the proxy image, roots, `--gateway`);
with a broker, the hosts are the live ones in the store; with `--local`,
this host as its settings say. A job no host could run is refused here, in
one line naming the way out, instead of failing on every worker.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from sciencebench.coordination.protocol import Coordinator, HostKit, HostStatus
from sciencebench.core.capacity import NOTHING, Request, fits
from sciencebench.core.errors import ProfileError
from sciencebench.core.gateways import Gateway, allowed_by, parse_gateway, refusal_reason
from sciencebench.core.settings import Settings

# Agents that call no model: their trials run with no egress, so no proxy.
MODEL_FREE_AGENTS = frozenset({"nop", "oracle"})
# A host counts as live when it beat within this many lease periods (its keeper beats every quarter).
LIVE_LEASES = 2.0


def is_live(status: HostStatus, now: float, lease_seconds: float) -> bool:
    """Whether a host beat within two lease periods (`LIVE_LEASES`) of `now` (the store's clock)."""
    return now - status.seen_at < LIVE_LEASES * lease_seconds


@dataclass(frozen=True)
class Cluster:
    """The hosts a job would run on, each with what it reported (`where`: how they were found)."""

    kits: dict[str, HostKit]
    where: str
    local: bool = False
    # Live hosts that reported no kit (a worker older than this submit): they count as bringing nothing.
    silent: frozenset[str] = frozenset()
    # False for a dry run that found no broker: the hosts are unknown, so nothing is checked against them.
    known: bool = True

    @classmethod
    def this_host(cls, settings: Settings) -> Cluster:
        """`--local`: this host, as its settings say (it serves every path, as its user can read them)."""
        capacity = settings.capacity
        kit = HostKit(
            cpus=capacity.cpus,
            memory_mb=capacity.memory_mb,
            agent_install=settings.agent_install,
            proxy_image=settings.proxy_image,
            gateways=tuple(gateway.origin for gateway in settings.gateways),
        )
        return cls(kits={"this host": kit}, where="this host", local=True)

    @classmethod
    def unknown(cls, why: str) -> Cluster:
        """A dry run's hosts when no broker answers (`why`): none known, so none checked."""
        return cls(kits={}, where=why, known=False)

    @classmethod
    def live(cls, coord: Coordinator, lease_seconds: float) -> Cluster:
        """The live worker hosts in the store (beat within two leases), with the kit each reported."""
        now = coord.now()
        live = {host: status for host, status in coord.hosts().items() if is_live(status, now, lease_seconds)}
        kits = {host: status.kit or HostKit() for host, status in live.items()}
        silent = frozenset(host for host, status in live.items() if status.kit is None)
        return cls(kits=kits, where="live worker hosts", silent=silent)


@dataclass(frozen=True)
class Needs:
    """What a job asks of the hosts that run it."""

    proxy: bool  # a model agent: the inference proxy image
    online_install: str | None  # the harness Pier must install where no baked image exists, or None
    paths: tuple[tuple[str, Path, str], ...] = ()  # (option, path, the HostKit roots field serving it)
    gateways: tuple[Gateway, ...] = ()  # where its harness sends inference: a host's operator allows each
    requests: tuple[tuple[str, Request], ...] = ()  # (task id, what a trial of it holds: `core.capacity`)


def check_cluster(cluster: Cluster, needs: Needs, missing_baked: Callable[[], str]) -> None:
    """Refuse (ProfileError, exit 2) a job that none of the cluster's hosts can run; one line naming the fix.

    Hosts are narrowed requirement by requirement (roots, gateways, proxy,
    online install); the first requirement that leaves none is the one named.
    `missing_baked` says which tasks lack a baked image and how to bake them.
    A broker with no live host at all refuses only what needs something of
    the hosts (a job of nop trials waits for hosts to come).
    """
    if not cluster.known:
        return
    kits = dict(cluster.kits)
    if not cluster.local and not kits:
        if needs.proxy or needs.online_install:
            wanted = "the inference proxy image" if needs.proxy else "online agent installs"
            raise ProfileError(
                f"no live worker host: this job needs one with {wanted}; start the workers, then submit"
            )
        return
    _check_capacity(cluster, needs, kits)
    for option, path, field in needs.paths:
        if cluster.local:
            break
        serving = {host: kit for host, kit in kits.items() if _serves(getattr(kit, field), path)}
        if not serving:
            roots = sorted({root for kit in kits.values() for root in getattr(kit, field)})
            shown = ", ".join(roots[:4]) or "none reported"
            if cluster.silent:
                shown += f"; {len(cluster.silent)} host(s) reported nothing: a worker older than this submit"
            raise ProfileError(
                f"{option} {path}: no live worker host serves it (their {_ROOT_OPTIONS[field]}: {shown}); "
                f"put it under one, or start a worker with {_ROOT_OPTIONS[field]} covering it"
            )
        kits = serving
    for gateway in needs.gateways:
        allowing = {host: kit for host, kit in kits.items() if _allows(kit, gateway)}
        if not allowing:
            raise ProfileError(_gateway_refusal(gateway, kits, cluster.local))
        kits = allowing
    if needs.proxy:
        kits = {host: kit for host, kit in kits.items() if kit.proxy_image}
        if not kits:
            raise ProfileError(proxy_refusal(cluster.local))
    if needs.online_install and not any(kit.agent_install == "online" for kit in kits.values()):
        if cluster.local:
            raise ProfileError(
                f"{missing_baked()}, and this host does not install agents online "
                "(SCIENCEBENCH_AGENT_INSTALL=baked); bake them, or unset it on a host with internet"
            )
        raise ProfileError(
            f"{missing_baked()}, and no live worker host installs agents online; bake them, or run a "
            "worker that does (`sciencebench worker --agent-install online`, a host with internet)"
        )


def _check_capacity(cluster: Cluster, needs: Needs, kits: dict[str, HostKit]) -> None:
    """Refuse a task whose trials no host's whole capacity could hold (hosts that said none: not judged)."""
    capacities = {host: capacity for host, kit in kits.items() if (capacity := kit.capacity) is not None}
    if not capacities:
        return
    largest = max(capacities, key=lambda host: (capacities[host].cpus, capacities[host].memory_mb, host))
    for task_id, request in needs.requests:
        if not any(fits(NOTHING, request, capacity) for capacity in capacities.values()):
            where = "this host's capacity" if cluster.local else f"the largest live host, {largest}, has"
            raise ProfileError(
                f"task {task_id} asks {request} per trial; {where} {capacities[largest]} "
                "(worker --cpus, --memory)"
            )


def proxy_refusal(local: bool) -> str:
    """The one sentence refusing a model agent where no host has the inference proxy image."""
    if local:
        return (
            "this job's model agent runs behind the inference proxy, but this host has no proxy image: "
            "set SCIENCEBENCH_PROXY_IMAGE to the digest-pinned image compose/build.yml builds"
        )
    return (
        "this job's model agent runs behind the inference proxy, but no live worker host has its image: "
        "set SCIENCEBENCH_PROXY_IMAGE (the digest-pinned image compose/build.yml builds) on the worker "
        "hosts and restart them"
    )


def _allows(kit: HostKit, gateway: Gateway) -> bool:
    """Whether a host's operator allows `gateway` (an entry this version cannot read allows nothing)."""
    listed: list[Gateway] = []
    for url in kit.gateways:
        with suppress(ProfileError):
            listed.append(parse_gateway(url, "--gateway"))
    if kit.gateways and not listed:
        return False
    return allowed_by(gateway, listed)


def _gateway_refusal(gateway: Gateway, kits: dict[str, HostKit], local: bool) -> str:
    """The one line refusing a gateway the hosts do not allow, naming how their operator allows it."""
    listed = sorted({url for kit in kits.values() for url in kit.gateways})
    why = refusal_reason(gateway, listed)
    if local:
        return (
            f"gateway {gateway.url}: {why}; this host reaches it only when you allow it: "
            f"`submit --local --gateway {gateway.origin}` (or SCIENCEBENCH_GATEWAYS)"
        )
    return (
        f"gateway {gateway.url}: {why}; no live worker host allows it: their operator allows it with "
        f"`sciencebench worker --gateway {gateway.origin}` (or SCIENCEBENCH_GATEWAYS) on the workers"
    )


_ROOT_OPTIONS = {
    "jobs_roots": "--jobs-root",
    "selection_roots": "--selection-root",
    "env_file_roots": "--env-file-root",
}


def _serves(roots: tuple[str, ...], path: Path) -> bool:
    """Whether `path` is one of `roots` or under one (as the worker's confinement decides, resolved)."""
    resolved = path.resolve()
    return any(resolved.is_relative_to(Path(root).resolve()) for root in roots)
