"""Every path of `worker.trial.handle`, with no Docker or worker process.

The trial logic runs as on a worker host: a real persisted job and selection,
admission, the task snapshot and review, the heartbeat, the commit and the
publish into the job directory, against the session's embedded store. Only the
engine (`HostRuntime`) and the Pier run are test doubles: the fake Pier
writes the trial directory Pier would, with the outcome each test scripts.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sciencebench.coordination.protocol import Claim
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.errors import NoRoomError, PreflightError, RefusedError
from sciencebench.core.models import Redispatch, TrialRecord, TrialSpec, TrialState
from sciencebench.core.paths import JobPaths
from sciencebench.core.settings import Settings
from sciencebench.login.options import SubmitOptions
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import Prepared, persist
from sciencebench.worker import trial as trial_module
from sciencebench.worker.context import WorkerContext
from sciencebench.worker.dispatch import (
    EMBEDDED,
    Answer,
    Clustered,
    Dispatch,
    Duplicate,
    HandBack,
    Outcome,
    counted,
    not_counted,
)
from sciencebench.worker.pier.process import PierRun
from sciencebench.worker.trial import handle
from tests.fixtures.hosts import prepare
from tests.fixtures.leases import claim
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit

HOST = "w1@unit"
LEASE = 2.0
TASK_ID = "task-1"  # the Celery task id of the trial's message


@dataclass
class FakeRuntime:
    """The engine seam: healthy unless told otherwise; images present unless there is no room."""

    unhealthy: str | None = None
    no_room: bool = False
    cleaned: list[str] = field(default_factory=list)
    on_cleanup: Callable[[str], None] | None = None  # called at each cleanup, before it counts
    release_fails: bool = False
    disk_exceeded: str | None = None  # what the disk watch found while Pier ran

    def check_host(self, fresh: bool = False) -> object:
        if self.unhealthy:
            raise PreflightError(self.unhealthy)
        return None

    def preflight(self, job: object) -> None:
        return None

    def environment_kwargs(self) -> dict[str, str]:
        return {}

    def ensure_images(self, refs: list[str], platform: str, skip_pull: bool) -> None:
        if self.no_room:
            raise NoRoomError("the image budget is full")

    def images_held(self, refs: list[str]) -> contextlib.AbstractContextManager[None]:
        return self.hold()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        yield
        if self.release_fails:  # settling the image budget after the trial: the engine timed out
            raise OSError("read timed out")

    def live_trial(self, task_dir_name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def watch_disk(self, trial_names: Callable[[], list[str]]) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext(lambda: self.disk_exceeded)

    def cleanup_trial(self, trial_name: str) -> None:
        if self.on_cleanup is not None:
            self.on_cleanup(trial_name)
        self.cleaned.append(trial_name)


@dataclass
class FakePier:
    """Pier's run: each call takes the next scripted outcome and writes the trial directory Pier would.

    An outcome is an exception type (None: rewarded), or a callable run
    first (to act on the store while "Pier" runs), or "cancelled".
    """

    outcomes: list[Any]
    runs: int = 0

    def __call__(self, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path, timeout_sec: float,
                 should_stop: Callable[[], bool] = lambda: False, poll_sec: float = 0.5,
                 zygote_env: dict[str, str] | None = None, memory_limit: int = 0) -> PierRun:  # fmt: skip
        outcome = self.outcomes[min(self.runs, len(self.outcomes) - 1)]
        self.runs += 1
        if callable(outcome):
            outcome = outcome()
        trial = cwd / "job" / f"task_001__run{self.runs}"
        (trial / "artifacts").mkdir(parents=True)
        (trial / "artifacts" / "model.patch").write_text("")
        if isinstance(outcome, dict):  # a provider failure: Codex's log shows its turn failed with a 429
            (trial / "agent").mkdir()
            events = [
                {"type": "turn.started"},
                {"type": "turn.failed", "error": {"message": "429 Too Many Requests"}},
            ]
            (trial / "agent" / "codex.txt").write_text("".join(json.dumps(e) + "\n" for e in events))
            outcome = outcome["exception"]
        result = {
            "task_name": "task_001",
            "trial_name": trial.name,
            "verifier_result": None if outcome else {"rewards": {"reward": 1.0}},
            "exception_info": {"exception_type": outcome, "exception_message": f"fake {outcome}"}
            if outcome and outcome != "cancelled"
            else None,
        }
        (trial / "result.json").write_text(json.dumps(result))
        cancelled = outcome == "cancelled"
        return PierRun(exit_code=0, duration_sec=0.0, timed_out=False, cancelled=cancelled, log_tail="")


@dataclass
class World:
    """One persisted job of one trial and a worker host's context for it."""

    prepared: Prepared
    ctx: WorkerContext
    coord: RedisCoordinator
    runtime: FakeRuntime
    pier: FakePier
    slept: list[float]

    @property
    def spec(self) -> TrialSpec:
        return self.prepared.trials[0]

    @property
    def paths(self) -> JobPaths:
        return JobPaths(self.prepared.job.jobs_dir, self.prepared.job.job_name)

    @property
    def job(self) -> str:
        return self.spec.job_key

    def clustered(self) -> Clustered:
        return Clustered(Redispatch(task_id=TASK_ID, trial=self.spec))

    def handle(self, dispatch: Dispatch | None = None) -> Outcome:
        return handle(self.spec, self.ctx, dispatch or self.clustered())

    def stored(self) -> TrialRecord | None:
        recorded = self.coord.get_result(self.job, self.spec.key)
        return TrialRecord.model_validate_json(recorded) if recorded else None

    def record_file(self) -> TrialRecord | None:
        path = self.paths.trial_record(self.spec.task_id, self.spec.attempt)
        return TrialRecord.model_validate_json(path.read_bytes()) if path.exists() else None

    def state(self) -> TrialState | None:
        status = self.coord.states(self.job).get(self.spec.key)
        return status.state if status else None


def _world(store: RedisCoordinator, tmp_path: Path, pier: list[Any], **options: Any) -> World:
    selection = make_selection(tmp_path / "sel", ["001"])
    opts = SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="j", **options)
    prepared = prepare(opts)
    done = persist(prepared, build_run_record(prepared.job, prepared.trials[0], "redis://x", []))
    settings = Settings.from_env({"SCIENCEBENCH_STATE_DIR": str(tmp_path / "state")}).model_copy(
        update={"hostname": HOST, "lease_seconds": LEASE, "warm_pier": False, "provider_backoff_sec": 1.0,
                "jobs_roots": (tmp_path / "jobs",), "selection_roots": (selection,)}
    )  # fmt: skip
    coord, runtime, fake, slept = store, FakeRuntime(), FakePier(pier), []
    coord.beat(HOST)
    ctx = WorkerContext(
        coord=coord, runtime=runtime, settings=settings, owner="me", pier=fake, sleep=slept.append
    )
    return World(done, ctx, coord, runtime, fake, slept)


@pytest.fixture
def world(tmp_path: Path, store: RedisCoordinator) -> Iterator[World]:
    yield _world(store, tmp_path, [None])


@pytest.fixture(autouse=True)
def _uncounted() -> Iterator[None]:
    """A clustered answer keeps its lease renewed until counted: stop that after each test."""
    yield
    not_counted(TASK_ID)


# --- claim, commit, duplicates -------------------------------------------------------------


def test_a_claimed_trial_runs_once_and_its_record_is_committed_and_published(world: World) -> None:
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    record = outcome.record
    assert record.exception_type is None and record.rewards == {"reward": 1.0}
    assert record.worker == HOST and record.tries == 1
    assert world.stored() == record == world.record_file()
    assert record.trial_dir is not None and (world.paths.job_dir / record.trial_dir / "result.json").is_file()
    assert world.state() is TrialState.DONE
    # Its lease and running entry are kept until the chord counts the answer, then given back.
    assert world.coord.is_leased(world.job, world.spec.key)
    counted(TASK_ID)
    assert not world.coord.is_leased(world.job, world.spec.key)
    assert world.coord.orphaned() == []
    assert world.runtime.cleaned == [record.trial_dir]
    assert world.pier.runs == 1


def test_the_record_is_committed_before_the_trial_is_cleaned_up(world: World) -> None:
    # A host lost between Pier's end and the commit runs the trial again elsewhere: the cleanup
    # (four engine listings) is no longer inside that window.
    at_cleanup: list[TrialRecord | None] = []
    world.runtime.on_cleanup = lambda name: at_cleanup.append(world.stored())
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    assert at_cleanup == [outcome.record] and world.runtime.cleaned == [outcome.record.trial_dir]


@pytest.mark.parametrize("after_commit", ["cleanup raises", "image hold release raises"])
def test_nothing_after_the_commit_takes_the_answer_away(world: World, after_commit: str) -> None:
    # The record is stored: a cleanup or an image-budget settle that fails after it must not turn
    # the answer into a duplicate the chord never counts.
    if after_commit == "cleanup raises":

        def fail(name: str) -> None:
            raise RuntimeError("cannot schedule new futures after shutdown")

        world.runtime.on_cleanup = fail
    else:
        world.runtime.release_fails = True
    outcome = world.handle()
    assert isinstance(outcome, Answer) and outcome.leased, outcome
    assert outcome.record.exception_type is None and world.stored() == outcome.record
    assert world.coord.is_leased(world.job, world.spec.key)  # kept until the chord counts it
    counted(TASK_ID)
    assert world.coord.orphaned() == []


def test_a_failed_try_is_cleaned_up_before_the_next_try_runs(tmp_path: Path, store: RedisCoordinator) -> None:
    world = _world(store, tmp_path, ["RuntimeError", None], max_retries=1)
    runs_at_cleanup: list[int] = []
    world.runtime.on_cleanup = lambda name: runs_at_cleanup.append(world.pier.runs)
    outcome = world.handle()
    assert isinstance(outcome, Answer) and outcome.record.tries == 2
    assert runs_at_cleanup == [1, 2]  # the first try's leftovers went before the second try started
    assert len(set(world.runtime.cleaned)) == 2


def test_a_container_past_the_disk_limit_ends_the_trial_with_a_resource_failure(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    world = _world(store, tmp_path, [None], max_retries=2)
    world.runtime.disk_exceeded = "container t-main-1 wrote 2.0 GiB to its writable layer, past ..."
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    record = outcome.record
    assert record.exception_type == "ResourceLimitError" and record.stage == "harness"
    assert record.exception_message == world.runtime.disk_exceeded
    assert record.tries == 1 and world.pier.runs == 1  # deterministic: not tried again
    assert world.stored() == record == world.record_file()
    assert world.runtime.cleaned == ["task_001__run1"]  # its containers went
    counted(TASK_ID)
    assert not world.coord.is_leased(world.job, world.spec.key)


def test_an_answer_not_counted_is_answered_again_from_the_store_never_run_again(world: World) -> None:
    first = world.handle()
    assert isinstance(first, Answer)
    assert isinstance(world.handle(), Duplicate)  # its holder still answers
    not_counted(TASK_ID)  # the count failed (or the host was lost): the lease lapses
    time.sleep(LEASE * 1.25)
    assert [key for _, key, _ in world.coord.orphaned()] == [world.spec.key]  # the watchdog resends it
    assert world.coord.take_orphan(world.job, world.spec.key)
    again = world.handle()
    assert isinstance(again, Answer) and again.record == first.record and again.leased
    assert world.coord.is_leased(world.job, world.spec.key)
    world.coord.mark_counted(world.job, world.spec.key)
    counted(TASK_ID)
    assert isinstance(world.handle(), Duplicate)
    assert world.pier.runs == 1
    assert world.coord.orphaned() == []


def test_a_stored_record_that_cannot_be_read_is_answered_with_why_and_never_sent_again(world: World) -> None:
    assert world.coord.store_result(world.job, world.spec.key, '{"written": "by another version"}')
    answer = world.handle()  # claimed as recorded: not counted, no lease
    assert isinstance(answer, Answer) and answer.leased and answer.record.exception_type == "ValueError"
    assert "cannot be read" in (answer.record.exception_message or "")
    world.coord.mark_counted(world.job, world.spec.key)
    counted(TASK_ID)
    assert world.coord.orphaned() == []  # nothing left for the watchdog to send again
    assert isinstance(world.handle(), Duplicate)
    assert world.pier.runs == 0


def test_an_embedded_answer_gives_its_lease_back_at_once(world: World) -> None:
    outcome = world.handle(EMBEDDED)
    assert isinstance(outcome, Answer) and outcome.leased
    assert not world.coord.is_leased(world.job, world.spec.key)
    assert world.coord.orphaned() == []


def test_a_trial_a_live_copy_holds_is_a_duplicate_and_nothing_runs(world: World) -> None:
    claim(world.coord, world.job, world.spec.key, "other", 30.0)
    assert isinstance(world.handle(), Duplicate)
    assert world.pier.runs == 0 and world.stored() is None


# --- unfit, host faults, no room: handed back on a cluster, recorded in --local ---------------


def _unfit(world: World) -> None:
    world.ctx.settings = world.ctx.settings.model_copy(update={"jobs_roots": (Path("/nowhere"),)})


def test_an_unfit_host_hands_the_trial_to_another_live_host(world: World) -> None:
    _unfit(world)
    world.coord.beat("w2@other")
    outcome = world.handle()
    assert isinstance(outcome, HandBack) and not outcome.host_fault
    assert HOST in world.coord.unfit_hosts(world.job)
    # Parked under its message's token: a copy of another message cannot claim it; its own message can.
    assert claim(world.coord, world.job, world.spec.key, "x", 1.0) is Claim.HELD
    assert claim(world.coord, world.job, world.spec.key, "x", 1.0, parked="parked:task-1") is Claim.CLAIMED
    assert world.stored() is None and world.pier.runs == 0


def test_a_job_no_live_host_can_serve_fails_with_every_reason(world: World) -> None:
    _unfit(world)
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    assert outcome.record.exception_type == "UnfitError" and outcome.record.stage == "admission"
    assert outcome.record.exception_message is not None
    assert outcome.record.exception_message.startswith(f"no worker host can serve this job: {HOST}: jobs dir")
    assert world.stored() == outcome.record and world.state() is TrialState.FAILED


def test_an_unhealthy_host_hands_back_and_pauses_on_a_cluster(world: World) -> None:
    world.runtime.unhealthy = "the engine does not answer"
    outcome = world.handle()
    assert isinstance(outcome, HandBack) and outcome.host_fault
    status = world.coord.hosts()[HOST]
    assert status.paused
    assert [job for job, key, _ in world.coord.orphaned()] == []  # its lease is parked, not lapsed
    assert world.stored() is None


def test_an_unhealthy_host_in_local_mode_records_the_preflight_failure(world: World) -> None:
    world.runtime.unhealthy = "the engine does not answer"
    outcome = world.handle(EMBEDDED)
    assert isinstance(outcome, Answer)
    assert (outcome.record.exception_type, outcome.record.stage) == ("PreflightError", "preflight")
    assert not world.coord.hosts()[HOST].paused


@pytest.mark.parametrize("why", ["unfit", "refused", "unhealthy"])
def test_a_host_that_cannot_run_the_trial_still_answers_with_a_record_a_lost_host_stored(
    world: World, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A host lost between the commit and the count: the watchdog's copy lands on a host that could
    # not run the trial. Answering needs no job directory, agent or engine: it answers from the store
    # (before, it handed the copy back or, refused, answered nothing, and the chord waited for ever).
    first = world.handle()
    assert isinstance(first, Answer)
    not_counted(TASK_ID)  # the host is lost: its lease lapses
    time.sleep(LEASE * 1.25)
    assert world.coord.take_orphan(world.job, world.spec.key)
    if why == "unfit":
        _unfit(world)
        world.coord.beat("w2@other")  # another live host could run it
    elif why == "refused":  # e.g. its agent is not installed on this host

        def refuse(spec: TrialSpec, settings: Settings) -> None:
            raise RefusedError("agent module 'x' is not installed on this worker")

        monkeypatch.setattr(trial_module, "admit", refuse)
    else:
        world.runtime.unhealthy = "the engine does not answer"
    world.coord.share_sent(world.job, world.spec.key)  # fair share sent this copy
    again = world.handle()
    assert isinstance(again, Answer) and again.leased and again.record == first.record, again
    assert world.pier.runs == 1 and not world.coord.hosts()[HOST].paused
    assert world.coord.share_load(world.job).sent == 0  # its message arrived, as fair share counts it
    world.coord.mark_counted(world.job, world.spec.key)
    counted(TASK_ID)
    assert world.coord.orphaned() == []


def test_a_record_gone_between_the_look_and_the_claim_leaves_no_claim_taken(world: World) -> None:
    # `retry --failed` cleared the record just after this unfit host saw it: its claim is given back.
    _unfit(world)
    world.coord.beat("w2@other")
    store = world.coord

    class Seen:
        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def get_result(self, job: str, key: str) -> str | None:
            return '{"seen": "a moment ago"}'

    world.ctx.coord = Seen()  # type: ignore[assignment]
    outcome = world.handle()
    assert isinstance(outcome, HandBack) and not outcome.host_fault  # handed back as any unfit copy
    assert store.acquire_slot(world.job, "probe", 1, LEASE)  # no slot left taken
    assert world.pier.runs == 0 and store.get_result(world.job, world.spec.key) is None


def test_no_room_for_the_images_hands_back_without_pausing_the_host(world: World) -> None:
    world.runtime.no_room = True
    outcome = world.handle()
    assert isinstance(outcome, HandBack) and not outcome.host_fault
    assert not world.coord.hosts()[HOST].paused
    assert world.stored() is None and world.pier.runs == 0
    local = world.handle(EMBEDDED)
    assert isinstance(local, Duplicate)  # still parked under the cluster message's token


def test_no_room_in_local_mode_is_the_trial_s_record(tmp_path: Path, store: RedisCoordinator) -> None:
    world = _world(store, tmp_path, [None])
    world.runtime.no_room = True
    outcome = world.handle(EMBEDDED)
    assert isinstance(outcome, Answer)
    assert (outcome.record.exception_type, outcome.record.stage) == ("NoRoomError", "pull")


# --- slots -----------------------------------------------------------------------------------


def test_a_trial_without_a_slot_is_handed_back_to_wait_for_one(world: World) -> None:
    assert world.coord.acquire_slot(world.job, "999-1", 1, 30.0)  # another trial of the job holds the slot
    outcome = world.handle()
    assert isinstance(outcome, HandBack) and outcome.for_slot
    assert world.state() is TrialState.WAITING
    waiting = world.coord.next_waiting(world.job, 0.0)
    assert waiting is not None and waiting.task_id == "task-1"
    assert world.pier.runs == 0


def test_a_trial_without_a_slot_waits_for_one_in_local_mode(world: World) -> None:
    claim(world.coord, world.job, "999-1", "other", 30.0)
    assert world.coord.acquire_slot(world.job, "999-1", 1, 30.0)  # another trial of the job holds the slot

    def the_other_trial_ends(seconds: float) -> None:
        world.slept.append(seconds)
        world.coord.finish(world.job, "999-1", "other")

    world.ctx.sleep = the_other_trial_ends
    outcome = world.handle(EMBEDDED)
    assert isinstance(outcome, Answer) and outcome.record.exception_type is None
    assert world.slept == [LEASE / 4]
    assert world.state() is TrialState.DONE


# --- the lease and cancel --------------------------------------------------------------------


def test_a_trial_whose_lease_was_lost_while_it_ran_discards_its_result(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    world: World

    def lose_the_lease() -> None:
        world.coord.finish(world.job, world.spec.key, "me")
        claim(world.coord, world.job, world.spec.key, "thief", 30.0)

    world = _world(store, tmp_path, [lose_the_lease])
    assert isinstance(world.handle(), Duplicate)
    assert world.stored() is None and world.record_file() is None
    assert not any(p.name.startswith("task_001__") for p in world.paths.job_dir.iterdir())


def test_a_job_cancelled_before_the_trial_started_records_it_cancelled(world: World) -> None:
    world.coord.cancel(world.job)
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    assert (outcome.record.exception_type, outcome.record.stage) == ("Cancelled", "slot")
    assert world.pier.runs == 0 and world.stored() == outcome.record


def test_a_job_cancelled_while_the_trial_ran_is_not_tried_again(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    world = _world(store, tmp_path, ["cancelled"], max_retries=3)
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    assert (outcome.record.exception_type, outcome.record.stage) == ("Cancelled", "harness")
    assert outcome.record.tries == 1 and world.pier.runs == 1


# --- tries -----------------------------------------------------------------------------------


def test_a_failure_pier_would_retry_is_tried_again_up_to_max_retries(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    world = _world(store, tmp_path, ["NonZeroAgentExitCodeError"], max_retries=2)
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    assert outcome.record.tries == 3 and world.pier.runs == 3
    assert [t.exception_type for t in outcome.record.earlier_tries] == ["NonZeroAgentExitCodeError"] * 2
    assert world.slept == [2.0, 4.0]
    assert len(list(world.paths.superseded_dir.iterdir())) == 2  # the earlier tries' directories


def test_a_retried_failure_that_then_succeeds_ends_rewarded(tmp_path: Path, store: RedisCoordinator) -> None:
    world = _world(store, tmp_path, ["NonZeroAgentExitCodeError", None], max_retries=2)
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    assert outcome.record.exception_type is None and outcome.record.tries == 2


@pytest.mark.parametrize("exception_type", ["AgentImageMismatch", "PolicyViolation", "AgentTimeoutError"])
def test_a_deterministic_failure_is_not_tried_again(
    tmp_path: Path, exception_type: str, store: RedisCoordinator
) -> None:
    world = _world(store, tmp_path, [exception_type], max_retries=3)
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    assert outcome.record.exception_type == exception_type and outcome.record.tries == 1
    assert outcome.record.stage == ("harness" if exception_type == "AgentTimeoutError" else "policy")
    assert world.pier.runs == 1 and world.slept == []


def test_a_provider_failure_is_run_again_apart_from_max_retries(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    failure = {"exception": "NonZeroAgentExitCodeError"}
    world = _world(store, tmp_path, [failure, failure, None], max_retries=0, provider_retries=3)
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    assert outcome.record.exception_type is None and outcome.record.tries == 3
    assert [t.provider_status for t in outcome.record.earlier_tries] == ["429", "429"]
    assert world.pier.runs == 3
    assert sum(world.slept) == pytest.approx(1.0 + 2.0)  # the provider back-off doubles


def test_a_provider_that_never_recovers_is_tried_four_times_by_default(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    failure = {"exception": "NonZeroAgentExitCodeError"}
    world = _world(store, tmp_path, [failure] * 5)  # --provider-retries left at its default
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    assert outcome.record.tries == 4 and world.pier.runs == 4  # the first try and 3 reruns
    assert outcome.record.provider_status == "429"
    assert [t.provider_status for t in outcome.record.earlier_tries] == ["429"] * 3


def test_a_host_found_unhealthy_after_a_failed_try_hands_the_trial_back(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    world: World

    def the_engine_goes() -> str:
        world.runtime.unhealthy = "the engine went away"
        return "RuntimeError"

    world = _world(store, tmp_path, [the_engine_goes], max_retries=2)
    outcome = world.handle()
    assert isinstance(outcome, HandBack) and outcome.host_fault
    assert world.coord.hosts()[HOST].paused and world.stored() is None


def test_an_unexpected_failure_is_the_trial_s_record_with_its_traceback(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    def crash() -> str:
        raise ValueError("x" * 5000)

    world = _world(store, tmp_path, [crash], max_retries=2)
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    record = outcome.record
    assert (record.exception_type, record.stage, record.tries) == ("ValueError", "worker", 1)
    assert record.exception_message == "x" * 2000
    assert record.exception_traceback is not None and "crash" in record.exception_traceback
    assert world.stored() == record and os.path.exists(world.paths.trial_record("001", 1))
