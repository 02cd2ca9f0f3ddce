"""The coordination contract, checked against `RedisCoordinator` on a real redis-server (no Docker).

The cluster and the embedded mode run this one implementation (the embedded
mode on its private server, `coordination.embedded`); each case runs on the
session's embedded store (the `store` fixture), emptied for it.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from sciencebench.coordination.history import SAMPLES
from sciencebench.coordination.protocol import Claim, Coordinator, Held, HostKit
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.models import Redispatch, TrialRecord, TrialSpec, TrialState, TrialStatus
from tests.fixtures.leases import claim as _claim

TTL = 0.4  # seconds: short enough to watch a lease expire
JOB_ID = uuid.UUID("00000000-0000-4000-8000-000000000001")


pytestmark = pytest.mark.unit


@pytest.fixture
def coord(store: RedisCoordinator) -> Coordinator:
    return store


def _payload(task_id: str = "001", attempt: int = 1) -> Redispatch:
    trial = TrialSpec(
        job_id=JOB_ID, job_name="j", jobs_dir=Path("/jobs"), task_id=task_id, attempt=attempt,
        task_dir=Path(f"/sel/task_{task_id}"), task_toml_sha256="x", image_refs=[], expected_sec=1.0,
    )  # fmt: skip
    return Redispatch(task_id=f"celery-{task_id}", trial=trial, group_id="g", group_index=0, host="h1")


# --- results ---------------------------------------------------------------------


def test_results_are_stored_once_and_cleared(coord: Coordinator) -> None:
    assert coord.get_result("j", "001#1") is None
    assert coord.store_result("j", "001#1", '{"a": 1}')
    assert not coord.store_result("j", "001#1", '{"a": 2}')  # one record per trial
    assert coord.get_result("j", "001#1") == '{"a": 1}'
    assert coord.get_result("other", "001#1") is None
    coord.mark_counted("j", "001#1")
    assert coord.is_counted("j", "001#1")
    assert not coord.is_counted("j", "001#2")
    coord.clear_result("j", "001#1")
    assert coord.get_result("j", "001#1") is None
    assert not coord.is_counted("j", "001#1")


# --- leases ----------------------------------------------------------------------


def test_a_lease_has_one_owner_until_finished(coord: Coordinator) -> None:
    assert _claim(coord, "j", "001#1", "a", 30) is Claim.CLAIMED
    assert _claim(coord, "j", "001#1", "b", 30) is Claim.HELD
    assert _claim(coord, "j", "001#2", "b", 30) is Claim.CLAIMED  # another trial
    assert coord.renew("j", "001#1", "a", 30)
    assert not coord.renew("j", "001#1", "b", 30)
    assert not coord.finish("j", "001#1", "b")  # not b's to give back
    assert _claim(coord, "j", "001#1", "c", 30) is Claim.HELD
    assert coord.finish("j", "001#1", "a")
    assert _claim(coord, "j", "001#1", "c", 30) is Claim.CLAIMED


def test_a_trial_with_a_counted_result_is_never_claimed_again(coord: Coordinator) -> None:
    assert coord.store_result("j", "001#1", "{}")
    coord.mark_counted("j", "001#1")
    assert _claim(coord, "j", "001#1", "a", 30) is Claim.ANSWERED
    assert not coord.is_leased("j", "001#1")


def test_a_result_not_counted_is_claimed_to_answer_with_it(coord: Coordinator) -> None:
    # a commits, then its host is lost before the chord counts the answer: a keeps the lease
    # and running entry until the count, so a copy waits, then takes both over to answer.
    entry = _payload().model_copy(update={"owner": "a"})
    assert coord.start("j", "001#1", "a", TTL, cap=1, running=entry).claim is Claim.CLAIMED
    assert coord.commit_result("j", "001#1", "a", "{}")
    assert _claim(coord, "j", "001#1", "b", TTL) is Claim.HELD  # a still answers
    time.sleep(TTL * 1.5)
    assert [(j, k) for j, k, _ in coord.orphaned()] == [("j", "001#1")]  # the watchdog sends it again
    assert coord.take_orphan("j", "001#1")
    copy = _payload().model_copy(update={"owner": "c"})
    found = coord.start("j", "001#1", "c", 30, cap=1, running=copy)
    assert (found.claim, found.slot, found.cancelled) == (Claim.RECORDED, False, False)
    assert coord.is_leased("j", "001#1")
    assert not coord.renew("j", "001#1", "a", TTL)  # a is not the holder any more
    assert _claim(coord, "j", "001#1", "d", 30) is Claim.HELD  # only c answers
    coord.mark_counted("j", "001#1")
    assert coord.finish("j", "001#1", "c")
    assert coord.orphaned() == []
    assert _claim(coord, "j", "001#1", "d", 30) is Claim.ANSWERED


def test_a_lease_expires_unless_renewed(coord: Coordinator) -> None:
    assert _claim(coord, "j", "001#1", "a", TTL) is Claim.CLAIMED
    time.sleep(TTL * 0.6)
    assert coord.renew("j", "001#1", "a", TTL)
    time.sleep(TTL * 0.6)
    assert _claim(coord, "j", "001#1", "b", TTL) is Claim.HELD  # renewed: still a's
    time.sleep(TTL * 1.5)
    assert _claim(coord, "j", "001#1", "b", TTL) is Claim.CLAIMED


def test_start_claims_then_reads_the_cancel_flag_and_takes_a_slot(coord: Coordinator) -> None:
    first = coord.start("j", "001#1", "a", 30, cap=1)
    assert (first.claim, first.cancelled, first.slot) == (Claim.CLAIMED, False, True)
    held = coord.start("j", "001#1", "b", 30, cap=1)
    assert (held.claim, held.slot) == (Claim.HELD, False)
    no_slot = coord.start("j", "002#1", "b", 30, cap=1)  # claimed, but the job's one slot is taken
    assert (no_slot.claim, no_slot.cancelled, no_slot.slot) == (Claim.CLAIMED, False, False)
    coord.cancel("j")
    cancelled = coord.start("j", "003#1", "c", 30, cap=5)
    assert (cancelled.claim, cancelled.cancelled, cancelled.slot) == (Claim.CLAIMED, True, False)
    assert coord.commit_result("j", "001#1", "a", "{}")
    assert coord.start("j", "001#1", "d", 30, cap=5).claim is Claim.HELD  # a answers
    coord.mark_counted("j", "001#1")
    assert coord.start("j", "001#1", "d", 30, cap=5).claim is Claim.ANSWERED


def test_the_commit_sets_the_board_state_with_the_record(coord: Coordinator) -> None:
    assert _claim(coord, "j", "001#1", "a", 30) is Claim.CLAIMED
    coord.run_started("j", "001#1", _payload().model_copy(update={"owner": "a"}), "h1")
    assert coord.states("j")["001#1"].state == TrialState.RUNNING
    done = TrialStatus(state=TrialState.DONE, host="h1", at=1.0)
    assert coord.commit_result("j", "001#1", "a", "{}", done)
    assert coord.states("j")["001#1"] == done
    assert not coord.commit_result("j", "001#1", "a", "{}", TrialStatus(state=TrialState.FAILED, at=2.0))
    assert coord.states("j")["001#1"] == done


def test_a_lapsed_lease_is_lost_once_the_trial_was_sent_elsewhere(coord: Coordinator) -> None:
    # Fencing: a host cut off (or paused) longer than its lease, whose trial a watchdog
    # sent again (clearing its running entry), never gets the trial back.
    assert _claim(coord, "j", "001#1", "a", TTL) is Claim.CLAIMED
    coord.set_running("j", "001#1", _payload("001").model_copy(update={"owner": "a"}))
    time.sleep(TTL * 1.5)
    assert coord.take_orphan("j", "001#1")  # what the watchdog does before sending it again
    assert not coord.renew("j", "001#1", "a", 30)
    assert not coord.commit_result("j", "001#1", "a", '{"by": "a"}')
    assert _claim(coord, "j", "001#1", "b", 30) is Claim.CLAIMED
    assert not coord.renew("j", "001#1", "a", 30)


def test_a_lease_lapsed_in_an_outage_returns_to_its_holder(coord: Coordinator) -> None:
    # Nobody could renew (the broker was away) and nobody took the trial: it is still a's.
    assert _claim(coord, "j", "001#1", "a", TTL) is Claim.CLAIMED
    coord.set_running("j", "001#1", _payload("001").model_copy(update={"owner": "a"}))
    time.sleep(TTL * 1.5)
    assert not coord.renew("j", "001#1", "b", 30)  # a stranger is not its holder
    assert coord.renew("j", "001#1", "a", TTL)
    assert _claim(coord, "j", "001#1", "b", 30) is Claim.HELD
    time.sleep(TTL * 1.5)  # lapsed again; the entry still names a: a may commit
    assert coord.commit_result("j", "001#1", "a", '{"by": "a"}')


def test_only_the_lease_holder_commits_and_only_once(coord: Coordinator) -> None:
    assert _claim(coord, "j", "001#1", "a", TTL) is Claim.CLAIMED
    assert not coord.commit_result("j", "001#1", "b", '{"by": "b"}')
    time.sleep(TTL * 1.5)
    assert _claim(coord, "j", "001#1", "b", 30) is Claim.CLAIMED  # a's lease lapsed; b runs it again
    assert not coord.commit_result("j", "001#1", "a", '{"by": "a"}')  # a finishes late: discarded
    assert coord.commit_result("j", "001#1", "b", '{"by": "b"}')
    assert not coord.commit_result("j", "001#1", "b", '{"by": "b again"}')
    assert coord.get_result("j", "001#1") == '{"by": "b"}'


def test_a_parked_lease_is_taken_over_only_by_its_message(coord: Coordinator) -> None:
    assert coord.park("j", "001#1", "parked:m1", 30)
    assert coord.park("j", "001#1", "parked:m1", 30)  # parking again extends it
    assert _claim(coord, "j", "001#1", "a", 30) is Claim.HELD  # another copy waits
    assert _claim(coord, "j", "001#1", "a", 30, parked="parked:m2") is Claim.HELD
    assert _claim(coord, "j", "001#1", "a", 30, parked="parked:m1") is Claim.CLAIMED
    assert not coord.park("j", "001#1", "parked:m1", 30)  # a live holder is never parked over


def test_a_counted_trial_is_not_parked_again(coord: Coordinator) -> None:
    # A late copy handed back after the finalizer ran must not bring the job back to the watchdog's scan.
    assert coord.store_result("j", "001#1", '{"a": 1}')
    coord.mark_counted("j", "001#1")
    assert not coord.park("j", "001#1", "parked:m1", 30)
    assert not coord.is_leased("j", "001#1")


def test_a_parked_trial_whose_copy_is_lost_is_an_orphan(coord: Coordinator) -> None:
    assert coord.park("j", "001#1", "parked:m1", TTL)
    coord.set_running("j", "001#1", _payload("001"))
    assert coord.orphaned() == []
    time.sleep(TTL * 1.5)
    assert [(job, key) for job, key, _ in coord.orphaned()] == [("j", "001#1")]


def test_running_trials_without_a_lease_are_orphans(coord: Coordinator) -> None:
    assert coord.orphaned() == []
    assert _claim(coord, "j", "001#1", "a", TTL) is Claim.CLAIMED
    coord.set_running("j", "001#1", _payload("001"))
    assert _claim(coord, "j", "002#1", "b", 30) is Claim.CLAIMED
    coord.set_running("j", "002#1", _payload("002"))
    assert coord.orphaned() == []
    time.sleep(TTL * 1.5)
    orphans = coord.orphaned()
    assert [(job, key) for job, key, _ in orphans] == [("j", "001#1")]
    assert orphans[0][2] == _payload("001")
    assert coord.take_orphan("j", "001#1")
    assert coord.orphaned() == []


def test_an_orphan_is_taken_once_and_its_old_holder_is_fenced(coord: Coordinator) -> None:
    assert _claim(coord, "j", "001#1", "a", TTL) is Claim.CLAIMED
    coord.set_running("j", "001#1", _payload().model_copy(update={"owner": "a"}))
    assert not coord.take_orphan("j", "001#1")  # the lease is live: not an orphan
    time.sleep(TTL * 1.5)
    assert coord.take_orphan("j", "001#1")
    assert not coord.take_orphan("j", "001#1")  # one watchdog sends it again, not two
    assert not coord.renew("j", "001#1", "a", TTL)  # its old holder cannot come back


def test_a_late_renewal_before_the_take_keeps_the_trial(coord: Coordinator) -> None:
    assert _claim(coord, "j", "001#1", "a", TTL) is Claim.CLAIMED
    coord.set_running("j", "001#1", _payload().model_copy(update={"owner": "a"}))
    time.sleep(TTL * 1.5)
    assert coord.renew("j", "001#1", "a", TTL)  # lapsed, but no watchdog acted yet
    assert not coord.take_orphan("j", "001#1")
    assert coord.orphaned() == []


def test_a_retired_job_is_not_scanned_for_orphans(coord: Coordinator) -> None:
    assert _claim(coord, "j", "001#1", "a", TTL) is Claim.CLAIMED
    coord.set_running("j", "001#1", _payload())
    coord.retire("j", 3600)
    time.sleep(TTL * 1.5)
    assert coord.orphaned() == []


def test_retiring_never_lengthens_a_live_lease(coord: Coordinator) -> None:
    assert _claim(coord, "j", "001#1", "a", TTL) is Claim.CLAIMED
    coord.retire("j", 3600)
    time.sleep(TTL * 1.5)
    assert _claim(coord, "j", "001#1", "b", TTL) is Claim.CLAIMED  # lapsed on time


def test_a_retired_job_forgets_its_keys_but_not_later_writes(coord: Coordinator) -> None:
    assert coord.store_result("j", "001#1", '{"a": 1}')
    coord.retire("j", 1)
    coord.mark_counted("j", "002#1")  # a plain write after retiring keeps no expiry (as SET)
    coord.set_running("j", "003#1", _payload("003"))  # running alone never lists the job
    time.sleep(1.3)
    assert coord.get_result("j", "001#1") is None
    assert coord.is_counted("j", "002#1")
    assert coord.orphaned() == []


def test_try_lock_excludes_until_it_expires(coord: Coordinator) -> None:
    assert coord.try_lock("redispatch:j:001#1", TTL)
    assert not coord.try_lock("redispatch:j:001#1", TTL)
    assert coord.try_lock("redispatch:j:002#1", TTL)
    time.sleep(TTL * 1.5)
    assert coord.try_lock("redispatch:j:001#1", TTL)


def test_an_unlocked_lock_can_be_taken_at_once(coord: Coordinator) -> None:
    assert coord.try_lock("shares-fill", 60)
    assert not coord.try_lock("shares-fill", 60)
    coord.unlock("shares-fill")
    assert coord.try_lock("shares-fill", 60)
    coord.unlock("never-taken")  # nothing to release: no error


# --- slots -----------------------------------------------------------------------


def test_slots_cap_the_job_and_free_up(coord: Coordinator) -> None:
    assert coord.acquire_slot("j", "001#1", 2, 30)
    assert coord.acquire_slot("j", "002#1", 2, 30)
    assert not coord.acquire_slot("j", "003#1", 2, 30)
    assert coord.acquire_slot("j", "001#1", 2, 30)  # a holder refreshes its own slot
    assert coord.acquire_slot("other", "003#1", 2, 30)  # caps are per job
    assert _claim(coord, "j", "002#1", "b", 30) is Claim.CLAIMED
    assert coord.finish("j", "002#1", "b")  # the trial ends: its slot frees
    assert coord.acquire_slot("j", "003#1", 2, 30)


def test_finishing_gives_back_slot_running_entry_and_lease(coord: Coordinator) -> None:
    assert _claim(coord, "j", "001#1", "a", 30) is Claim.CLAIMED
    coord.set_running("j", "001#1", _payload().model_copy(update={"owner": "a"}))
    assert coord.acquire_slot("j", "001#1", 1, 30)
    assert coord.is_leased("j", "001#1")
    assert coord.finish("j", "001#1", "a")
    assert not coord.is_leased("j", "001#1")
    assert coord.acquire_slot("j", "002#1", 1, 30)
    assert _claim(coord, "j", "001#1", "b", TTL) is Claim.CLAIMED
    time.sleep(TTL * 1.5)
    assert coord.orphaned() == []  # no running entry left behind


def test_freeing_the_slot_of_a_committed_trial_keeps_its_lease_and_running_entry(coord: Coordinator) -> None:
    assert coord.start(
        "j", "001#1", "a", TTL, cap=1, running=_payload().model_copy(update={"owner": "a"})
    ).slot
    assert coord.commit_result("j", "001#1", "a", "{}")
    assert not coord.free_slot("j", "001#1", "b")  # not b's
    assert not coord.acquire_slot("j", "002#1", 1, 30)
    assert coord.free_slot("j", "001#1", "a")
    assert coord.acquire_slot("j", "002#1", 1, 30)  # the run is over: its slot is another's
    assert coord.is_leased("j", "001#1")  # until the chord counts it
    time.sleep(TTL * 1.5)
    assert [k for _, k, _ in coord.orphaned()] == ["001#1"]  # its host lost before the count: sent again
    assert coord.finish("j", "001#1", "a")  # counted after all (a's entry still names it)
    assert coord.orphaned() == []


def test_a_copy_that_lost_the_trial_frees_nothing_of_its_successor(coord: Coordinator) -> None:
    assert _claim(coord, "j", "001#1", "a", TTL) is Claim.CLAIMED
    coord.set_running("j", "001#1", _payload().model_copy(update={"owner": "a"}))
    time.sleep(TTL * 1.5)
    assert coord.take_orphan("j", "001#1")  # sent again; c runs it now
    assert _claim(coord, "j", "001#1", "c", TTL) is Claim.CLAIMED
    coord.set_running("j", "001#1", _payload().model_copy(update={"owner": "c"}))
    assert coord.acquire_slot("j", "001#1", 1, 30)
    assert not coord.finish("j", "001#1", "a")  # a comes back late
    assert not coord.free_slot("j", "001#1", "a")
    assert coord.is_leased("j", "001#1")
    assert not coord.acquire_slot("j", "002#1", 1, 30)  # c keeps its slot
    time.sleep(TTL * 1.5)  # c's host dies too: its trial is still an orphan
    assert [key for _, key, _ in coord.orphaned()] == ["001#1"]


def test_an_unrefreshed_slot_expires(coord: Coordinator) -> None:
    assert coord.acquire_slot("j", "001#1", 1, TTL)
    assert not coord.acquire_slot("j", "002#1", 1, TTL)
    time.sleep(TTL * 1.5)
    assert coord.acquire_slot("j", "002#1", 1, TTL)


def test_trials_waiting_for_a_slot_are_woken_in_order(coord: Coordinator) -> None:
    assert coord.next_waiting("j", 30) is None
    coord.wait_for_slot("j", _payload("001"))
    coord.wait_for_slot("j", _payload("002"))
    coord.wait_for_slot("other", _payload("003"))
    assert coord.next_waiting("j", 30) == _payload("001")
    assert coord.next_waiting("j", 30) == _payload("002")
    assert coord.next_waiting("j", 30) is None


def test_a_trial_waits_for_a_slot_once(coord: Coordinator) -> None:
    for _ in range(10):  # parked for a slot again and again
        coord.wait_for_slot("j", _payload("001"))
    coord.wait_for_slot("j", _payload("002"))
    newer = _payload("001").model_copy(update={"host": "h2"})
    coord.wait_for_slot("j", newer)
    assert coord.next_waiting("j", 30) == newer  # its first place, its latest payload
    assert coord.next_waiting("j", 30) == _payload("002")
    assert coord.next_waiting("j", 30) is None
    coord.wait_for_slot("j", _payload("001"))  # it may wait again after being woken
    assert coord.next_waiting("j", 30) == _payload("001")


def _held(task_id: str, attempt: int, expected: float) -> Held:
    return Held(payload=_payload(task_id, attempt), expected_sec=expected)


def _record(task_id: str, attempt: int, harness: float | None, exception: str | None = None) -> str:
    timings = {"pull": 9.0} if harness is None else {"pull": 9.0, "harness": harness}
    return TrialRecord(job_id=JOB_ID, job_name="j", task_id=task_id, attempt=attempt,
                       exception_type=exception, timings_sec=timings).model_dump_json()  # fmt: skip


def _keys(payloads: list[Redispatch | None]) -> list[str | None]:
    return [p.trial.key if p else None for p in payloads]


def test_held_trials_go_longest_expected_first_ties_in_given_order(coord: Coordinator) -> None:
    coord.hold("j", [_held("001", 1, 5.0), _held("002", 1, 50.0), _held("003", 1, 5.0),
                     _held("004", 1, 50.0)], [], window=2)  # fmt: skip
    popped = [coord.next_waiting("j", 30) for _ in range(5)]
    assert _keys(popped) == ["002#1", "004#1", "001#1", "003#1", None]
    assert popped[0] == _payload("002", 1)  # the payload as held


def test_trials_waiting_for_a_slot_go_before_held_ones(coord: Coordinator) -> None:
    coord.hold("j", [_held("001", 2, 50.0)], ["001#1"], window=1)
    coord.wait_for_slot("j", _payload("003"))
    assert _keys([coord.next_waiting("j", 30) for _ in range(3)]) == ["003#1", "001#2", None]


def test_a_finished_trial_measures_its_tasks_held_trials(coord: Coordinator) -> None:
    # Timeouts say 100 s for every trial; the first attempts (sent) measure 3 s and 30 s.
    held = [_held("003", 1, 100.0), _held("001", 2, 100.0), _held("002", 2, 100.0),
            _held("001", 3, 100.0), _held("002", 3, 100.0)]  # fmt: skip
    coord.hold("j", held, ["001#1", "002#1"], window=2)
    coord.store_result("j", "001#1", _record("001", 1, harness=3.0))
    # 002 is not measured yet: its timeouts' bound still puts it before 001's 3 s.
    assert _keys([coord.next_waiting("j", 30), coord.next_waiting("j", 30)]) == ["003#1", "002#2"]
    coord.store_result("j", "002#1", _record("002", 1, harness=30.0))
    assert _keys([coord.next_waiting("j", 30) for _ in range(4)]) == ["002#3", "001#2", "001#3", None]


def test_a_held_trial_sent_first_measures_the_rest_of_its_task(coord: Coordinator) -> None:
    held = [_held("001", 1, 100.0), _held("002", 1, 100.0), _held("001", 2, 100.0), _held("002", 2, 100.0)]
    coord.hold("j", held, [], window=1)
    assert _keys([coord.next_waiting("j", 30), coord.next_waiting("j", 30)]) == ["001#1", "002#1"]
    coord.store_result("j", "001#1", _record("001", 1, harness=2.0))
    coord.store_result("j", "002#1", _record("002", 1, harness=20.0))
    assert _keys([coord.next_waiting("j", 30) for _ in range(3)]) == ["002#2", "001#2", None]


def test_cancelled_or_unmeasured_records_measure_nothing(coord: Coordinator) -> None:
    held = [_held("001", 2, 100.0), _held("002", 2, 100.0), _held("003", 2, 50.0)]
    coord.hold("j", held, ["001#1", "002#1", "003#1"], window=3)
    coord.store_result("j", "001#1", _record("001", 1, harness=1.0, exception="Cancelled"))
    coord.store_result("j", "002#1", _record("002", 1, harness=None, exception="PullError"))
    coord.store_result("j", "003#1", _record("003", 1, harness=0.5))
    assert _keys([coord.next_waiting("j", 30) for _ in range(4)]) == ["001#2", "002#2", "003#2", None]


def test_a_record_without_stored_seconds_measures_nothing(coord: Coordinator) -> None:
    # A record an older worker wrote has no `measured_sec`: the store does not measure it again.
    coord.hold("j", [_held("001", 2, 1.0), _held("002", 2, 9.0)], ["001#1"], window=1)
    older = json.loads(_record("001", 1, harness=50.0))
    del older["measured_sec"]
    coord.store_result("j", "001#1", json.dumps(older))
    assert _keys([coord.next_waiting("j", 30) for _ in range(3)]) == ["002#2", "001#2", None]


def test_release_held_takes_every_held_trial_in_order(coord: Coordinator) -> None:
    coord.hold("j", [_held("001", 2, 1.0), _held("002", 2, 9.0)], ["001#1", "002#1"], window=2)
    assert _keys(list(coord.release_held("j", 30))) == ["002#2", "001#2"]
    assert coord.release_held("j", 30) == []
    assert coord.next_waiting("j", 30) is None


def test_a_held_trial_taken_is_guarded_until_its_message_is_claimed(coord: Coordinator) -> None:
    # Its sender may die between taking it and sending it: nothing but the guard would know the trial.
    coord.hold("j", [_held("001", 2, 5.0), _held("002", 2, 9.0)], ["001#1"], window=1)
    taken = coord.next_waiting("j", TTL)
    assert taken == _payload("002", 2)
    assert coord.is_leased("j", "002#2")  # parked under its message's token...
    assert coord.orphaned() == []
    assert _claim(coord, "j", "002#2", "w", 30, parked="parked:celery-other") is Claim.HELD
    time.sleep(TTL * 1.5)  # ...the message never came: the watchdog finds an orphan to send again
    assert [(job, key, payload) for job, key, payload in coord.orphaned()] == [("j", "002#2", taken)]
    # Had it come, it takes the parked lease over, and its end clears the guard.
    assert coord.release_held("j", 30) == [_payload("001", 2)]
    assert _claim(coord, "j", "001#2", "w", 30, parked="parked:celery-001") is Claim.CLAIMED
    assert coord.finish("j", "001#2", "w")
    assert not coord.is_leased("j", "001#2")
    assert [key for _, key, _ in coord.orphaned()] == ["002#2"]


def test_held_trials_dropped_leave_nothing_behind(coord: Coordinator) -> None:
    coord.hold("j", [_held("001", 2, 5.0)], ["001#1"], window=1)
    assert coord.release_held("j", None) == [_payload("001", 2)]
    assert not coord.is_leased("j", "001#2")
    assert coord.orphaned() == []


def test_start_writes_the_running_entry_with_the_claim(coord: Coordinator) -> None:
    entry = _payload().model_copy(update={"owner": "a"})
    assert coord.start("j", "001#1", "a", TTL, cap=1, running=entry).slot
    # A second trial claimed without a slot still has its entry: the claim and the entry are one step.
    second = _payload("002").model_copy(update={"owner": "b"})
    assert not coord.start("j", "002#1", "b", TTL, cap=1, running=second).slot
    assert coord.orphaned() == []
    time.sleep(TTL * 1.5)  # both holders died right after their claims
    assert sorted(key for _, key, _ in coord.orphaned()) == ["001#1", "002#1"]
    assert coord.start("j", "003#1", "c", 30, cap=1).claim is Claim.CLAIMED  # no entry asked for
    assert "003#1" not in [key for _, key, _ in coord.orphaned()]


def test_holds_are_stalled_only_with_nothing_running_waiting_or_released(coord: Coordinator) -> None:
    coord.hold("j", [_held("001", 2, 1.0), _held("002", 2, 1.0)], ["001#1"], window=3)
    assert coord.stalled_holds(0) == {}  # not a live job yet: its first trial was not claimed
    assert _claim(coord, "j", "001#1", "a", 30) is Claim.CLAIMED
    coord.set_running("j", "001#1", _payload("001"))
    assert coord.stalled_holds(0) == {}  # a trial runs: its end sends the next one
    assert coord.finish("j", "001#1", "a")
    assert coord.stalled_holds(0) == {"j": 3}
    assert coord.stalled_holds(60) == {}  # released lately (here: held lately)
    coord.wait_for_slot("j", _payload("003"))
    assert coord.stalled_holds(0) == {}
    coord.next_waiting("j", 30)
    coord.release_held("j", 30)
    assert coord.stalled_holds(0) == {}


def test_history_keeps_the_newest_samples_and_replaces_a_jobs_own(coord: Coordinator) -> None:
    assert coord.durations(["a", "b"]) == {}
    coord.add_durations("job1", {"a": [1.0, 2.0], "b": [5.0]})
    coord.add_durations("job2", {"a": [3.0]})
    assert coord.durations(["a", "b", "c"]) == {"a": [1.0, 2.0, 3.0], "b": [5.0]}
    coord.add_durations("job1", {"a": [4.0]})  # job1 finalized again: its samples are replaced
    assert coord.durations(["a"]) == {"a": [3.0, 4.0]}
    coord.add_durations("job3", {"a": [float(n) for n in range(10, 10 + SAMPLES + 2)]})
    assert coord.durations(["a"])["a"] == [float(n) for n in range(12, 12 + SAMPLES)]


def test_a_dispatch_is_open_until_its_finalizer_closes_it(coord: Coordinator) -> None:
    assert coord.open_dispatches("j") == set()
    coord.open_dispatch("j", "d1")
    coord.open_dispatch("j", "d2")
    coord.close_dispatch("j", "d1")
    assert coord.open_dispatches("j") == {"d2"}
    assert coord.open_dispatches("other") == set()


# --- job control -----------------------------------------------------------------


def test_cancel_and_uncancel(coord: Coordinator) -> None:
    assert not coord.is_cancelled("j")
    coord.cancel("j")
    assert coord.is_cancelled("j")
    assert not coord.is_cancelled("other")
    coord.uncancel("j")
    assert not coord.is_cancelled("j")


def test_unfit_hosts_are_kept_per_job(coord: Coordinator) -> None:
    assert coord.unfit_hosts("j") == {}
    before = coord.now()
    coord.mark_unfit("j", "w1@a", "cannot see /jobs")
    coord.mark_unfit("j", "w2@b", "no env file")
    marks = coord.unfit_hosts("j")
    assert {host: mark.reason for host, mark in marks.items()} == {
        "w1@a": "cannot see /jobs",
        "w2@b": "no env file",
    }
    assert all(before - 1 <= mark.at <= coord.now() + 1 for mark in marks.values())
    assert coord.unfit_hosts("other") == {}


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


def test_hosts_beat_pause_and_resume_on_the_stores_clock(coord: Coordinator) -> None:
    assert coord.hosts() == {}
    before = coord.now()
    coord.beat("w1@a")
    coord.beat("w2@b")
    coord.pause_host("w2@b", "engine unreachable")
    hosts = coord.hosts()
    assert set(hosts) == {"w1@a", "w2@b"}
    assert before - 1 <= hosts["w1@a"].seen_at <= coord.now() + 1
    assert not hosts["w1@a"].paused
    assert (hosts["w2@b"].paused, hosts["w2@b"].reason) == (True, "engine unreachable")
    coord.beat("w2@b")  # a heartbeat does not resume a paused host
    assert coord.hosts()["w2@b"].paused
    coord.resume_host("w2@b")
    assert not coord.hosts()["w2@b"].paused
    coord.forget_host("w1@a")
    assert set(coord.hosts()) == {"w2@b"}


def test_a_hosts_image_budget_line_is_kept_until_it_is_forgotten(coord: Coordinator) -> None:
    coord.beat("w1@a")
    coord.beat("w2@b")
    assert coord.hosts()["w1@a"].images == ""
    coord.report_images("w1@a", "task images 1.0 GiB of 2.0 GiB (3 images)")
    coord.report_images("w1@a", "task images 1.5 GiB of 2.0 GiB (4 images); 1 evicted")  # the latest wins
    hosts = coord.hosts()
    assert hosts["w1@a"].images == "task images 1.5 GiB of 2.0 GiB (4 images); 1 evicted"
    assert hosts["w2@b"].images == ""
    coord.forget_host("w1@a")
    coord.beat("w1@a")  # back after a restart: nothing of before
    assert coord.hosts()["w1@a"].images == ""


def test_a_hosts_kit_is_kept_until_it_is_forgotten(coord: Coordinator) -> None:
    coord.beat("w1@a")
    coord.beat("w2@b")
    assert coord.hosts()["w1@a"].kit is None  # a host that has not said
    kit = HostKit(agent_install="baked", proxy_image="reg/proxy@sha256:" + "a" * 64,
                  jobs_roots=("/srv/jobs",), selection_roots=("/srv/sel",))  # fmt: skip
    coord.describe_host("w1@a", HostKit())
    coord.describe_host("w1@a", kit)  # the latest wins
    hosts = coord.hosts()
    assert hosts["w1@a"].kit == kit and hosts["w2@b"].kit is None
    coord.forget_host("w1@a")
    coord.beat("w1@a")  # back after a restart: nothing of before
    assert coord.hosts()["w1@a"].kit is None


def test_patiently_returns_what_the_call_returns(coord: Coordinator) -> None:
    assert coord.patiently(lambda: 42) == 42
    assert coord.recovered_at == float("-inf")


# --- shares ----------------------------------------------------------------------


def test_a_free_slot_goes_to_the_user_then_job_furthest_below_its_share(coord: Coordinator) -> None:
    from sciencebench.coordination.shares import Share, job_field, user_field

    coord.register_share("a", Share(user="alice", cap=4, name="a", at=1.0))
    coord.register_share("b", Share(user="bob", cap=4, name="b", at=2.0))
    coord.register_share("c", Share(user="bob", weight=3.0, cap=4, name="c", at=3.0))
    assert coord.choose_share(4) is None  # nobody waits
    for job in ("a", "b", "c"):
        coord.hold(job, [_held("001", 2, 1.0), _held("002", 2, 1.0)], [], window=1)
    assert coord.choose_share(4) == "c"  # users tie (nothing busy); then the job: c weighs 3
    coord.share_sent("c", "001#2")
    assert coord.share_load("c").busy == 1
    assert coord.choose_share(4) == "a"  # alice has nothing busy, bob one
    coord.share_sent("a", "001#2")
    assert coord.choose_share(4) == "c"  # users tie again; c's (1+1)/3 beats b's (0+1)/1
    coord.set_weight(user_field("alice"), 3.0)
    assert coord.choose_share(4) == "a"  # (1+1)/3 < bob's (1+1)/1
    assert coord.choose_share(2) is None  # no free slot: 2 busy of 2
    coord.set_weight(job_field("c"), 0.5)
    coord.set_weight(user_field("alice"), None)
    assert coord.choose_share(4) == "b"
    assert coord.acquire_slot("b", "001#1", 4, 30)
    coord.share_started("a", "001#2")
    assert coord.share_load("a").busy == 0 and coord.share_load("b").running == 1
    assert coord.choose_share(4) == "a"
    coord.cancel("a")
    assert coord.choose_share(4) == "b"  # a cancelled job waits for nothing
    coord.retire("b", 60)
    assert "b" not in coord.share_table()[0]


def test_a_job_at_its_cap_takes_no_free_slot(coord: Coordinator) -> None:
    from sciencebench.coordination.shares import Share

    coord.register_share("a", Share(user="alice", cap=1, name="a", at=1.0))
    coord.hold("a", [_held("001", 2, 1.0)], [], window=1)
    assert coord.choose_share(8) == "a"
    coord.share_sent("a", "001#2")
    assert coord.choose_share(8) is None
