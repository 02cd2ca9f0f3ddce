"""The result backend counts a trial towards its job's chord across a broker outage.

Celery counts a returned trial in the result backend (`on_chord_part_return`:
one Lua script, then the finalizer's send). Celery retries storing a result
but not this count: a broker restarting at that moment made the count raise,
Celery stored the trial as failed with that ConnectionError, counted the
failure, and the job's chord ended in error though every record was stored
(`Dependency ... raised network:ConnectionError`).

Each case runs a redis-server of its own (it is stopped, or its replies cut)
and Celery's own backend code; the chord's body is the finalizer's message,
looked for in the broker's queue.
"""

from __future__ import annotations

import contextlib
import gc
import json
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, states
from celery.app.task import Context
from celery.backends.redis import CHORD_PART_RETURN_LUA

from sciencebench.coordination.celery_app import create_app
from sciencebench.coordination.result_backend import PatientRedisBackend
from sciencebench.core.settings import Settings
from sciencebench.core.wire import FINALIZE_JOB
from tests.fixtures.services import RedisServer

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def short_outages(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command waits out at most a minute here: a server that does not come back fails the test."""
    monkeypatch.setattr(PatientRedisBackend, "outage_sec", 60.0)


@pytest.fixture
def server(own_redis: RedisServer) -> Iterator[RedisServer]:
    """The broker and result backend: stopped, paused or its replies cut, while a trial is counted.

    The finalizer's AsyncResult, once garbage, unsubscribes on its backend's
    connection: collected while the server is still up, not in a later test
    after it stopped, where it waited out the outage bound (a 2-minute stall).
    """
    yield own_redis
    gc.collect()


class CutReply:
    """A loopback TCP proxy to a redis-server that, once, lets a command through and cuts its reply.

    The first command whose bytes hold `marker` reaches the server and runs
    there; the connection is closed before its reply comes back, as a broker
    restarting at that moment would. Everything else is relayed as it is.
    """

    def __init__(self, upstream_port: int, marker: bytes) -> None:
        self.upstream_port, self.marker = upstream_port, marker
        self.cut = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            swallow = threading.Event()
            threading.Thread(target=self._requests, args=(client, upstream, swallow), daemon=True).start()
            threading.Thread(target=self._replies, args=(upstream, client, swallow), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket, swallow: threading.Event) -> None:
        while data := _recv(client):
            if not self.cut.is_set() and self.marker in data:
                self.cut.set()
                swallow.set()  # before the command goes out: its reply is never relayed
            upstream.sendall(data)
        _close(client, upstream)

    def _replies(self, upstream: socket.socket, client: socket.socket, swallow: threading.Event) -> None:
        while data := _recv(upstream):
            if swallow.is_set():
                break  # the command ran on the server; its client never hears of it
            client.sendall(data)
        _close(client, upstream)

    def close(self) -> None:
        self._listener.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def _app(broker_url: str, backend_url: str = "") -> Celery:
    env = {"SCIENCEBENCH_BROKER_URL": broker_url, "SCIENCEBENCH_RESULT_BACKEND": backend_url}
    return create_app(Settings.from_env(env))


def _one_trial_chord(app: Celery) -> Context:
    """A job's chord of one trial, sized as `submit` sizes it; the trial's request as its worker sees it."""
    group = str(uuid.uuid4())
    body = app.signature(FINALIZE_JOB, args=("/jobs", "job", str(uuid.uuid4())), immutable=True)
    app.backend.set_chord_size(group, 1)
    return Context(id=str(uuid.uuid4()), group=group, group_index=0, chord=dict(body))


def _finalizers_sent(url: str) -> list[Any]:
    """The finalizer messages in the broker's default queue."""
    messages = redis.Redis.from_url(url).lrange("celery", 0, -1)
    return [json.loads(m)["headers"]["task"] for m in messages]


def _count_while_away(app: Celery, request: Context, away: Callable[[], None], back: Callable[[], None],
                      seconds: float) -> None:  # fmt: skip
    """Count the trial of `request` after `away()`; `back()` runs `seconds` later, while the count waits."""
    away()
    timer = threading.Timer(seconds, back)
    timer.start()
    try:
        app.backend.on_chord_part_return(request, states.SUCCESS, {"reward": 1.0})
    finally:
        timer.join()


def test_a_trial_counted_while_the_broker_restarts_is_counted_once_it_is_back(server: RedisServer) -> None:
    app = _app(server.url)
    request = _one_trial_chord(app)
    app.backend.client.ping()  # the backend's connection is open, as a worker's is mid-job
    _count_while_away(app, request, server.stop, server.start, 1.5)
    assert _finalizers_sent(server.url) == [FINALIZE_JOB]


def test_a_count_whose_reply_was_cut_still_sends_the_finalizer(server: RedisServer) -> None:
    # The count of the job's last trial runs on the server and claims the finalizer's send; its reply is
    # lost. Sent again (same claim token), the count must see that the claim is its own.
    group_marker = b".j"  # the chord's result list, a key only the count's script names
    redis.Redis.from_url(server.url).script_load(CHORD_PART_RETURN_LUA)  # so the cut command runs it
    proxy = CutReply(server.port, group_marker)
    try:
        app = _app(server.url, f"redis://127.0.0.1:{proxy.port}/0")
        request = _one_trial_chord(app)
        app.backend.on_chord_part_return(request, states.SUCCESS, {"reward": 1.0})
        assert proxy.cut.is_set(), "the count's reply was never cut: the test proves nothing"
    finally:
        proxy.close()
    assert _finalizers_sent(server.url) == [FINALIZE_JOB]


def test_another_workers_claim_is_not_taken(server: RedisServer) -> None:
    # The last trial's count finds the finalizer's send claimed by a count that is not its own
    # (a copy of the trial counted on another host): it sends nothing.
    app = _app(server.url)
    request = _one_trial_chord(app)
    claim = app.backend.get_key_for_group(request.group, ".c")  # Celery's key for the finalizer's send
    redis.Redis.from_url(server.url).set(claim, "someone-else", ex=60)
    app.backend.on_chord_part_return(request, states.SUCCESS, {"reward": 1.0})
    assert _finalizers_sent(server.url) == []


def test_a_count_that_times_out_on_a_paused_broker_is_sent_again(server: RedisServer) -> None:
    # A paused broker (or a network that drops packets) answers nothing: the count times out, perhaps after
    # it ran; sent again, it still sends the finalizer.
    app = _app(server.url)
    app.conf.redis_socket_timeout = 0.5
    request = _one_trial_chord(app)
    proc = server.proc
    assert proc is not None
    _count_while_away(app, request, lambda: proc.send_signal(signal.SIGSTOP),
                      lambda: proc.send_signal(signal.SIGCONT), 1.5)  # fmt: skip
    assert _finalizers_sent(server.url) == [FINALIZE_JOB]


def test_the_finalizer_sent_while_the_broker_is_away_is_sent_once_it_is_back(
    server: RedisServer, tmp_path: Path
) -> None:
    # The count lands (the result backend is up) and then sends the finalizer to a broker that is away for
    # 12 s. Each try to reach it gives up after 0.5 s here; with Celery's own publish policy the finalizer's
    # send then gives up within 9 s, the chord fails ("Callback error") and nothing is sent.
    backend = RedisServer(tmp_path / "backend")
    backend.start()
    try:
        app = _app(server.url, backend.url)
        app.conf.broker_connection_timeout = 0.5
        _count_while_away(app, _one_trial_chord(app), server.stop, server.start, 12.0)
    finally:
        gc.collect()  # the finalizer's AsyncResult unsubscribes on `backend` (see `server`)
        backend.stop()
    assert _finalizers_sent(server.url) == [FINALIZE_JOB]


def test_a_refused_login_fails_at_once(tmp_path: Path) -> None:
    # A wrong password is an answer, not an outage: nothing waits for it.
    locked = RedisServer(tmp_path / "locked", password="right")
    locked.start()
    try:
        app = _app(locked.url.replace(":right@", ":wrong@"))
        started = time.monotonic()
        with pytest.raises(redis.exceptions.AuthenticationError):
            app.backend.client.ping()
        assert time.monotonic() - started < PatientRedisBackend.outage_sec / 10
    finally:
        locked.stop()
