"""Trial messages carry readable Celery shadow names, in the message and in its task-sent event."""

from __future__ import annotations

import pytest

from sciencebench.coordination.celery_app import create_app
from sciencebench.core.settings import Settings
from sciencebench.core.wire import RUN_TRIAL, finalize_shadow, trial_shadow

pytestmark = pytest.mark.unit


def test_shadow_names_say_job_task_and_attempt() -> None:
    assert trial_shadow("codex-small", "002", 3) == "trial codex-small/task_002#3"
    assert finalize_shadow("codex-small") == "finalize codex-small"


def test_the_sent_event_names_the_task_as_workers_will() -> None:
    app = create_app(Settings(broker_url="redis://localhost:1/0"))
    shadowed = app.amqp.create_task_message(
        "id-1", RUN_TRIAL, [{}], {}, create_sent_event=True, shadow=trial_shadow("j", "001", 1)
    )
    assert shadowed.headers["shadow"] == "trial j/task_001#1"
    assert shadowed.sent_event["name"] == "trial j/task_001#1"
    plain = app.amqp.create_task_message("id-2", RUN_TRIAL, [{}], {}, create_sent_event=True)
    assert plain.sent_event["name"] == RUN_TRIAL
