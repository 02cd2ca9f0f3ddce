"""`sciencebench worker`: preflight, sweep leftovers, warm Pier, then a Celery worker.

Prefork pool with `-O fair` (a slot takes a trial only when free), late acks
and prefetch 1 (from the app), task events for Flower (`-E`), and the
lost-host watchdog in the main process.
"""

from __future__ import annotations

import os
from typing import Any

from celery.signals import worker_ready

from sciencebench import pier
from sciencebench.celery_app import app
from sciencebench.config import Settings
from sciencebench.coord import RedisCoordinator
from sciencebench.runtime import prepare_host
from sciencebench.watchdog import start_watchdog


def run_worker(*, concurrency: int, hostname: str | None, queues: str | None, loglevel: str,
               platform: str, pier_bin: str) -> None:  # fmt: skip
    """Check the host, then run the Celery worker until it is stopped."""
    settings = Settings.from_env()
    coord = RedisCoordinator(settings.broker_url)
    coord.ping()
    prepare_host(platform, pier_bin, settings)
    if settings.warm_pier:
        # Imports Pier in the background while Celery starts; pool processes share it.
        pier.prewarm(pier_bin, pier.pier_environment(dict(os.environ), {}, platform, pier.SCIENCEBENCH_PATH))

    @worker_ready.connect(weak=False)
    def _start_watchdog(**_: Any) -> None:
        start_watchdog(app, coord, settings.lease_seconds)

    argv = ["worker", f"--concurrency={concurrency}", f"--loglevel={loglevel}", "-E", "-O", "fair"]
    if hostname:
        argv.append(f"--hostname={hostname}")
    if queues:
        argv.append(f"--queues={queues}")
    app.worker_main(argv)
