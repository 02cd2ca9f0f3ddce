"""A bare Celery app with no-op tasks: the yardstick the benchmark compares against.

It is built by `sciencebench.coordination.celery_app.create_app`, so it has the settings that
shape delivery (late acks, prefetch 1, JSON, Redis broker and result backend, the
same visibility timeout), so a chord of `bench.noop` tasks on it is "the same
Celery without sciencebench". `BENCH_NOOP_EVENTS=1` also turns on the task
events sciencebench turns on (`-E`, task-sent events).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from bench.sb import Settings, create_app

NOOP = "bench.noop"
NOOP_FINALIZE = "bench.noop_finalize"


def create_noop_app(broker_url: str | None = None, *, events: bool | None = None) -> Celery:
    settings = Settings.from_env()
    broker = broker_url or os.environ.get("BENCH_BROKER_URL") or settings.broker_url
    if events is None:
        events = os.environ.get("BENCH_NOOP_EVENTS", "0") == "1"
    # sciencebench's own app settings, so the yardstick can never drift from them;
    # then only what makes it bare: no sciencebench tasks, its own queue, events optional.
    app = create_app(settings.model_copy(update={"broker_url": broker, "result_backend": broker}))
    app.main = "bench_noop"
    app.conf.update(
        include=[],
        worker_direct=False,
        task_track_started=events,
        worker_send_task_events=events,
        task_send_sent_event=events,
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
