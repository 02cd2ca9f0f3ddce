"""Placement's store (the embedded store), and `fill` sending each trial to a host's queue (Redis, Celery)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from sciencebench.coordination.models import Claim
from sciencebench.coordination.placement import (
    PULLING_TTL_SEC,
    UNMEASURED_LINE_SEC,
    HostImages,
    HostLoad,
    Routed,
    cluster_view,
    host_queue,
    pinned,
)
from sciencebench.coordination.protocol import Coordinator, Held, HostKit, parking_token
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.coordination.redis.placement import RedisPlacementStore
from sciencebench.coordination.shares import Share, fill
from sciencebench.core.models import Redispatch, TrialSpec
from tests.coordination import test_conformance
from tests.fixtures.services import RedisServer

JOB_ID = uuid.UUID("00000000-0000-4000-8000-000000000002")
JOB = str(JOB_ID)  # the job key of the trials `_payload` makes (where fill parks and routes them)
GB = 1 << 30
coord = test_conformance.coord  # the conformance suite's fixture


def _ref(name: str) -> str:
    return f"127.0.0.1:5000/t/{name}:v@sha256:{name[0] * 64}"


def _payload(task_id: str, attempt: int = 1, images: tuple[str, ...] = (), host: str = "") -> Redispatch:
    trial = TrialSpec(
        job_id=JOB_ID, job_name="j", jobs_dir=Path("/jobs"), task_id=task_id, attempt=attempt,
        task_dir=Path(f"/sel/task_{task_id}"), task_toml_sha256="x", image_refs=list(images),
        expected_sec=1.0,
    )  # fmt: skip
    return Redispatch(
        task_id=f"celery-{task_id}-{attempt}", trial=trial, group_id="g", group_index=0, host=host
    )


@pytest.mark.unit
def test_reports_are_kept_per_host_and_a_held_image_loses_its_pulling_mark(coord: Coordinator) -> None:
    store = RedisPlacementStore(coord)
    a, b = pinned([_ref("a"), _ref("b")])
    store.mark_pulling("h1", [a, b], at=5.0)
    store.report("h1", HostImages(images={a: GB}, bytes_per_sec=80e6))
    store.report("h2", HostImages(images={b: 2 * GB}))
    assert store.holdings()["h1"] == HostImages(images={a: GB}, bytes_per_sec=80e6)
    assert set(store.pulling(now=10.0)) == {
        b
    }  # h1 holds a now: its report replaces the mark (h2's: not h1's)
    assert store.pulling(now=5.0 + PULLING_TTL_SEC) == {}  # the pull failed, or the host never said: stale
    store.forget("h2")
    assert set(store.holdings()) == {"h1"}


@pytest.mark.unit
def test_a_hosts_load_is_its_running_trials_and_those_routed_to_it_not_started(coord: Coordinator) -> None:
    store = RedisPlacementStore(coord)
    coord.set_running("j", "001#1", _payload("001", host="h1"))  # claimed on h1: it runs there
    coord.hold("j", [Held(payload=_payload("002", a), expected_sec=1.0) for a in (1, 2, 3)], [], window=1)
    for _ in range(3):
        assert coord.next_waiting("j", 30) is not None  # guarded: running entries no host claimed
    for attempt, host, until, waits in (
        (1, "h1", 200.0, False),
        (2, "h2", 120.0, False),
        (3, "h2", 115.0, True),
    ):
        store.route("j", f"002#{attempt}", Routed(host=host, at=90.0, until=until, waits=waits))
    assert store.loads(now=100.0) == {"h1": HostLoad(1, 1, 0), "h2": HostLoad(0, 2, 1)}
    # 002#3's wait ended (its park lapses: on its way to the shared queue); 002#2's park too.
    assert store.loads(now=125.0) == {"h1": HostLoad(1, 1, 0)}
    coord.set_running("j", "002#1", _payload("002", 1, host="h1"))  # it arrived: it counts as running
    assert store.loads(now=100.0)["h1"] == HostLoad(2, 0, 0)
    coord.retire("j", 60)  # no job scanned: nothing runs, routes without a running entry are forgotten
    assert "h1" not in store.loads(now=100.0)


def _running_holder(coord: Coordinator, measured_sec: float, image_bytes: int) -> None:
    """h1 (1 slot) holds image a and has just started 001#2, whose task 001#1 measured; h2 (1 slot) is free.

    Both pull at 100 MB/s: h2 would pull a in `image_bytes / 100e6` s.
    """
    store = RedisPlacementStore(coord)
    for host in ("h1", "h2"):
        coord.describe_host(host, HostKit(slots=1))
        coord.beat(host)
    store.report("h1", HostImages(images={pinned([_ref("a")])[0]: image_bytes}, bytes_per_sec=100e6))
    store.report("h2", HostImages(bytes_per_sec=100e6))
    assert coord.store_result("j", "001#1", json.dumps({"measured_sec": measured_sec}))
    running = _payload("001", 2, (_ref("a"),), host="h1")
    assert coord.start("j", "001#2", "owner-h1", 60, cap=8, running=running).claim == Claim.CLAIMED
    coord.run_started("j", "001#2", None, "h1")


@pytest.mark.unit
def test_a_trial_pulls_on_a_free_host_rather_than_wait_longer_for_the_holder(coord: Coordinator) -> None:
    """The holder's slot frees in about 20 s (its trial's task measured 20 s); the pull takes 1 s."""
    _running_holder(coord, measured_sec=20.0, image_bytes=100_000_000)
    placed = cluster_view(coord, RedisPlacementStore(coord), lease_seconds=30)
    [end] = placed.hosts["h1"].ends
    assert 19.0 < end <= 20.0  # from its start (its `running` state) and its task's measured seconds
    choice = placed.choose([_ref("a")], measured=20.0)
    assert choice is not None and (choice.host, choice.until, choice.pulls) == (
        "h2",
        0.0,
        tuple(pinned([_ref("a")])),
    )


@pytest.mark.unit
def test_a_trial_waits_for_the_holder_when_it_frees_sooner_than_the_pull(coord: Coordinator) -> None:
    """The holder's slot frees in about 5 s; the pull takes 60 s: wait there, at most the 60 s saved."""
    _running_holder(coord, measured_sec=5.0, image_bytes=6_000_000_000)
    placed = cluster_view(coord, RedisPlacementStore(coord), lease_seconds=30)
    choice = placed.choose([_ref("a")], measured=5.0)
    assert choice is not None and (choice.host, choice.pulls) == ("h1", ())
    assert choice.until - placed.now == pytest.approx(60.0)
    placed.take(choice)  # it waits in h1's line: the next trial of a would start there in about 10 s
    assert 9.0 < placed.hosts["h1"].frees_in() <= 10.0


@pytest.mark.unit
def test_a_hosts_line_is_the_expected_seconds_of_the_trials_routed_to_it(coord: Coordinator) -> None:
    store = RedisPlacementStore(coord)
    coord.hold("j", [Held(payload=_payload("002", a), expected_sec=1.0) for a in (1, 2, 3)], [], window=1)
    for _ in range(3):
        assert coord.next_waiting("j", 30) is not None  # guarded: running entries no host claimed
    assert coord.store_result("j", "002#1", json.dumps({"measured_sec": 7.5}))
    store.route("j", "002#3", Routed(host="h2", at=91.0, until=200.0, waits=True))
    store.route("j", "002#2", Routed(host="h2", at=90.0, until=200.0))
    # Both by their task's measured seconds, in the order they were routed; 002#1 has no route.
    assert store.lines(now=100.0)["h2"].line == (7.5, 7.5)
    assert store.lines(now=250.0) == {}  # their parks lapsed: on their way to the shared queue
    assert store.estimate("j", _payload("003", 2)) is None  # nothing measured task 003


@pytest.mark.unit
def test_an_unmeasured_trial_runs_as_long_again_as_it_has_and_waits_in_line_for_the_floor(
    coord: Coordinator,
) -> None:
    """Nothing measured task 001: its running trial, 8 s old, is expected to go on 8 s more; a trial of it
    routed to the host and not started counts `UNMEASURED_LINE_SEC` in the host's line."""
    coord.describe_host("h1", HostKit(slots=1))
    coord.beat("h1")
    running = _payload("001", 1, (_ref("a"),), host="h1")
    assert coord.start("j", "001#1", "owner-h1", 60, cap=8, running=running).claim == Claim.CLAIMED
    coord.run_started("j", "001#1", None, "h1")
    coord.hold("j", [Held(payload=_payload("001", 2), expected_sec=1.0)], [], window=1)
    assert coord.next_waiting("j", 30) is not None
    store = RedisPlacementStore(coord)
    store.route("j", "001#2", Routed(host="h1", at=coord.now(), until=coord.now() + 60, waits=True))
    later = coord.now() + 8.0
    line = store.lines(now=later)["h1"]
    assert line.ends == (pytest.approx(8.0, abs=0.5),) and line.line == (UNMEASURED_LINE_SEC,)


def _counted(read: Callable[..., Any], name: str, reads: list[str]) -> Callable[..., Any]:
    def counted(self: object, *args: object) -> Any:
        reads.append(name)
        return read(self, *args)

    return counted


@pytest.mark.unit
def test_a_fill_with_no_placement_job_reads_no_hosts_images(
    coord: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `--placement` a trial goes to the shared queue: fill builds no cluster view for it."""
    from celery import Celery

    store_class = RedisPlacementStore
    reads: list[str] = []
    for name in ("holdings", "loads", "pulling", "lines"):
        monkeypatch.setattr(store_class, name, _counted(getattr(store_class, name), name, reads))
    app = Celery(broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.task_default_queue = f"fill-{uuid.uuid4().hex[:8]}"  # the memory broker is one per process
    coord.describe_host("h1", HostKit(slots=2))
    coord.beat("h1")
    coord.register_share("j", Share(user="u", cap=8, name="j", at=1.0))
    held = [Held(payload=_payload(task, 1, (_ref("a"),)), expected_sec=1.0) for task in ("001", "002")]
    coord.hold("j", held, [], window=1)
    assert fill(app, coord, lease_seconds=30) == 2
    assert reads == []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(app.conf.task_default_queue)
        assert queue.qsize() == 2  # both on the shared queue
        queue.close()
    # A job with placement on: the same fill reads the hosts' reports, loads and pulling marks.
    coord.register_share("k", Share(user="u", cap=8, name="k", at=2.0, placement=True))
    coord.hold("k", [Held(payload=_payload("003", 1, (_ref("b"),)), expected_sec=1.0)], [], window=1)
    assert fill(app, coord, lease_seconds=30) == 0  # h1's two slots are taken
    assert sorted(reads) == ["holdings", "lines", "loads", "pulling"]


# --- fill over Redis and Celery: which host's queue each trial is sent to -------------------------


@pytest.mark.integration
def test_fill_sends_each_trial_to_the_queue_of_a_host_holding_its_images(redis_server: RedisServer) -> None:
    from sciencebench.coordination.celery_app import create_app
    from sciencebench.core.settings import Settings

    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    coord = RedisCoordinator(redis_server.url)
    app = create_app(Settings.from_env({"SCIENCEBENCH_BROKER_URL": redis_server.url}))
    store = RedisPlacementStore(coord)
    a, b, c = _ref("a"), _ref("b"), _ref("c")
    for host in ("h1", "h2"):
        coord.describe_host(host, HostKit(slots=2))
        coord.beat(host)
    store.report("h1", HostImages(images={pinned([a])[0]: GB}, bytes_per_sec=100e6))
    store.report("h2", HostImages(images={pinned([b])[0]: 6 * GB}, bytes_per_sec=100e6))
    coord.register_share(JOB, Share(user="u", cap=8, name="j", at=1.0, placement=True))
    held = [("001", 1, a), ("001", 2, a), ("001", 3, a), ("002", 1, b), ("003", 1, c)]
    coord.hold(JOB, [Held(payload=_payload(t, n, (ref,)), expected_sec=10.0 - i) for i, (t, n, ref) in
                     enumerate(held)], [], window=1)  # fmt: skip
    try:
        assert fill(app, coord, lease_seconds=30) == 5
        queued = {host: _queued(client, host_queue("celery", host)) for host in ("h1", "h2")}
        # a's trials go to h1 (two slots, then one waits there: nothing measured its two trials, so they
        # may end any moment, before h2 could pull a's 1 GiB in 10.7 s); b's to h2; c (nobody has it) to
        # the host with a free slot left.
        assert queued == {"h1": ["001#1", "001#2", "001#3"], "h2": ["002#1", "003#1"]}
        assert _queued(client, "celery") == []
        routes = [Routed.model_validate_json(v) for v in client.hvals("sciencebench:place:routed")]
        assert sorted((r.host, r.waits) for r in routes) == [("h1", False), ("h1", False), ("h1", True),
                                                            ("h2", False), ("h2", False)]  # fmt: skip
        assert coord.share_load(JOB).sent == 4  # the waiting one takes no slot: fair share leaves it out
        # The waiting trial's parked lease lapses when its wait ends (the 10.7 s pull it saves): then the
        # watchdog sends it anywhere.
        lease = client.pttl(f"sciencebench:{JOB}:lease:001#3")
        assert 10_000 < lease <= GB / 100e6 * 1000, lease
        assert client.get(f"sciencebench:{JOB}:lease:001#3") == parking_token("celery-001-3")
        assert set(store.pulling(coord.now())) == {pinned([c])[0]}  # h2 pulls c for its trial
        coord.hold(JOB, [Held(payload=_payload("004", 1, (a,)), expected_sec=1.0)], [], window=1)
        assert fill(app, coord, lease_seconds=30) == 0  # no host has a free slot: it stays in the store
        assert coord.share_load(JOB).waiting == 1
    finally:
        coord.close()
        client.close()


def _queued(client: redis.Redis, queue: str) -> list[str]:
    """The trial keys of the messages in a Celery queue (a Redis list), oldest first."""
    messages = [json.loads(raw) for raw in reversed(client.lrange(queue, 0, -1))]
    return [json.loads(_body(m))[0][0]["task_id"] + "#" + str(json.loads(_body(m))[0][0]["attempt"])
            for m in messages]  # fmt: skip


def _body(message: dict[str, object]) -> str:
    import base64

    return base64.b64decode(str(message["body"])).decode()


@pytest.mark.integration
def test_a_trial_sent_to_a_host_that_never_takes_it_goes_back_to_the_shared_queue(
    redis_server: RedisServer,
) -> None:
    """A host that pauses or dies before its routed trial starts: the park lapses, the watchdog re-sends."""
    import time

    from sciencebench.coordination.celery_app import create_app
    from sciencebench.coordination.watchdog import redispatch_orphans
    from sciencebench.core.settings import Settings

    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    coord = RedisCoordinator(redis_server.url)
    app = create_app(Settings.from_env({"SCIENCEBENCH_BROKER_URL": redis_server.url}))
    lease = 0.5
    try:
        coord.describe_host("h1", HostKit(slots=1))
        coord.beat("h1")
        coord.register_share("j", Share(user="u", cap=8, name="j", at=1.0, placement=True))
        coord.hold("j", [Held(payload=_payload("001", 1, (_ref("a"),)), expected_sec=1.0)], [], window=1)
        assert fill(app, coord, lease_seconds=lease) == 1
        assert _queued(client, host_queue("celery", "h1")) == ["001#1"]
        assert redispatch_orphans(app, coord, lease) == 0  # parked for its message: not lost yet
        coord.pause_host("h1", "disk full")  # ... and it never takes the trial
        time.sleep(lease + 0.2)
        assert redispatch_orphans(app, coord, lease) == 1
        assert _queued(client, "celery") == ["001#1"]  # any host takes it now
    finally:
        coord.close()
        client.close()
