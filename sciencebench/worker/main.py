"""`sciencebench worker`: preflight, sweep leftovers, warm Pier, then a Celery worker.

Prefork pool with `-O fair` (a slot takes a trial only when free), late acks
and prefetch 1 (from the app), task events for Flower (`-E`), and the
lost-host watchdog in the main process.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_ready

from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.coordination.watchdog import start_watchdog
from sciencebench.core.settings import Settings
from sciencebench.worker.app import app
from sciencebench.worker.pier import process
from sciencebench.worker.runtime import prepare_host

log = logging.getLogger(__name__)


def run_worker(*, concurrency: int, hostname: str | None, queues: str | None, loglevel: str,
               platform: str, pier_bin: str) -> None:  # fmt: skip
    """Check the host, then run the Celery worker until it is stopped."""
    settings = Settings.from_env()
    coord = RedisCoordinator(settings.broker_url)
    coord.ping()
    prepare_host(platform, pier_bin, settings)
    # Imports Pier in the background while Celery starts; pool processes share it.
    zygote_pid = (
        process.prewarm(pier_bin, process.zygote_environment(platform)) if settings.warm_pier else None
    )

    @worker_ready.connect(weak=False)
    def _on_ready(**_: Any) -> None:
        if zygote_pid is not None:
            log.info("Pier starts warm: forked by zygote pid %d", zygote_pid)
        elif not settings.warm_pier:
            log.info("Pier starts cold (SCIENCEBENCH_WARM_PIER=0)")
        elif process.warm_entry(pier_bin) is None:
            log.info("Pier starts cold (--pier-bin %s is not this environment's own pier)", pier_bin)
        else:
            log.info("Pier starts cold (its zygote did not start; see the warning above)")
        start_watchdog(app, coord, settings.lease_seconds)

    argv = ["worker", f"--concurrency={concurrency}", f"--loglevel={loglevel}", "-E", "-O", "fair"]
    if hostname:
        argv.append(f"--hostname={hostname}")
    if queues:
        argv.append(f"--queues={queues}")
    app.worker_main(argv)
