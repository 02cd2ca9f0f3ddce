"""The Celery app and its settings for hour-long trials.

Late acknowledgement with a prefetch of one means a worker holds one
unacknowledged trial per slot; the broker redelivers an unacknowledged
message only after the visibility timeout, so that timeout must outlive the
longest trial and is set everywhere Celery and kombu read it. Lost hosts are
detected much sooner through leases (see `coordination.watchdog`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import Celery
from celery.app.amqp import AMQP

from sciencebench.coordination.redis.base import OUTAGE_SEC
from sciencebench.coordination.result_backend import Loader
from sciencebench.core.settings import RESULT_EXPIRES_SEC, Settings

# Publishing (a trial, a copy, the chord's finalizer) waits out a broker outage as long as the store's
# calls do (OUTAGE_SEC): tries 1 s apart at first, then 10 s apart. Celery's default gave up after 25 s,
# and a finalizer not sent then ends the job's chord in error.
PUBLISH_RETRY_POLICY = {"max_retries": int(OUTAGE_SEC // 10) + 6, "interval_start": 0, "interval_step": 1,
                        "interval_max": 10}  # fmt: skip


class ShadowNamedAMQP(AMQP):
    """Celery's message factory, with task-sent events naming a task by its shadow name.

    Workers report a task by its `shadow` name (`trial <job>/task_002#1`) in
    task-received and later events, but the task-sent event carries the task
    name. A message is published before its task-sent event, so a worker may
    report the task before that event arrives; Flower then merges the older
    event last and shows `sciencebench.run_trial` again. With the same name
    in every event, Flower names the task one way whatever the order.
    """

    def as_task_v2(self, *args: Any, **kwargs: Any) -> Any:
        """`AMQP.as_task_v2`; the sent event takes the message's shadow name when it has one."""
        message = super().as_task_v2(*args, **kwargs)
        shadow = message.headers.get("shadow")
        if shadow and message.sent_event is not None:
            message.sent_event["name"] = shadow
        return message


def create_app(settings: Settings | None = None, include: Sequence[str] = ()) -> Celery:
    """A configured Celery app; a worker `include`s its task modules, a sender needs none.

    The login node sends tasks by name (`core.wire`) and never imports the
    worker's task code. Raises SettingsError when no `settings` are given and
    the environment's are invalid.
    """
    settings = settings or Settings.from_env()
    # Loader: a Redis result backend whose commands wait out a broker outage (`coordination.result_backend`).
    app = Celery("sciencebench", include=list(include), amqp=ShadowNamedAMQP, loader=Loader)
    transport_options = {"visibility_timeout": settings.visibility_timeout_sec}
    # The result backend's connections wait out an outage themselves (`coordination.result_backend`);
    # Celery's retries around them (`ensure`, `result_backend_always_retry`) would multiply that wait.
    backend_options = {**transport_options, "retry_policy": {"max_retries": 0}}
    app.conf.update(
        broker_url=settings.broker_url,
        result_backend=settings.backend_url,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport_options,
        result_backend_transport_options=backend_options,
        task_publish_retry_policy=PUBLISH_RETRY_POLICY,
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
    # TLS (rediss://): the broker's certificate verified, this client's sent when set (`Settings.broker_ssl`).
    if broker_ssl := settings.broker_ssl(settings.broker_url):
        app.conf.broker_use_ssl = broker_ssl
    if backend_ssl := settings.broker_ssl(settings.backend_url):
        app.conf.redis_backend_use_ssl = backend_ssl
    return app
