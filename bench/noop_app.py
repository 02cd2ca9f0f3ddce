"""A bare Celery app with no-op tasks: the yardstick the benchmark compares against.

It has the Celery settings of `sciencebench.celery_app.create_app` that shape
delivery (late acks, prefetch 1, JSON, Redis broker and result backend, the
same visibility timeout), so a chord of `bench.noop` tasks on it is "the same
Celery without sciencebench". `BENCH_NOOP_EVENTS=1` also turns on the task
events sciencebench turns on (`-E`, task-sent events).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from sciencebench.config import RESULT_EXPIRES_SEC, Settings

NOOP = "bench.noop"
NOOP_FINALIZE = "bench.noop_finalize"


def create_noop_app(broker_url: str | None = None, *, events: bool | None = None) -> Celery:
    settings = Settings.from_env()
    broker = broker_url or os.environ.get("BENCH_BROKER_URL") or settings.broker_url
    if events is None:
        events = os.environ.get("BENCH_NOOP_EVENTS", "0") == "1"
    app = Celery("bench_noop")
    transport_options = {"visibility_timeout": settings.visibility_timeout_sec}
    app.conf.update(
        broker_url=broker,
        result_backend=broker,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport_options,
        result_backend_transport_options=transport_options,
        visibility_timeout=settings.visibility_timeout_sec,
        result_expires=RESULT_EXPIRES_SEC,
        result_extended=True,
        task_track_started=events,
        worker_send_task_events=events,
        task_send_sent_event=events,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_default_queue="bench_noop",
    )

    @app.task(name=NOOP, shared=False)
    def noop(*_: Any) -> None:
        return None

    @app.task(name=NOOP_FINALIZE, shared=False)
    def noop_finalize(*_: Any) -> int:
        return 0

    return app


_app: Celery | None = None


def __getattr__(name: str) -> Any:
    """`app` for `celery -A bench.noop_app worker` (BENCH_BROKER_URL), made on first use.

    Made lazily: Celery warns when two apps register the same task names, and
    the benchmark process makes its own app with `create_noop_app`.
    """
    global _app
    if name == "app":
        if _app is None:
            _app = create_noop_app()
        return _app
    raise AttributeError(name)
