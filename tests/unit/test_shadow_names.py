"""Trial messages carry readable Celery shadow names, in the message and in its task-sent event."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from sciencebench.coordination.celery_app import create_app
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.coordination.watchdog import send_again
from sciencebench.core.models import Redispatch, TrialSpec
from sciencebench.core.settings import Settings
from sciencebench.core.wire import RUN_TRIAL, finalize_shadow, run_trial_message, trial_shadow
from sciencebench.login.dispatch import FrozenChord, publish_header

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


def test_the_watchdog_sends_a_trial_as_its_submit_did(
    monkeypatch: pytest.MonkeyPatch, store: RedisCoordinator
) -> None:
    """Both senders build one message (`core.wire.run_trial_message`): the same headers and arguments."""
    app = Celery("wire-test", broker="memory://", backend="cache+memory://", set_as_current=False)
    sent: list[tuple[str, Any]] = []

    def capture(producer: object, name: str, message: Any, **options: object) -> None:
        sent.append((name, message))

    monkeypatch.setattr(app.amqp, "send_task_message", capture)
    trial = make_trial()
    chord_body = app.signature("finalize").freeze("body-id", group_id="group-1")
    frozen = FrozenChord(group_id="group-1", body=app.signature("finalize"), result=chord_body)
    message = run_trial_message(trial, "task-1")
    publish_header(app, frozen, [app.signature(message.name, args=message.args, options=message.options)])
    payload = Redispatch(task_id="task-1", trial=trial, chord=dict(app.signature("finalize")),
                         group_id="group-1", group_index=0)  # fmt: skip
    send_again(app, store, payload)
    (first_name, first), (again_name, again) = sent
    assert first_name == again_name == RUN_TRIAL
    wanted = ("id", "task", "shadow", "argsrepr", "kwargsrepr", "group", "group_index")
    assert {k: first.headers[k] for k in wanted} == {k: again.headers[k] for k in wanted}
    assert first.headers["shadow"] == trial_shadow(trial.job_name, trial.task_id, trial.attempt)
    assert list(first.body[0]) == list(again.body[0]) == [trial.model_dump(mode="json")]


def make_trial() -> TrialSpec:
    return TrialSpec(
        job_id=uuid.uuid4(), job_name="j", jobs_dir=Path("/jobs"), task_id="002", attempt=2,
        task_dir=Path("/sel/task_002"), task_toml_sha256="0" * 64, image_refs=[], expected_sec=1.0,
    )  # fmt: skip
