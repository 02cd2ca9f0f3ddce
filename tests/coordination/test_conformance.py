"""One conformance suite for both coordination implementations (no Docker needed).

Every case runs against `RedisCoordinator` on a real redis-server and against
`MemoryCoordinator`: the embedded mode must keep exactly the contract a
cluster keeps.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from sciencebench.coordination.memory import MemoryCoordinator
from sciencebench.coordination.protocol import Coordinator
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.models import Redispatch, TrialSpec, TrialState
from tests.fixtures.services import RedisServer

TTL = 0.4  # seconds: short enough to watch a lease expire


@pytest.fixture(
    params=[
        pytest.param("memory", marks=pytest.mark.unit),
        pytest.param("redis", marks=pytest.mark.integration),
    ]
)
def coord(request: pytest.FixtureRequest) -> Iterator[Coordinator]:
    if request.param == "memory":
        yield MemoryCoordinator()
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    redis.Redis.from_url(server.url).flushdb()
    yield RedisCoordinator(server.url)


def _payload(task_id: str = "001", attempt: int = 1) -> Redispatch:
    trial = TrialSpec(
        job_name="j", jobs_dir=Path("/jobs"), task_id=task_id, attempt=attempt,
        task_dir=Path(f"/sel/task_{task_id}"), task_toml_sha256="x", image_refs=[], expected_sec=1.0,
    )  # fmt: skip
    return Redispatch(task_id=f"celery-{task_id}", trial=trial, group_id="g", group_index=0, host="h1")


# --- results ---------------------------------------------------------------------


def test_results_round_trip_and_clear(coord: Coordinator) -> None:
    assert coord.get_result("j", "001#1") is None
    coord.store_result("j", "001#1", '{"a": 1}')
    coord.store_result("j", "001#1", '{"a": 2}')
    assert coord.get_result("j", "001#1") == '{"a": 2}'
    assert coord.get_result("other", "001#1") is None
    coord.mark_counted("j", "001#1")
    assert coord.is_counted("j", "001#1")
    assert not coord.is_counted("j", "001#2")
    coord.clear_result("j", "001#1")
    assert coord.get_result("j", "001#1") is None
    assert not coord.is_counted("j", "001#1")


# --- leases ----------------------------------------------------------------------


def test_a_lease_has_one_owner_until_released(coord: Coordinator) -> None:
    assert coord.claim("j", "001#1", "a", 30)
    assert not coord.claim("j", "001#1", "b", 30)
    assert coord.claim("j", "001#2", "b", 30)  # another trial
    assert coord.renew("j", "001#1", "a", 30)
    assert not coord.renew("j", "001#1", "b", 30)
    coord.release("j", "001#1", "b")  # not b's to release
    assert not coord.claim("j", "001#1", "c", 30)
    coord.release("j", "001#1", "a")
    assert coord.claim("j", "001#1", "c", 30)


def test_a_lease_expires_unless_renewed(coord: Coordinator) -> None:
    assert coord.claim("j", "001#1", "a", TTL)
    time.sleep(TTL * 0.6)
    assert coord.renew("j", "001#1", "a", TTL)
    time.sleep(TTL * 0.6)
    assert not coord.claim("j", "001#1", "b", TTL)  # renewed: still a's
    time.sleep(TTL * 1.5)
    assert coord.claim("j", "001#1", "b", TTL)


def test_renew_recreates_a_lapsed_lease_nobody_took(coord: Coordinator) -> None:
    # What lets a live worker keep its trial across a broker outage longer than the lease.
    assert coord.claim("j", "001#1", "a", TTL)
    time.sleep(TTL * 1.5)
    assert coord.renew("j", "001#1", "a", 30)
    assert not coord.claim("j", "001#1", "b", 30)


def test_running_trials_without_a_lease_are_orphans(coord: Coordinator) -> None:
    assert coord.orphaned() == []
    assert coord.claim("j", "001#1", "a", TTL)
    coord.set_running("j", "001#1", _payload("001"))
    assert coord.claim("j", "002#1", "b", 30)
    coord.set_running("j", "002#1", _payload("002"))
    assert coord.orphaned() == []
    time.sleep(TTL * 1.5)
    orphans = coord.orphaned()
    assert [(job, key) for job, key, _ in orphans] == [("j", "001#1")]
    assert orphans[0][2] == _payload("001")
    coord.clear_running("j", "001#1")
    assert coord.orphaned() == []


def test_a_retired_job_is_not_scanned_for_orphans(coord: Coordinator) -> None:
    assert coord.claim("j", "001#1", "a", TTL)
    coord.set_running("j", "001#1", _payload())
    coord.retire("j", 3600)
    time.sleep(TTL * 1.5)
    assert coord.orphaned() == []


def test_try_lock_excludes_until_it_expires(coord: Coordinator) -> None:
    assert coord.try_lock("redispatch:j:001#1", TTL)
    assert not coord.try_lock("redispatch:j:001#1", TTL)
    assert coord.try_lock("redispatch:j:002#1", TTL)
    time.sleep(TTL * 1.5)
    assert coord.try_lock("redispatch:j:001#1", TTL)


# --- slots -----------------------------------------------------------------------


def test_slots_cap_the_job_and_free_up(coord: Coordinator) -> None:
    assert coord.acquire_slot("j", "001#1", 2, 30)
    assert coord.acquire_slot("j", "002#1", 2, 30)
    assert not coord.acquire_slot("j", "003#1", 2, 30)
    assert coord.acquire_slot("j", "001#1", 2, 30)  # a holder refreshes its own slot
    assert coord.acquire_slot("other", "003#1", 2, 30)  # caps are per job
    coord.release_slot("j", "002#1")
    assert coord.acquire_slot("j", "003#1", 2, 30)


def test_an_unrefreshed_slot_expires(coord: Coordinator) -> None:
    assert coord.acquire_slot("j", "001#1", 1, TTL)
    assert not coord.acquire_slot("j", "002#1", 1, TTL)
    time.sleep(TTL * 1.5)
    assert coord.acquire_slot("j", "002#1", 1, TTL)


# --- job control -----------------------------------------------------------------


def test_cancel_and_uncancel(coord: Coordinator) -> None:
    assert not coord.is_cancelled("j")
    coord.cancel("j")
    assert coord.is_cancelled("j")
    assert not coord.is_cancelled("other")
    coord.uncancel("j")
    assert not coord.is_cancelled("j")


def test_retire_expires_the_jobs_state(coord: Coordinator) -> None:
    coord.store_result("j", "001#1", "{}")
    coord.set_state("j", "001#1", TrialState.DONE, "h1")
    coord.cancel("j")
    coord.store_result("other", "001#1", "{}")
    coord.retire("j", 1)
    assert coord.get_result("j", "001#1") == "{}"  # kept for a while
    time.sleep(1.5)
    assert coord.get_result("j", "001#1") is None
    assert coord.states("j") == {}
    assert not coord.is_cancelled("j")
    assert coord.get_result("other", "001#1") == "{}"


# --- board -----------------------------------------------------------------------


def test_states_show_the_latest_state_and_host(coord: Coordinator) -> None:
    assert coord.states("j") == {}
    coord.set_states("j", ["001#1", "002#1"], TrialState.QUEUED)
    coord.set_state("j", "001#1", TrialState.RUNNING, "w1@host")
    states = coord.states("j")
    assert set(states) == {"001#1", "002#1"}
    assert (states["001#1"].state, states["001#1"].host) == (TrialState.RUNNING, "w1@host")
    assert (states["002#1"].state, states["002#1"].host) == (TrialState.QUEUED, "")
    assert states["001#1"].at >= states["002#1"].at > 0
    coord.set_states("j", [], TrialState.FAILED)  # nothing to do
    assert len(coord.states("j")) == 2


def test_patiently_returns_what_the_call_returns(coord: Coordinator) -> None:
    assert coord.patiently(lambda: 42) == 42
    assert coord.recovered_at == float("-inf")
