"""A host's capacity in the store (`Slots.take_room`): the fit rule, taken and freed atomically, lapsing."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sciencebench.coordination.models import Held
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.coordination.shares import Share
from sciencebench.core.capacity import Request
from sciencebench.core.models import Redispatch, TrialSpec

pytestmark = pytest.mark.unit

HOST = Request(cpus=2, memory_mb=8192)
ONE, TWO = Request(cpus=1, memory_mb=2048), Request(cpus=2, memory_mb=2048)
TTL = 0.4


def test_trials_take_the_host_capacity_only_while_their_requests_fit(store: RedisCoordinator) -> None:
    assert store.take_room("h1", "j/001#1", ONE, HOST, 30)
    assert not store.take_room("h1", "j/002#1", TWO, HOST, 30)  # 1 + 2 cpus > 2
    assert store.take_room("h1", "j/003#1", ONE, HOST, 30)
    assert store.take_room("h1", "j/001#1", ONE, HOST, 30)  # its holder refreshes: never refused
    assert not store.take_room("h1", "j/004#1", Request(cpus=0.5, memory_mb=1), HOST, 30)
    assert store.room_used(["h1", "h2"]) == {"h1": (Request(cpus=2, memory_mb=4096), 2),
                                             "h2": (Request(cpus=0, memory_mb=0), 0)}  # fmt: skip
    store.free_room("h1", "j/001#1")
    store.free_room("h1", "j/003#1")
    assert store.take_room("h1", "j/002#1", TWO, HOST, 30)
    assert store.take_room("h2", "j/005#1", TWO, HOST, 30)  # another host's capacity is its own
    # Memory binds as well as CPUs.
    assert not store.take_room("h2", "j/006#1", Request(cpus=0, memory_mb=6145), HOST, 30)


def test_a_dead_holders_capacity_comes_back_when_its_lease_lapses(store: RedisCoordinator) -> None:
    assert store.take_room("h1", "j/001#1", TWO, HOST, TTL)
    assert not store.take_room("h1", "j/002#1", ONE, HOST, 30)
    time.sleep(TTL + 0.2)  # its host died: nobody refreshed it
    assert store.room_used(["h1"])["h1"][1] == 0
    assert store.take_room("h1", "j/002#1", ONE, HOST, 30)
    assert store.room_used(["h1"])["h1"] == (ONE, 1)


def test_concurrent_takers_never_exceed_the_capacity(store: RedisCoordinator) -> None:
    with ThreadPoolExecutor(8) as pool:
        taken = list(pool.map(lambda i: store.take_room("h1", f"j/{i:03d}#1", ONE, HOST, 30), range(16)))
    assert sum(taken) == 2
    assert store.room_used(["h1"])["h1"] == (Request(cpus=2, memory_mb=4096), 2)


def _held(job: str, task_id: str, cpus: float) -> Held:
    trial = TrialSpec(
        job_id=uuid.UUID(int=1), job_name=job, jobs_dir=Path("/jobs"), task_id=task_id, attempt=1,
        task_dir=Path(f"/sel/task_{task_id}"), task_toml_sha256="x", image_refs=[], expected_sec=1.0,
        cpus=cpus, memory_mb=2048,
    )  # fmt: skip
    return Held(payload=Redispatch(task_id=f"c-{task_id}", trial=trial, group_id="g", group_index=0),
                expected_sec=1.0)  # fmt: skip


def test_fair_share_in_the_store_counts_what_each_busy_trial_asks(store: RedisCoordinator) -> None:
    total = Request(cpus=8, memory_mb=64 * 1024)
    # alice's job mixes 1- and 4-CPU tasks (its largest request is 4); bob's asks 2 CPUs each.
    store.register_share("small", Share(user="alice", cap=8, at=1.0, cpus=4, memory_mb=2048))
    store.register_share("big", Share(user="bob", cap=8, at=2.0, cpus=2, memory_mb=2048))
    store.hold("small", [_held("small", f"{i:03d}", 1 if i < 5 else 4) for i in range(1, 8)], [], window=1)
    store.hold("big", [_held("big", f"{i:03d}", 2) for i in range(1, 6)], [], window=1)
    for key in ("001#1", "002#1"):  # alice runs two 1-CPU trials: 2 of 8 CPUs, as bob's one 2-CPU trial
        assert store.acquire_slot("small", key, 8, 30)
    assert store.acquire_slot("big", "001#1", 8, 30)
    assert store.choose_share(16) == "big"  # by trials bob is below
    # By dominant share: alice (2 + her next, up to 4) / 8 against bob's (2 + 2) / 8: bob.
    assert store.choose_share(16, total) == "big"
    store.share_sent("big", "002#1")  # bob now holds 4 of 8, alice 2
    assert store.choose_share(16, total) == "big"  # alice's next (4) does not fit beside 6; bob's (2) does
    store.share_sent("big", "003#1")
    assert store.choose_share(16, total) is None  # 8 of 8 in use
    assert store.choose_share(16, Request(cpus=16, memory_mb=64 * 1024)) == "small"  # 2 + 4 of 16 vs 6 + 2
