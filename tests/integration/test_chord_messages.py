"""`dispatch.send_chord` publishes what Celery's own `chord(header)(body)` publishes.

Celery on the `memory://` transport (the messages are read back from its
queue), its result backend on the session's real Redis (where the chord's
size is stored). Ids differ by nature: they are compared by format and by
how they link the messages (group, body, root).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, chord, group

from sciencebench.login.dispatch import send_chord
from tests.fixtures.services import RedisServer

pytestmark = pytest.mark.integration

IDS = ("id", "group", "root_id")


def _run(x: int, k: int) -> int:
    return x + k


def _final() -> None:
    return None


@pytest.fixture
def app(redis_server: RedisServer) -> Iterator[Celery]:
    celery = Celery(f"chord-messages-{uuid.uuid4().hex[:6]}", broker="memory://", backend=redis_server.url)
    celery.conf.task_send_sent_event = False
    celery.conf.task_routes = {"cm.run": {"queue": "cm-trials"}}
    celery.task(name="cm.run", shared=False)(_run)
    celery.task(name="cm.final", shared=False)(_final)
    yield celery
    celery.close()


def _published(app: Celery, queue: str) -> list[dict[str, Any]]:
    messages = []
    with app.connection_for_write() as conn:
        simple = conn.SimpleQueue(queue)
        while simple.qsize():
            message = simple.get(timeout=1)
            messages.append(
                {
                    "headers": message.headers,
                    "payload": message.payload,
                    "delivery_info": message.delivery_info,
                    "properties": message.properties,
                }
            )
            message.ack()
        simple.close()
    return messages


def _shape(app: Celery, message: dict[str, Any], body_id: str) -> dict[str, Any]:
    """A message without its ids, each id checked for its format and for what it links."""
    headers, (args, kwargs, embed) = dict(message["headers"]), message["payload"]
    for key in IDS:
        uuid.UUID(headers.pop(key))
    properties = dict(message["properties"])
    assert properties.pop("correlation_id") == message["headers"]["id"]
    assert properties.pop("reply_to") == app.thread_oid
    properties.pop("delivery_tag")
    assert message["headers"]["root_id"] == message["headers"]["id"]
    body = dict(embed["chord"])
    options = dict(body.pop("options"))
    assert options.pop("group_id") == message["headers"]["group"]
    assert options.pop("task_id") == body_id
    assert options.pop("reply_to") == app.thread_oid
    headers.pop("origin")
    return {
        "headers": headers,
        "args": args,
        "kwargs": kwargs,
        "embed": {**embed, "chord": body},
        "body_options": options,
        "delivery_info": message["delivery_info"],
        "properties": properties,
    }


def test_send_chord_publishes_celerys_chord_messages(app: Celery) -> None:
    def header() -> list[Any]:
        return [
            app.signature("cm.run", args=(i,), kwargs={"k": i}, options={"priority": 3, "shadow": f"t{i}"})
            for i in range(3)
        ]

    body = app.signature("cm.final").set(immutable=True)
    stock = chord(group(header()))(body.clone())
    theirs = _published(app, "cm-trials")
    ours_result = send_chord(app, header(), body.clone())
    ours = _published(app, "cm-trials")
    assert len(theirs) == len(ours) == 3
    assert [_shape(app, m, ours_result.id) for m in ours] == [_shape(app, m, stock.id) for m in theirs]
    # Celery's chord counter: the size stored under each chord's group, which every message names.
    for result, messages in ((stock, theirs), (ours_result, ours)):
        group_id = messages[0]["headers"]["group"]
        assert {m["headers"]["group"] for m in messages} == {group_id}
        assert [m["headers"]["group_index"] for m in messages] == [0, 1, 2]
        size = app.backend.client.get(app.backend.get_key_for_group(group_id, ".s"))
        assert int(size) == 3, result
