"""History-aware ordering: measured durations per task version and agent, held trials, no secrets."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from sciencebench.coordination import history
from sciencebench.coordination.protocol import Claim
from sciencebench.coordination.records import FinalizerAnswer, finish_job
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.coordination.watchdog import release_stalled
from sciencebench.core import models
from sciencebench.core.models import JobSpec, TrialRecord, TrialSpec
from sciencebench.core.paths import JobPaths, write_atomic
from sciencebench.login.dispatch import dispatch
from sciencebench.login.options import SubmitOptions
from sciencebench.login.plan import order, schedule
from sciencebench.login.runrecord import RunRecord, build_run_record
from sciencebench.login.submit import Prepared, persist
from sciencebench.worker.stages import CANCELLED
from tests.fixtures.hosts import prepare
from tests.fixtures.leases import claim as _claim
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit

CANARY = "sk-canary-history-51d"
JOB_ID = uuid.UUID("00000000-0000-4000-8000-000000000051")
IDS = ["001", "002", "003", "004"]


def _prepare(tmp_path: Path, ids: list[str] = IDS, **opts: Any) -> Prepared:
    path = tmp_path / "sel"
    if not path.exists():
        make_selection(path, ids)  # every task: the same timeouts (uninformative)
    opts.setdefault("job_name", "h")
    return prepare(SubmitOptions(path=path, jobs_dir=tmp_path / "jobs", **opts))


def _run_record(prepared: Prepared) -> RunRecord:
    return build_run_record(prepared.job, prepared.trials[0], "redis://x", [])


def _keys(trials: list[TrialSpec]) -> list[str]:
    return [t.key for t in trials]


def _write_record(job: JobSpec, task_id: str, attempt: int, harness: float | None, **extra: Any) -> None:
    timings = {"pull": 40.0} if harness is None else {"pull": 40.0, "harness": harness}
    record = TrialRecord(job_id=job.job_id, job_name=job.job_name, task_id=task_id, attempt=attempt,
                         timings_sec=timings, **extra)  # fmt: skip
    write_atomic(
        JobPaths(job.jobs_dir, job.job_name).trial_record(task_id, attempt), record.model_dump_json()
    )


# --- ordering ----------------------------------------------------------------------


def test_uninformative_timeouts_keep_selection_order_without_history(tmp_path: Path) -> None:
    trials = _prepare(tmp_path).trials
    assert len({t.expected_sec for t in trials}) == 1
    assert _keys(order(trials, {})) == ["001#1", "002#1", "003#1", "004#1"]


def test_history_orders_the_trials_when_timeouts_are_uninformative(tmp_path: Path) -> None:
    trials = _prepare(tmp_path).trials
    measured = {"001": 5.0, "002": 50.0, "003": 0.5, "004": 20.0}
    assert _keys(order(trials, measured)) == ["002#1", "004#1", "001#1", "003#1"]


def test_a_task_without_history_goes_before_measured_ones(tmp_path: Path) -> None:
    # Its timeouts' bound is more than any measurement: a long unknown task does not start last.
    trials = _prepare(tmp_path).trials
    assert _keys(order(trials, {"001": 5.0, "002": 50.0, "004": 20.0})) == [
        "003#1",
        "002#1",
        "004#1",
        "001#1",
    ]


def test_one_trial_per_task_is_sent_at_once(tmp_path: Path) -> None:
    trials = _prepare(tmp_path, n_concurrent=1).trials
    plan = schedule(trials, {}, window=1)
    assert _keys(plan.send) == ["001#1", "002#1", "003#1", "004#1"] and plan.hold == []


def test_later_attempts_are_held_beyond_the_window(tmp_path: Path) -> None:
    trials = _prepare(tmp_path, n_attempts=2, n_concurrent=2).trials
    plan = schedule(trials, {"004": 9.0}, window=2)
    assert _keys(plan.send) == ["001#1", "002#1"]  # unmeasured tasks first, first attempts first
    assert _keys(plan.hold) == ["003#1", "001#2", "002#2", "003#2", "004#1", "004#2"]
    assert _keys(schedule(trials, {}, window=8).send) == _keys(order(trials, {}))  # all fit in the window


# --- a first run: other agents' measurements --------------------------------------

A_HASH, B_HASH = "a" * 64, "b" * 64
ME, OTHER, THIRD = "1" * 16, "2" * 16, "3" * 16


def _entries(digest: str, seconds: dict[str, float], task_hash: str = A_HASH) -> dict[str, list[float]]:
    return {history.history_key(t, task_hash, digest): [s] for t, s in seconds.items()}


def test_agent_scale_is_the_median_ratio_over_common_task_versions() -> None:
    mine = {"001/a": 20.0, "002/a": 9.0, "003/a": 300.0, "009/a": 1.0}
    theirs = {"001/a": 10.0, "002/a": 3.0, "003/a": 100.0, "004/a": 5.0}
    assert history.agent_scale(mine, theirs) == 3.0  # ratios 2, 3, 3
    assert history.agent_scale(mine, {"004/a": 5.0}) is None  # nothing in common
    assert history.agent_scale({"001/a": 4.0}, {"001/a": 0.0}) is None  # 0 s says nothing of a ratio


def test_a_first_run_borrows_another_agents_durations_scaled_by_common_tasks() -> None:
    # OTHER ran 001-004; this agent ran 001 and 002 before, twice as long as OTHER.
    entries = {**_entries(OTHER, {"001": 10.0, "002": 4.0, "003": 30.0, "004": 1.0}),
               **_entries(ME, {"001": 20.0, "002": 8.0})}  # fmt: skip
    found = history.borrowed_estimates(entries, ME, {"003": A_HASH, "004": A_HASH, "005": A_HASH})
    assert found == {"003": 60.0, "004": 2.0}  # 005: nobody measured it (its timeouts order it)
    # Another version of the task (changed task.toml, ...) borrows nothing.
    assert history.borrowed_estimates(entries, ME, {"003": B_HASH}) == {}


def test_with_no_common_task_the_other_agents_seconds_rank_unscaled() -> None:
    entries = _entries(OTHER, {"001": 10.0, "002": 40.0, "003": 0.5})
    found = history.borrowed_estimates(entries, ME, dict.fromkeys(["001", "002", "003"], A_HASH))
    assert found == {"001": 10.0, "002": 40.0, "003": 0.5}


def test_several_agents_give_the_median_and_scaled_ones_win() -> None:
    entries = {
        **_entries(OTHER, {"001": 10.0, "002": 10.0}),  # common with ME on 001: scale 1
        **_entries(THIRD, {"001": 5.0, "002": 30.0}),  # common on 001: scale 2 -> 60 for 002
        **_entries(ME, {"001": 10.0}),
        **_entries("4" * 16, {"002": 1000.0}),  # no common task: left out while scaled agents exist
        "cost/" + history.history_key("002", A_HASH, OTHER): [99.0],  # dollars, not seconds
    }
    assert history.borrowed_estimates(entries, ME, {"002": A_HASH}) == {"002": 35.0}  # median of 10, 60


def test_keys_that_are_not_durations_are_ignored() -> None:
    assert history.split_key(history.history_key("001", A_HASH, OTHER)) == (f"001/{A_HASH}", OTHER)
    for key in ("cost/" + history.history_key("001", A_HASH, OTHER), "001/short/" + OTHER, "junk", ""):
        assert history.split_key(key) is None, key


def test_ordering_estimates_prefer_the_agents_own_history(tmp_path: Path, store: RedisCoordinator) -> None:
    job = _prepare(tmp_path).job
    other = job.model_copy(update={"agent": job.agent.model_copy(update={"agent": "oracle"})})
    coord = store
    theirs, mine = history.job_history_keys(other), history.job_history_keys(job)
    coord.add_durations("other", {theirs[t]: [s] for t, s in zip(IDS, [5.0, 50.0, 0.5, 20.0], strict=True)})
    assert history.estimates(coord, job) == {}  # nothing of its own ...
    assert history.ordering_estimates(coord, job) == {"001": 5.0, "002": 50.0, "003": 0.5, "004": 20.0}
    coord.add_durations("mine", {mine["003"]: [2.0]})  # ... now 003: 4 x the other's
    assert history.ordering_estimates(coord, job) == {"001": 20.0, "002": 200.0, "003": 2.0, "004": 80.0}


def _unreadable() -> dict[str, list[float]]:
    raise ConnectionError("history unreadable")


def test_an_unreadable_history_leaves_the_own_estimates(
    tmp_path: Path, store: RedisCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _prepare(tmp_path).job
    coord = store
    monkeypatch.setattr(coord, "all_durations", _unreadable)
    coord.add_durations("mine", {history.job_history_keys(job)["001"]: [3.0]})
    assert history.ordering_estimates(coord, job) == {"001": 3.0}


def test_a_first_run_is_sent_in_the_other_agents_order(tmp_path: Path, store: RedisCoordinator) -> None:
    prepared = _prepare(tmp_path, n_concurrent=1)
    job = persist(prepared, _run_record(prepared)).job
    other = job.model_copy(update={"agent": job.agent.model_copy(update={"agent": "oracle"})})
    coord = store
    keys = history.job_history_keys(other)
    coord.add_durations("other", {keys["003"]: [9.0], keys["001"]: [1.0], keys["004"]: [4.0]})
    app = Celery(broker="memory://", backend="cache+memory://")
    dispatch(app, coord, job, prepared.trials)
    # 002 unmeasured by anyone: its timeouts' bound sends it first; then the other agent's order.
    assert _sent(app) == ["task_002 #1", "task_003 #1", "task_004 #1", "task_001 #1"]


# --- what is kept --------------------------------------------------------------------


def test_measured_seconds_is_the_harness_stage_unless_cancelled() -> None:
    assert history.measured_seconds({"timings_sec": {"pull": 30.0, "harness": 12.5}}) == 12.5
    assert history.measured_seconds({"timings_sec": {"pull": 30.0}}) is None  # never reached Pier
    assert history.measured_seconds({"timings_sec": {"harness": 3.0}, "exception_type": CANCELLED}) is None
    assert (
        history.measured_seconds({"timings_sec": {"harness": 3.0}, "exception_type": "AgentTimeoutError"})
        == 3.0
    )
    for bad in (True, -1.0, "3", None):
        assert history.measured_seconds({"timings_sec": {"harness": bad}}) is None
    assert models.CANCELLED == CANCELLED  # the worker's name for a cancelled trial


def test_a_record_stores_what_it_measured_and_readers_read_that() -> None:
    record = TrialRecord(job_id=JOB_ID, job_name="j", task_id="001", attempt=1, timings_sec={"harness": 7.5})
    stored = json.loads(record.model_dump_json())
    assert stored["measured_sec"] == 7.5  # computed once, when the record is written
    cancelled = record.model_copy(update={"exception_type": CANCELLED})
    assert json.loads(cancelled.model_dump_json())["measured_sec"] is None
    assert (
        history.measured_seconds({**stored, "measured_sec": 2.0}) == 2.0
    )  # the stored value, not the timings
    assert history.measured_seconds({**stored, "measured_sec": None}) is None
    assert history.stored_seconds({"timings_sec": {"harness": 7.5}}) is None  # the store re-ranks by it only
    assert TrialRecord.model_validate_json(record.model_dump_json()) == record  # read back as written


def test_history_is_per_task_hash_and_agent(tmp_path: Path, store: RedisCoordinator) -> None:
    job = _prepare(tmp_path).job
    coord = store
    keys = history.job_history_keys(job)
    coord.add_durations("earlier", {keys["001"]: [7.0], keys["002"]: [2.0, 4.0, 30.0]})
    assert history.estimates(coord, job) == {"001": 7.0, "002": 4.0}  # the median of what was kept

    changed = job.model_copy(update={"task_hashes": {**job.task_hashes, "001": "0" * 64}})
    assert history.estimates(coord, changed) == {"002": 4.0}  # a changed task forgets its history
    other_agent = job.model_copy(update={"agent": job.agent.model_copy(update={"agent": "oracle"})})
    assert history.estimates(coord, other_agent) == {}


def test_the_finalizer_records_what_trials_measured(tmp_path: Path, store: RedisCoordinator) -> None:
    prepared = _prepare(tmp_path, n_attempts=2)
    job = persist(prepared, _run_record(prepared)).job
    paths = JobPaths(job.jobs_dir, job.job_name)
    _write_record(job, "001", 1, 3.0)
    _write_record(job, "001", 2, 5.0)
    _write_record(job, "002", 1, 1.0, exception_type=CANCELLED)  # cut short: not a duration
    _write_record(job, "003", 1, None, exception_type="PullError")  # never reached Pier
    coord = store
    answer = finish_job(coord, paths, job.job_name, job.job_id)
    assert (answer.summary_written, answer.n_total_trials, answer.missing) == (
        True,
        8,
        ["002#2", "003#2", "004#1", "004#2"],
    )
    assert FinalizerAnswer.model_validate(answer.wire()) == answer  # what the chord carries reads back
    assert history.estimates(coord, job) == {"001": 4.0}
    finish_job(coord, paths, job.job_name, job.job_id)  # finalized again: counted once
    assert coord.durations([history.job_history_keys(job)["001"]]) == {
        history.job_history_keys(job)["001"]: [3.0, 5.0]
    }


def test_an_unwritten_summary_answers_why_and_nothing_else(tmp_path: Path, store: RedisCoordinator) -> None:
    job = _prepare(tmp_path).job
    answer = finish_job(store, None, job.job_name, job.job_id)
    assert answer.wire() == {
        "job_name": job.job_name,
        "job_id": str(job.job_id),
        "summary_written": False,
        "problem": "the job directory is not visible on the finalizing host",
    }


class _Recording:
    """A History store that keeps what it is given."""

    def __init__(self) -> None:
        self.added: list[tuple[str, dict[str, list[float]]]] = []

    def add_durations(self, job: str, durations: dict[str, list[float]]) -> None:
        self.added.append((job, durations))

    def durations(self, keys: list[str]) -> dict[str, list[float]]:
        return {}


def test_history_keeps_no_secret(tmp_path: Path) -> None:
    env_file = tmp_path / "provider.env"
    env_file.write_text(f"OPENAI_API_KEY={CANARY}-env\nMODEL=gpt-5\n")
    prepared = _prepare(tmp_path, agent="codex", env_file=env_file, agent_env=[f"X_TOKEN={CANARY}-agent-env"],
                        agent_kwargs=[f"reasoning_effort={CANARY}-kwarg"])  # fmt: skip
    job = persist(prepared, _run_record(prepared)).job
    paths = JobPaths(job.jobs_dir, job.job_name)
    for task_id in IDS:
        _write_record(job, task_id, 1, 2.0, exception_message=CANARY, worker=CANARY)
    store = _Recording()
    assert history.record_durations(store, job, paths) == 4
    [(job_id, durations)] = store.added
    assert job_id == str(job.job_id)
    for key, seconds in durations.items():
        assert re.fullmatch(r"[0-9]{3}/[0-9a-f]{64}/[0-9a-f]{16}", key), key
        assert seconds == [2.0]
    assert CANARY not in json.dumps(store.added)
    assert history.agent_digest(job.agent) == history.agent_digest(
        job.agent.model_copy(update={"agent_kwargs": {}, "agent_env_names": []})
    )  # names and values of kwargs and env stay out of it


# --- dispatch ----------------------------------------------------------------------


def _sent(app: Celery) -> list[str]:
    """The trial labels in the memory broker's queue, in the order they were sent."""
    labels = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(app.conf.task_default_queue)
        while queue.qsize():
            message = queue.get(block=False)
            labels.append(message.headers["argsrepr"].strip("'"))
            message.ack()
        queue.close()
    return labels


def test_dispatch_orders_by_history_and_holds_later_attempts(tmp_path: Path, store: RedisCoordinator) -> None:
    prepared = _prepare(tmp_path, n_attempts=2, n_concurrent=2)
    job = persist(prepared, _run_record(prepared)).job
    coord = store
    keys = history.job_history_keys(job)
    coord.add_durations("earlier", {keys[t]: [s] for t, s in zip(IDS, [1.0, 40.0, 3.0, 20.0], strict=True)})
    app = Celery(broker="memory://", backend="cache+memory://")
    dispatch(app, coord, job, prepared.trials)
    assert _sent(app) == ["task_002 #1", "task_002 #2"]  # the window: the longest measured first
    held = coord.release_held(job.job_key, 30.0)
    assert [p.trial.key for p in held] == ["004#1", "004#2", "003#1", "003#2", "001#1", "001#2"]
    # Each held trial is the chord member it would have been: its own index, the same group and body.
    assert [p.group_index for p in held] == [2, 3, 4, 5, 6, 7]
    assert len({p.group_id for p in held}) == 1 and len({p.task_id for p in held}) == 6
    assert held[0].chord is not None and held[0].chord["task"] == "sciencebench.finalize_job"


def test_dispatch_sends_everything_with_one_attempt(tmp_path: Path, store: RedisCoordinator) -> None:
    prepared = _prepare(tmp_path, n_concurrent=1)
    job: JobSpec = persist(prepared, _run_record(prepared)).job
    coord = store
    keys = history.job_history_keys(job)
    coord.add_durations("earlier", {keys["003"]: [9.0], keys["001"]: [1.0]})
    app = Celery(broker="memory://", backend="cache+memory://")
    dispatch(app, coord, job, prepared.trials)
    assert _sent(app) == ["task_002 #1", "task_004 #1", "task_003 #1", "task_001 #1"]
    assert coord.release_held(job.job_key, 30.0) == []


def _stalled(app: Celery, coord: RedisCoordinator) -> int:
    """`release_stalled` with a lease so short that two of them (and its lock) have passed."""
    time.sleep(SHORT_LEASE * 3)
    return release_stalled(app, coord, lease_seconds=SHORT_LEASE)


SHORT_LEASE = 0.01


def test_the_watchdog_sends_held_trials_nobody_else_will(tmp_path: Path, store: RedisCoordinator) -> None:
    prepared = _prepare(tmp_path, n_attempts=3, n_concurrent=2)
    job = persist(prepared, _run_record(prepared)).job
    coord = store
    app = Celery(broker="memory://", backend="cache+memory://")
    dispatch(app, coord, job, prepared.trials)
    assert len(_sent(app)) == 2  # the window; taken off the queue: they ran
    assert _stalled(app, coord) == 0  # no trial of the job ever started
    assert _claim(coord, job.job_key, "001#1", "w", 30) is Claim.CLAIMED
    assert coord.finish(job.job_key, "001#1", "w")  # ...and ended without waking anyone
    assert release_stalled(app, coord, lease_seconds=60.0) == 0  # not for two lease periods yet
    assert _stalled(app, coord) == 2  # a window's worth
    assert _stalled(app, coord) == 0  # they wait in the broker's queue
    assert _sent(app) == ["task_003 #1", "task_004 #1"]
    coord.set_running(job.job_key, "003#1", coord.release_held(job.job_key, 30.0)[0])
    assert _stalled(app, coord) == 0  # nothing held any more
