"""`sciencebench worker`: configure, preflight, sweep leftovers, warm Pier, then a Celery worker.

Prefork pool with `-O fair` (a slot takes a trial only when free), late acks
and prefetch 1 (from the app), task events for Flower (`-E`). The main
process also runs the lost-host watchdog and the host keeper: a heartbeat
for the cluster, and, while a trial found this host unhealthy (its engine
gone, its state dir full), a health check with backoff that resumes taking
trials by itself once the host is fit again.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, cast

from celery import Celery
from celery.signals import worker_ready, worker_shutdown
from celery.utils.nodenames import default_nodename, host_format

from sciencebench.coordination import connect
from sciencebench.coordination.placement import host_queue
from sciencebench.coordination.protocol import Coordinator, HostKit
from sciencebench.coordination.redis.placement import RedisPlacementStore
from sciencebench.coordination.watchdog import start_watchdog
from sciencebench.core.errors import InputError, PreflightError, PullError
from sciencebench.core.settings import Settings
from sciencebench.core.sizes import format_size
from sciencebench.worker import preflight
from sciencebench.worker.app import app
from sciencebench.worker.context import WorkerContext, docker_runtime, use_context
from sciencebench.worker.docker.holdings import HoldingsReporter
from sciencebench.worker.pier import process
from sciencebench.worker.recovery import recover_dead
from sciencebench.worker.runtime import images_report, prepare_host
from sciencebench.worker.tasks import cluster_context

log = logging.getLogger(__name__)

# The longest a paused host waits between two health checks.
MAX_HEALTH_BACKOFF_SEC = 60.0
# How often a host looks for a change in the task images it holds (two `stat`s when nothing changed).
HOLDINGS_CHECK_SEC = 1.0


def worker_settings(settings: Settings, **overrides: Any) -> Settings:
    """The worker's settings with its command-line options; InputError when it serves nothing."""
    # An option not given is None (or no value at all); a 0 given (`--disk-limit 0`) counts.
    settings = settings.model_copy(update={k: v for k, v in overrides.items() if v is not None and v != ()})
    if not settings.jobs_roots or not settings.selection_roots:
        raise InputError(
            "a worker serves only the directories it is given: set --jobs-root and --selection-root "
            "(or SCIENCEBENCH_JOBS_ROOTS and SCIENCEBENCH_SELECTION_ROOTS)"
        )
    try:
        preflight.check_proxy_ref(settings.proxy_image)
    except PreflightError as exc:
        raise InputError(str(exc)) from None
    return settings


def run_worker(*, concurrency: int, hostname: str | None, queues: str | None, loglevel: str,
               platform: str, settings: Settings) -> None:  # fmt: skip
    """Check the host, then run the Celery worker until it is stopped."""
    coord = connect(settings)
    coord.ping()
    prepare_host(platform, settings)
    log.info(preflight.ensure_proxy_image(settings.proxy_image))
    log.info(limits_line(settings))
    log.info(pier_memory_line(settings))
    for mirror in settings.mirrors:
        log.info("task images of %s are pulled through the mirror %s", mirror.upstream, mirror.host)
    # One name for this worker everywhere: Celery's node name (`w1@host`) is
    # what heartbeats, pauses, unfit marks and records say.
    nodename = host_format(default_nodename(hostname or ""))
    settings = settings.model_copy(update={"hostname": nodename})
    own = host_queue(app.conf.task_default_queue, nodename)
    # What waits on this host's own queue was placed there before this start, while the host was
    # down: each of those trials comes back through the store (its parked lease lapses, the
    # watchdog sends it to the shared queue), so a copy left here is stale, and a later run of it
    # could answer an old chord or run a trial that `retry --failed` has sent again since.
    dropped = _purge(app, own)  # said once Celery's logging is set up (`_on_ready`)
    # Live before its first trial: a host that cannot serve a job hands trials back only while
    # another live host may (`worker.trial._unfit`), and the keeper's first beat is a quarter lease away.
    coord.describe_host(nodename, host_kit(settings, concurrency))
    log.info("capacity: %s for its running trials' requests; at most %d at once", settings.capacity,
             concurrency)  # fmt: skip
    holdings = HoldingsReporter(nodename, settings.state_dir, RedisPlacementStore(coord), settings.mirrors)
    holdings.tick(force=True)  # what it holds, before fill places its first trial
    _report_images(coord, settings, holdings.line)
    coord.beat(nodename)
    # Forked pool processes build their context with these settings, not from the environment alone.
    use_context(lambda: cluster_context(settings))
    # Runs that dead worker processes of this host left after their Pier ended: committed, not run again.
    keeper = WorkerContext(coord=coord, runtime=docker_runtime(settings, coord), settings=settings)
    _recover(keeper)
    pier_bin = settings.pier_bin
    # Imports Pier in the background while Celery starts; pool processes share it.
    zygote_pid = (
        process.prewarm(pier_bin, process.zygote_environment(platform, settings.pier_env))
        if settings.warm_pier
        else None
    )
    stop = threading.Event()
    watchers: list[threading.Thread] = []  # joined at shutdown: no report after the host is forgotten

    @worker_ready.connect(weak=False)
    def _on_ready(sender: Any = None, **_: Any) -> None:
        if dropped:
            log.info("dropped %d trial message(s) left on %s before this start (their trials come back "
                     "through the store)", dropped, own)  # fmt: skip
        if zygote_pid is not None:
            log.info("Pier starts warm: forked by zygote pid %d", zygote_pid)
        elif not settings.warm_pier:
            log.info("Pier starts cold (SCIENCEBENCH_WARM_PIER=0)")
        elif process.warm_entry(pier_bin) is None:
            log.info("Pier starts cold (--pier-bin %s is not this environment's own pier)", pier_bin)
        else:
            log.info("Pier starts cold (its zygote did not start; see the warning above)")
        start_watchdog(app, coord, settings.lease_seconds)
        threading.Thread(
            target=keep_host,
            args=(app, coord, settings, stop, concurrency, holdings),
            name="sciencebench-host",
            daemon=True,
        ).start()
        watcher = threading.Thread(
            target=watch_holdings, args=(coord, settings, stop, holdings), name="sciencebench-holdings",
            daemon=True,
        )  # fmt: skip
        recoverer = threading.Thread(
            target=watch_dead_runs, args=(keeper, stop), name="sciencebench-recovery", daemon=True
        )
        for thread in (watcher, recoverer):
            thread.start()
            watchers.append(thread)

    @worker_shutdown.connect(weak=False)
    def _on_shutdown(sender: Any = None, **_: Any) -> None:
        stop.set()
        for watcher in watchers:
            watcher.join(timeout=5.0)
        try:
            coord.forget_host(settings.hostname)
            holdings.store.forget(settings.hostname)
        except Exception:  # the broker may be gone already
            log.warning("could not remove this host from the cluster's list", exc_info=True)

    # Neither mingle (at start, a second's wait to sync revoked task ids: nothing here revokes) nor
    # gossip (every worker consuming every other worker's events): hosts coordinate through the store.
    argv = ["worker", f"--concurrency={concurrency}", f"--loglevel={loglevel}", "-E", "-O", "fair",
            "--without-mingle", "--without-gossip", f"--hostname={nodename}"]  # fmt: skip
    # The shared queue (or the operator's --queues) and this host's own: trials placed on it.
    argv.append(f"--queues={queues or app.conf.task_default_queue},{own}")
    app.worker_main(argv)


def _purge(app: Celery, queue: str) -> int:
    """Drop every message waiting on `queue` (the broker's queue of that name); how many."""
    with app.connection_for_write() as connection:
        return int(cast(Any, connection.default_channel).queue_purge(queue) or 0)


def limits_line(settings: Settings) -> str:
    """The worker log's line of what each trial container may use (`--pids-limit`, `--disk-limit`)."""
    disk = format_size(settings.disk_limit) if settings.disk_limit else "not watched"
    return f"each trial container: at most {settings.pids_limit} processes; writable layer {disk}"


def pier_memory_line(settings: Settings) -> str:
    """The worker log's line of what each Pier process may take (`--pier-memory`)."""
    bound = f"at most {format_size(settings.pier_memory)}" if settings.pier_memory else "unbounded"
    return f"each Pier process (and each docker CLI it runs): data {bound}"


def host_kit(settings: Settings, slots: int = 0) -> HostKit:
    """What this host brings to a job, for submit to check: agent install, proxy, roots, gateways, room.

    Its limits (pids, disk, Pier's memory) are reported too, for `status` and the operator.
    """
    capacity = settings.capacity
    return HostKit(
        slots=slots,
        cpus=capacity.cpus,
        memory_mb=capacity.memory_mb,
        agent_install=settings.agent_install,
        proxy_image=settings.proxy_image,
        jobs_roots=tuple(str(root) for root in settings.jobs_roots),
        selection_roots=tuple(str(root) for root in settings.selection_roots),
        env_file_roots=tuple(str(root) for root in settings.env_file_roots),
        gateways=tuple(gateway.origin for gateway in settings.gateways),
        pids_limit=settings.pids_limit,
        disk_limit=settings.disk_limit,
        pier_memory=settings.pier_memory,
    )


def _report_images(coord: Coordinator, settings: Settings, held: str = "") -> None:
    """Tell the store, for `status`, which task images the host holds and what they take of its budget."""
    try:
        budget = images_report(settings)
    except PullError as exc:
        log.warning("cannot report the image budget: %s", exc)
        budget = ""
    line = "; ".join(part for part in (held, budget) if part)
    if line:
        coord.report_images(settings.hostname, line)


def watch_holdings(
    coord: Coordinator, settings: Settings, stop: threading.Event, holdings: HoldingsReporter
) -> None:
    """Report the task images the host holds within `HOLDINGS_CHECK_SEC` of a change, and every lease.

    A change is a pull, an eviction or a first use of an image (`HoldingsReporter.tick` sees it from
    two `stat`s; only then does it list the Engine's images). Placement sends an image's next trials
    by these reports: a host whose pull is not yet reported counts only as pulling the image (its
    size unknown), so the sooner the report, the sooner the cluster knows what a second pull costs.
    """
    force_every = max(int(settings.lease_seconds / HOLDINGS_CHECK_SEC), 1)
    ticks = 0
    while not stop.wait(HOLDINGS_CHECK_SEC):
        ticks += 1
        try:
            # Forced every lease period: again after a broker that lost its data.
            if holdings.tick(force=ticks % force_every == 0):
                _report_images(coord, settings, holdings.line)
        except Exception:  # the broker may be restarting; try again later
            log.warning("could not report the task images this host holds", exc_info=True)


def watch_dead_runs(ctx: WorkerContext, stop: threading.Event) -> None:
    """Every quarter lease, commit what runs of dead worker processes of this host hold (`worker.recovery`).

    Quicker than a lease: a dead run is committed under its owner's lease
    only until the watchdog sends the trial again, which it does once that
    lease has lapsed.
    """
    failed = ""
    while not stop.wait(max(ctx.settings.lease_seconds / 4, 0.25)):
        failed = _recover(ctx, failed)


def _recover(ctx: WorkerContext, failed: str = "") -> str:
    """One pass of `recover_dead`, its lines logged; why it failed (logged unless it is `failed` again)."""
    try:
        for line in recover_dead(ctx):
            log.warning("dead run: %s", line)
    except Exception as exc:  # the scratch not the worker's own: the next pass tries again
        if str(exc) != failed:
            log.warning("cannot look for runs of dead worker processes: %s", exc)
        return str(exc)
    return ""


def keep_host(
    app: Celery,
    coord: Coordinator,
    settings: Settings,
    stop: threading.Event,
    slots: int = 0,
    holdings: HoldingsReporter | None = None,
) -> None:
    """Beat every quarter lease and own this host's consumers of the trial queues.

    A trial that finds the host unhealthy only marks it paused (in the
    store); this thread alone stops and resumes consuming, so a pause and a
    resume never race. While paused it checks health with backoff and resumes
    by itself once the host is fit. Consumer changes are broadcasts that may
    be lost while the broker reconnects, so the wanted state is sent again
    every lease period (Celery ignores a repeat). The trial queues are the
    shared one and the host's own (`coordination.placement.host_queue`).
    `holdings`: its last report's words for `status`, sent again with the
    budget's line (`watch_holdings` reports the images themselves).
    """
    hostname = settings.hostname
    queues = (app.conf.task_default_queue, host_queue(app.conf.task_default_queue, hostname))
    interval = max(settings.lease_seconds / 4, 0.5)
    reaffirm_every = max(int(settings.lease_seconds / interval), 1)
    backoff, next_check, ticks = interval, 0.0, 0
    while not stop.wait(interval):
        ticks += 1
        try:
            coord.beat(hostname)
            if ticks % reaffirm_every == 0:  # again after a broker that lost its data
                coord.describe_host(hostname, host_kit(settings, slots))
            if settings.image_budget and (ticks == 1 or ticks % reaffirm_every == 0):
                _report_images(coord, settings, holdings.line if holdings is not None else "")
            status = coord.hosts().get(hostname)
            if status is None or not status.paused:
                backoff, next_check = interval, 0.0
                if ticks % reaffirm_every == 0:
                    _consume(app, queues, hostname, True)
                continue
            if next_check <= 0 or ticks % reaffirm_every == 0:
                _consume(app, queues, hostname, False)
            next_check -= interval
            if next_check > 0:
                continue
            try:
                preflight.check_host(platform=None, pier_bin=settings.pier_bin, state_dir=settings.state_dir)
            except PreflightError as exc:
                backoff = min(backoff * 2, MAX_HEALTH_BACKOFF_SEC)
                next_check = backoff
                coord.pause_host(hostname, str(exc))
                log.warning("host still unhealthy (next check in %.0fs): %s", backoff, exc)
                continue
            _consume(app, queues, hostname, True)
            coord.resume_host(hostname)
            backoff, next_check = interval, 0.0
            log.warning("host healthy again: taking trials")
        except Exception:  # the broker may be restarting; try again later
            log.warning("host keeper: broker call failed", exc_info=True)


def _consume(app: Celery, queues: tuple[str, ...], hostname: str, on: bool) -> None:
    """Start (`on`) or stop consuming the trial queues on this host (broadcasts; a repeat is ignored)."""
    for queue in queues:
        if on:
            app.control.add_consumer(queue, destination=[hostname])
        else:
            app.control.cancel_consumer(queue, destination=[hostname])
