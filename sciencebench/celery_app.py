"""The Celery app and its settings for hour-long trials.

Late acknowledgement with a prefetch of one means a worker holds one
unacknowledged trial per slot; the broker redelivers an unacknowledged
message only after the visibility timeout, so that timeout must outlive the
longest trial and is set everywhere Celery and kombu read it. Lost hosts are
detected much sooner through leases (see `watchdog.py`).
"""

from __future__ import annotations

from celery import Celery

from sciencebench.config import RESULT_EXPIRES_SEC, Settings


def create_app(settings: Settings | None = None, *, local: bool = False) -> Celery:
    """A configured Celery app. `local` uses the in-memory transport (no Redis)."""
    settings = settings or Settings.from_env()
    app = Celery("sciencebench", include=["sciencebench.tasks"])
    transport_options = {"visibility_timeout": settings.visibility_timeout_sec}
    if local:
        broker, backend = "memory://", "cache+memory://"
    else:
        broker, backend = settings.broker_url, settings.result_backend
    app.conf.update(
        broker_url=broker,
        result_backend=backend,
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
        task_track_started=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        broker_connection_retry_on_startup=True,
        # Each worker also consumes its own queue: a dry run's pre-warm reaches every host.
        worker_direct=True,
        worker_hijack_root_logger=False,
        timezone="UTC",
        enable_utc=True,
    )
    return app


# The app `celery -A sciencebench.celery_app` and `sciencebench worker` load.
app = create_app()
