"""Commands of a worker or bake host: `worker`, `preflight`, `images bake`."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import click
from rich.table import Table

from sciencebench.cli.common import err, handle_errors, main, out, require_worker_extra
from sciencebench.core.errors import InputError
from sciencebench.core.gateways import parse_gateway_list
from sciencebench.core.harnesses import bakeable
from sciencebench.core.images import DEFAULT_PLATFORM
from sciencebench.core.mirrors import parse_mirrors
from sciencebench.core.paths import SelectionPaths
from sciencebench.core.settings import (
    AGENT_ARTIFACTS_ENV,
    DEFAULT_PIDS_LIMIT,
    MAX_PIDS_LIMIT,
    MIN_PIDS_LIMIT,
    Settings,
    pier_memory_problem,
)
from sciencebench.core.sizes import parse_size


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--concurrency", type=int, default=1, show_default=True,
              help="Trial slots of this host (parallel Pier processes): an upper bound; its capacity "
              "(--cpus, --memory) decides how many trials run at once.")  # fmt: skip
@click.option("--cpus", type=click.FloatRange(min=0, min_open=True), metavar="N",
              help="CPUs this host's running trials may ask for together (each its task's cpus) "
              "[env: SCIENCEBENCH_CPUS; default: the host's CPUs].")  # fmt: skip
@click.option("--memory", metavar="SIZE",
              help="Memory this host's running trials may ask for together (each its task's memory_mb), "
              "e.g. 120G [env: SCIENCEBENCH_MEMORY; default: the host's memory less 1 GiB].")  # fmt: skip
@click.option("--hostname", help="Worker name (default: celery's, from this host's name).")
@click.option("--queues", "-Q", help="Comma-separated queues to consume (default: celery).")
@click.option("--loglevel", default="INFO", show_default=True)
@click.option("--platform", default=DEFAULT_PLATFORM, show_default=True,
              help="Platform this host must run (checked at start).")  # fmt: skip
@click.option("--pier-bin", help="The Pier this worker runs for every trial [env: SCIENCEBENCH_PIER_BIN; "
              "default: pier].")  # fmt: skip
@click.option("--jobs-root", "jobs_roots", multiple=True, type=click.Path(path_type=Path),
              help="A jobs directory this worker serves; repeatable "
              "[env: SCIENCEBENCH_JOBS_ROOTS].")  # fmt: skip
@click.option("--selection-root", "selection_roots", multiple=True, type=click.Path(path_type=Path),
              help="A directory of selections this worker serves; repeatable "
              "[env: SCIENCEBENCH_SELECTION_ROOTS].")  # fmt: skip
@click.option("--env-file-root", "env_file_roots", multiple=True, type=click.Path(path_type=Path),
              help="A directory of env files this worker reads; repeatable "
              "[env: SCIENCEBENCH_ENV_FILE_ROOTS].")  # fmt: skip
@click.option("--image-budget", metavar="SIZE",
              help="Disk the task images this host pulls may take, e.g. 200G: least recently used "
              "images not in use are evicted before a pull would exceed it [env: SCIENCEBENCH_IMAGE_BUDGET; "
              "default: no budget].")  # fmt: skip
@click.option("--agent-install", type=click.Choice(["online", "baked"]),
              help="How this host gets agents: online, the worker installs the pinned harness with no "
              "network, from SCIENCEBENCH_AGENT_ARTIFACTS or fetched on the host (from "
              "SCIENCEBENCH_NPM_REGISTRY); baked, only baked agent images run "
              "[env: SCIENCEBENCH_AGENT_INSTALL; default: online].")  # fmt: skip
@click.option("--gateway", "gateways", multiple=True, metavar="URL",
              help="A model gateway this host's trials may reach (scheme, host and port; any path); "
              "repeatable. Without any, jobs may name any gateway but an internal address (loopback, "
              "private, link-local, ...); with some, only these [env: SCIENCEBENCH_GATEWAYS, comma- or "
              "space-separated].")  # fmt: skip
@click.option("--host-address", "host_addresses", multiple=True, metavar="IP",
              help="An address of the machine this worker's container runs on (a container sees only its "
              "own); a job's gateway there is refused like one on the worker's own addresses, unless "
              "listed with --gateway; repeatable [env: SCIENCEBENCH_HOST_ADDRESSES, comma- or "
              "space-separated].")  # fmt: skip
@click.option("--pids-limit", type=int, metavar="N",
              help="Processes each trial container may run (a fork bomb stops there) "
              f"[env: SCIENCEBENCH_PIDS_LIMIT; default: {DEFAULT_PIDS_LIMIT}; "
              f"{MIN_PIDS_LIMIT}..{MAX_PIDS_LIMIT}].")  # fmt: skip
@click.option("--disk-limit", metavar="SIZE",
              help="What each trial container may write to its writable layer, e.g. 20G: past it the "
              "trial ends with a ResourceLimitError; 0: not watched [env: SCIENCEBENCH_DISK_LIMIT; "
              "default: 20G].")  # fmt: skip
@click.option("--pier-memory", metavar="SIZE",
              help="Data each Pier process, and each docker CLI it runs, may take, e.g. 4G: Pier reads a "
              "trial's logs on this host; past it Pier stops and the trial ends with an OutputLimitError; "
              "at least 1G, 0: unbounded [env: SCIENCEBENCH_PIER_MEMORY; default: 4G].")  # fmt: skip
@click.option("--registry-mirror", "registry_mirrors", multiple=True, metavar="[UPSTREAM=]HOST:PORT",
              help="A pull-through cache (a registry in proxy mode) this host pulls the task images of "
              "UPSTREAM through, by the same digest (default UPSTREAM: docker.io); repeatable, one per "
              "upstream registry [env: SCIENCEBENCH_REGISTRY_MIRROR, comma- or space-separated]."
              )  # fmt: skip
@handle_errors
def worker(concurrency: int, cpus: float | None, memory: str | None, hostname: str | None,
           queues: str | None, loglevel: str, platform: str,
           pier_bin: str | None, jobs_roots: tuple[Path, ...], selection_roots: tuple[Path, ...],
           env_file_roots: tuple[Path, ...], image_budget: str | None,
           agent_install: str | None, gateways: tuple[str, ...], pids_limit: int | None,
           disk_limit: str | None, pier_memory: str | None, registry_mirrors: tuple[str, ...],
           host_addresses: tuple[str, ...]) -> None:  # fmt: skip
    """Run a Celery worker that executes trials on this host.

    The worker runs its own Pier and serves only the jobs directories,
    selections and env files under its roots: every path a job names must
    resolve under one of them. It needs the digest-pinned inference-proxy
    image (SCIENCEBENCH_PROXY_IMAGE), pulled at start, and tells the cluster
    what it brings (agent install, proxy image, roots, gateways, limits), which
    submit checks. Its trials reach only the gateways its operator allows
    (--gateway), never this machine's own addresses unlisted (in a container,
    give them with --host-address); each trial container runs at most --pids-limit processes and
    writes at most --disk-limit to its writable layer; Pier itself takes at
    most --pier-memory. With --registry-mirror, task images of a mirrored
    registry are pulled through the mirror and run under its name, by the
    same digest (the Engine checks it).
    It starts a trial only while the requests of its running trials plus the
    trial's (its task's cpus and memory_mb) fit its capacity (--cpus, --memory).
    Late acks, prefetch 1, task events on, a watchdog that re-dispatches
    trials of lost hosts; a host that turns unhealthy pauses and resumes by
    itself.
    """
    require_worker_extra("worker")
    from sciencebench.worker.main import run_worker, worker_settings

    settings = worker_settings(
        Settings.from_env(),
        pier_bin=pier_bin,
        jobs_roots=tuple(p.absolute() for p in jobs_roots),
        selection_roots=tuple(p.absolute() for p in selection_roots),
        env_file_roots=tuple(p.absolute() for p in env_file_roots),
        image_budget=_size_option("--image-budget", image_budget),
        cpus=cpus,
        memory=_size_option("--memory", memory),
        agent_install=agent_install,
        gateways=parse_gateway_list(gateways, "--gateway"),
        host_addresses=_addresses_option(host_addresses),
        pids_limit=_pids_option(pids_limit),
        disk_limit=_size_option("--disk-limit", disk_limit),
        pier_memory=_pier_memory_option(pier_memory),
        registry_mirror=_mirrors_option(registry_mirrors),
    )
    run_worker(concurrency=concurrency, hostname=hostname, queues=queues, loglevel=loglevel,
               platform=platform, settings=settings)  # fmt: skip


def _addresses_option(values: tuple[str, ...]) -> tuple[str, ...]:
    """The --host-address values given, normalized; InputError for one that is not an IP address."""
    try:
        return tuple(str(ipaddress.ip_address(value.strip("[]"))) for value in values)
    except ValueError as exc:
        raise InputError(f"--host-address: {exc}") from None


def _pids_option(value: int | None) -> int | None:
    """The --pids-limit given, None when not given; InputError outside the accepted range."""
    if value is not None and not MIN_PIDS_LIMIT <= value <= MAX_PIDS_LIMIT:
        raise InputError(f"--pids-limit: {value} is not in {MIN_PIDS_LIMIT}..{MAX_PIDS_LIMIT}")
    return value


def _pier_memory_option(value: str | None) -> int | None:
    """The --pier-memory given in bytes, None when not given; InputError for a bad or too small one."""
    size = _size_option("--pier-memory", value)
    if size is not None and (problem := pier_memory_problem(size)):
        raise InputError(f"--pier-memory: {problem}")
    return size


def _mirrors_option(values: tuple[str, ...]) -> tuple[str, ...]:
    """The --registry-mirror values given, as `UPSTREAM=HOST`; InputError for a bad one."""
    try:
        return tuple(str(mirror) for mirror in parse_mirrors(values))
    except ValueError as exc:
        raise InputError(f"--registry-mirror: {exc}") from None


def _size_option(name: str, value: str | None) -> int | None:
    """Bytes of a size option (`200G`), None when not given; InputError for a bad one."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise InputError(f"{name}: {exc}") from None


@main.command()
@click.option("--platform", default=DEFAULT_PLATFORM, show_default=True)
@click.option("--jobs-dir", type=click.Path(path_type=Path), help="Shared jobs directory to check.")
@click.option("--pier-bin", help="The worker's Pier [env: SCIENCEBENCH_PIER_BIN; default: pier].")
@click.option("--broker/--no-broker", default=True, show_default=True, help="Check the broker too.")
@handle_errors
def preflight(platform: str, jobs_dir: Path | None, pier_bin: str | None, broker: bool) -> None:
    """Check this host can join as a worker: Engine >= 28, platform, compose v2, Pier, jobs dir, broker."""
    require_worker_extra("preflight")
    from sciencebench.worker.runtime import host_preflight

    pier = pier_bin or Settings.from_env().pier_bin
    for line in host_preflight(platform=platform, jobs_dir=jobs_dir, pier_bin=pier, broker=broker):
        out.print(line, markup=False)


@main.group()
def images() -> None:
    """Agent-ready images: task images with a harness preinstalled, for offline workers.

    Pier installs codex, claude-code and mini-swe-agent by downloading them
    inside an image build, which offline workers cannot do. `bake` builds the
    selection's task images with the agent preinstalled from artifacts fetched
    on this host (scripts/agent-artifacts.sh), pushes them by digest and
    records them in <selection>/.sciencebench/agent-images.json, which
    `submit` checks and workers run.
    """


@images.command()
@click.option("--path", required=True, type=click.Path(path_type=Path), help="Materialized task selection.")
@click.option("--agent", required=True, type=click.Choice(bakeable()),
              help="Harness to preinstall.")  # fmt: skip
@click.option("--agent-version", help="Version to bake (default: the pinned one).")
@click.option("--registry", required=True, metavar="HOST[:PORT]",
              help="Registry to push the baked images to, one the workers pull from (a task image's "
                   "own registry, e.g. docker.io, is rarely one you may push to).")  # fmt: skip
@click.option("--artifacts", type=click.Path(path_type=Path), envvar=AGENT_ARTIFACTS_ENV,
              help="Directory of fetched artifacts [env: SCIENCEBENCH_AGENT_ARTIFACTS; "
                   "default /var/tmp/sciencebench-agents].")  # fmt: skip
@click.option("--extra-ca", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="PEM CA certificate the agent must trust (a gateway with a private CA).")  # fmt: skip
@handle_errors
def bake(
    path: Path, agent: str, agent_version: str | None, registry: str,
    artifacts: Path | None, extra_ca: Path | None,
) -> None:  # fmt: skip
    """Bake --agent into every agent image of the selection; a no-op for what is already baked.

    Exits 0 when every image is baked and recorded, 1 when the engine or the
    registry fails, 2 on bad input (selection, agent, missing artifacts).
    """
    from sciencebench.bake.command import bake_selection

    results = bake_selection(
        path, agent, agent_version, registry=registry, artifacts=artifacts, extra_ca=extra_ca,
        log=lambda line: err.print(line, markup=False, soft_wrap=True),
    )  # fmt: skip
    table = Table(title=f"{agent}: {len(results)} image(s)")
    for column in ("task image", "baked image", "action", "seconds"):
        table.add_column(column)
    for result in results:
        table.add_row(result.image.base_image, result.image.image, result.action, f"{result.seconds:.1f}")
    out.print(table)
    out.print(f"recorded in {SelectionPaths(path.resolve()).agent_images}", soft_wrap=True)
