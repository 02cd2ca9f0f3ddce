"""A worker process that dies in the middle of a trial, and `worker.recovery` in another process after it.

The owner process is real and dies for real: `handle` runs in a forked
child that ends with `os._exit` at the point each test chooses (inside Pier,
at the commit, after it, at a try's cleanup), so nothing of its own unwinds:
its scratch, journal and lease stay as a killed worker leaves them. The
store is the session's redis-server, shared by both processes; the engine
and Pier are test doubles (`FakeRuntime`, `DyingPier`), the rest is the
worker's own code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sciencebench.coordination.protocol import Coordinator
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.errors import BrokerUnavailableError, WorkspaceError
from sciencebench.core.models import Redispatch, TrialRecord, TrialSpec
from sciencebench.core.paths import JobPaths, ScratchPaths
from sciencebench.core.settings import Settings
from sciencebench.login.options import SubmitOptions
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import Prepared, persist
from sciencebench.worker import journal
from sciencebench.worker.context import WorkerContext
from sciencebench.worker.dispatch import EMBEDDED, Answer, Clustered, not_counted
from sciencebench.worker.pier.process import PierRun
from sciencebench.worker.recovery import KEEP_MAX_SEC, recover_dead
from sciencebench.worker.trial import handle
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import make_selection
from tests.fixtures.services import RedisServer
from tests.unit.test_trial_states import FakeRuntime

pytestmark = pytest.mark.unit

DEAD_HOST, RESCUER = "w1@unit", "w2@unit"
LEASE = 2.0
DIED = 9  # the exit code of a death
PIER_SEC = 1.5  # how long each of Pier's trials says it ran


def die() -> None:
    """The owner process dies here: nothing unwinds, no `finally` runs."""
    os._exit(DIED)


@dataclass
class DyingPier:
    """Pier's runs, one outcome each: writes the trial directory Pier would, and dies where told.

    An outcome: `exception` (None: rewarded), `provider` (Codex's log shows a
    429), `result` (False: Pier never wrote its result.json), `cancelled`
    (Pier was stopped by a signal and wrote so), `die` (after the run's files).
    """

    outcomes: list[dict[str, Any]]
    runs: int = 0

    def __call__(self, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path, timeout_sec: float,
                 should_stop: Callable[[], bool] = lambda: False, poll_sec: float = 0.5,
                 zygote_env: dict[str, str] | None = None, memory_limit: int = 0) -> PierRun:  # fmt: skip
        outcome = self.outcomes[min(self.runs, len(self.outcomes) - 1)]
        self.runs += 1
        trial = cwd / "job" / f"task_001__run{self.runs}x"
        (trial / "artifacts").mkdir(parents=True)
        (trial / "artifacts" / "model.patch").write_text("")
        exception = "CancelledError" if outcome.get("cancelled") else outcome.get("exception")
        if outcome.get("provider"):
            (trial / "agent").mkdir()
            events = [{"type": "turn.started"}, {"type": "turn.failed", "error": {"message": "429 Too Many"}}]
            (trial / "agent" / "codex.txt").write_text("".join(json.dumps(e) + "\n" for e in events))
        if outcome.get("result", True):
            began, now = (
                (datetime.now(UTC) - timedelta(seconds=PIER_SEC)).isoformat(),
                datetime.now(UTC).isoformat(),
            )
            result = {
                "task_name": "task_001", "trial_name": trial.name, "started_at": began, "finished_at": now,
                "verifier_result": None if exception else {"rewards": {"reward": 1.0}},
                "exception_info": {"exception_type": exception, "exception_message": f"fake {exception}"}
                if exception else None,
            }  # fmt: skip
            (trial / "result.json").write_text(json.dumps(result))
        if outcome.get("die"):
            die()
        return PierRun(exit_code=0, duration_sec=0.0, timed_out=False, cancelled=False, log_tail="")


@dataclass
class DyingStore:
    """The store, but the owner dies at its commit: before it (`before`) or right after it (`after`)."""

    store: Coordinator
    when: str = "before"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def commit_result(self, *args: Any, **kwargs: Any) -> bool:
        if self.when == "after":
            self.store.commit_result(*args, **kwargs)
        die()
        raise AssertionError("unreachable")


@dataclass
class Away:
    """The store, away: every read of a record fails as an outage does."""

    store: Coordinator

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def get_result(self, job: str, key: str) -> str | None:
        raise BrokerUnavailableError("broker unreachable")


@dataclass
class World:
    """One persisted job of one trial; its dead owner's context and the rescuer's."""

    prepared: Prepared
    settings: Settings
    url: str
    runtime: FakeRuntime = field(default_factory=FakeRuntime)

    @property
    def spec(self) -> TrialSpec:
        return self.prepared.trials[0]

    @property
    def paths(self) -> JobPaths:
        return JobPaths(self.prepared.job.jobs_dir, self.prepared.job.job_name)

    def coord(self) -> RedisCoordinator:
        return RedisCoordinator(self.url)

    def run_and_die(self, pier: list[dict[str, Any]], store: str | None = None,
                    at_cleanup: bool = False, local: bool = False) -> None:  # fmt: skip
        """Run the trial in a forked owner process that dies as scripted; wait for its death.

        `local`: the owner is a `submit --local` run (`EMBEDDED`), not a Celery worker.
        """
        pid = os.fork()
        if pid == 0:  # the owner: never returns
            try:
                coord: Any = self.coord()
                if store is not None:
                    coord = DyingStore(coord, store)
                runtime = FakeRuntime(on_cleanup=lambda name: die()) if at_cleanup else FakeRuntime()
                ctx = WorkerContext(coord=coord, runtime=runtime, settings=self.settings,
                                    owner=f"dead-{os.getpid()}", pier=DyingPier(pier),
                                    sleep=lambda s: None)  # fmt: skip
                dispatch = EMBEDDED if local else Clustered(Redispatch(task_id="task-1", trial=self.spec))
                handle(self.spec, ctx, dispatch)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == DIED, "the owner was to die mid-trial"

    def rescue_and_die(self, when: str) -> None:
        """Recover in a forked rescuer whose store kills it at its commit (`DyingStore`)."""
        pid = os.fork()
        if pid == 0:
            try:
                recover_dead(replace(self.rescuer(), coord=DyingStore(self.coord(), when)))
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == DIED, "the rescuer was to die at its commit"

    def rescuer(self) -> WorkerContext:
        settings = self.settings.model_copy(update={"hostname": RESCUER})
        return WorkerContext(coord=self.coord(), runtime=self.runtime, settings=settings, owner="rescuer")

    def stored(self) -> TrialRecord | None:
        recorded = self.coord().get_result(self.spec.job_key, self.spec.key)
        return TrialRecord.model_validate_json(recorded) if recorded else None

    def runs_left(self) -> list[Path]:
        job_scratch = ScratchPaths(self.settings.scratch_root).job_dir(self.spec.job_id)
        return sorted(job_scratch.iterdir()) if job_scratch.exists() else []


@pytest.fixture
def make_world(tmp_path: Path, redis_server: RedisServer) -> Callable[..., World]:
    def make(**options: Any) -> World:
        selection = make_selection(tmp_path / "sel", ["001"])
        opts = SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="j", **options)
        prepared = prepare(opts)
        done = persist(prepared, build_run_record(prepared.job, prepared.trials[0], "redis://x", []))
        # Its owners die holding part of the host's capacity until their leases lapse, and every test
        # here runs on one host name of one store: no capacity binds here.
        env = {"SCIENCEBENCH_STATE_DIR": str(tmp_path / "state"), "SCIENCEBENCH_CPUS": "1000"}
        settings = Settings.from_env(env).model_copy(
            update={"hostname": DEAD_HOST, "lease_seconds": LEASE, "warm_pier": False,
                    "jobs_roots": (tmp_path / "jobs",), "selection_roots": (selection,)}
        )  # fmt: skip
        return World(done, settings, redis_server.url)

    return make


@pytest.fixture(autouse=True)
def _uncounted() -> Iterator[None]:
    yield
    not_counted("task-1")  # a copy answered in the test keeps its lease renewed until counted


def _recovered(world: World) -> list[str]:
    lines = recover_dead(world.rescuer())
    assert world.runs_left() == [], "nothing of a dead run stays in the scratch"
    return lines


# --- what a dead run holds, committed ------------------------------------------------------


def test_a_run_whose_owner_died_after_pier_ended_is_committed_and_its_copy_answers_with_it(
    make_world: Callable[..., World],
) -> None:
    world = make_world()
    world.run_and_die([{"die": True}])
    assert world.stored() is None and sum(p.is_dir() for p in world.runs_left()) == 1
    assert not world.coord().acquire_slot(world.spec.job_key, "probe", 1, LEASE)  # the dead run's slot
    (line,) = _recovered(world)
    assert "its worker process died after its Pier run ended; its record is committed" in line
    record = world.stored()
    assert record is not None and record.rewards == {"reward": 1.0} and record.exception_type is None
    assert record.worker == DEAD_HOST and record.tries == 1 and record.trial_dir == "task_001__run1x"
    # Pier's span of the trial and its end, as its result.json says (what the history and summary read).
    assert record.measured_sec == pytest.approx(PIER_SEC, abs=0.01)
    pier = json.loads((world.paths.job_dir / record.trial_dir / "result.json").read_text())
    assert record.finished_at == datetime.fromisoformat(pier["finished_at"])
    assert (world.paths.job_dir / record.trial_dir / "result.json").is_file()
    written = world.paths.trial_record(world.spec.task_id, world.spec.attempt).read_bytes()
    assert TrialRecord.model_validate_json(written) == record
    assert world.runtime.cleaned == ["task_001__run1x"]
    coord, job, key = world.coord(), world.spec.job_key, world.spec.key
    assert coord.acquire_slot(job, "probe", 1, LEASE), "its slot was given back"
    # Its running entry stays: once the lease lapses the watchdog sends it again, and the copy
    # answers the chord with the committed record, running nothing.
    time.sleep(LEASE * 1.25)
    assert [k for j, k, _ in coord.orphaned() if j == job] == [key]
    assert coord.take_orphan(job, key)
    copy_pier = DyingPier([{}])
    ctx = replace(world.rescuer(), pier=copy_pier)
    answer = handle(world.spec, ctx, Clustered(Redispatch(task_id="task-1", trial=world.spec)))
    assert isinstance(answer, Answer) and answer.leased and answer.record == record
    assert copy_pier.runs == 0


def test_a_run_whose_owner_died_at_its_commit_is_committed_from_its_journal(
    make_world: Callable[..., World],
) -> None:
    world = make_world()
    world.run_and_die([{}], store="before")
    (line,) = _recovered(world)
    assert "its record is committed" in line
    record = world.stored()
    assert record is not None and record.rewards == {"reward": 1.0} and record.worker == DEAD_HOST


def test_a_run_whose_owner_died_after_its_commit_has_its_files_put_in_place(
    make_world: Callable[..., World],
) -> None:
    world = make_world()
    world.run_and_die([{}], store="after")
    record = world.stored()
    assert record is not None and record.trial_dir is not None
    assert not (world.paths.job_dir / record.trial_dir).exists()  # still under its temporary name
    (line,) = _recovered(world)
    assert "died after its record's commit; its files are put in place" in line
    assert (world.paths.job_dir / record.trial_dir / "result.json").is_file()
    assert [p.name for p in world.paths.job_dir.iterdir() if p.name.startswith(".incoming")] == []
    written = world.paths.trial_record(world.spec.task_id, world.spec.attempt).read_bytes()
    assert TrialRecord.model_validate_json(written) == record


def test_a_second_try_is_committed_with_the_first_as_an_earlier_try(make_world: Callable[..., World]) -> None:
    world = make_world(max_retries=1)
    world.run_and_die([{"exception": "RuntimeError"}, {"die": True}])
    (line,) = _recovered(world)
    assert "its record is committed" in line
    record = world.stored()
    assert record is not None and record.tries == 2 and record.rewards == {"reward": 1.0}
    assert [t.exception_type for t in record.earlier_tries] == ["RuntimeError"]


@pytest.mark.parametrize("retries", [0, 1])
def test_a_provider_failure_is_committed_only_when_no_rerun_was_due(
    make_world: Callable[..., World], retries: int
) -> None:
    world = make_world(provider_retries=retries, max_retries=0)
    world.run_and_die([{"exception": "NonZeroAgentExitCodeError", "provider": True, "die": True}])
    (line,) = _recovered(world)
    record = world.stored()
    if retries:
        assert "another try was due; it runs again" in line and record is None
    else:
        assert "its record is committed" in line
        assert record is not None and record.provider_status == "429"


# --- what is not committed: run again --------------------------------------------------------


@pytest.mark.parametrize(
    ("pier", "said"),
    [
        ([{"result": False, "die": True}], "its Pier run had not ended"),
        ([{"cancelled": True, "die": True}], "its Pier run had not ended"),  # Pier stopped by a signal
    ],
)
def test_a_run_whose_pier_did_not_end_is_not_committed(
    make_world: Callable[..., World], pier: list[dict[str, Any]], said: str
) -> None:
    world = make_world()
    world.run_and_die(pier)
    (line,) = _recovered(world)
    assert said in line and world.stored() is None


def test_a_run_that_was_to_be_tried_again_is_not_committed(make_world: Callable[..., World]) -> None:
    world = make_world(max_retries=1)
    world.run_and_die([{"exception": "RuntimeError"}], at_cleanup=True)  # dies cleaning up before try 2
    (line,) = _recovered(world)
    assert "another try was due; it runs again" in line and world.stored() is None


def test_a_failed_run_on_a_host_unhealthy_now_is_not_committed(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.run_and_die([{"exception": "RewardFileNotFoundError", "die": True}])
    world.runtime.unhealthy = "the engine does not answer"
    (line,) = _recovered(world)
    assert "failed on a host unhealthy now" in line and world.stored() is None


def test_a_run_sent_again_meanwhile_is_not_committed(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.run_and_die([{"die": True}])
    coord, job, key = world.coord(), world.spec.job_key, world.spec.key
    time.sleep(LEASE * 1.25)
    assert coord.take_orphan(job, key)  # the watchdog was first: a copy of it runs elsewhere now
    (line,) = _recovered(world)
    assert "sent to another host meanwhile" in line and world.stored() is None
    # Nothing of it in the job directory: no trial directory, no copy under its temporary name.
    assert not [p for p in world.paths.job_dir.iterdir() if "task_001__" in p.name]
    assert not world.paths.superseded_dir.exists()
    assert world.runtime.cleaned == ["task_001__run1x"]  # what its compose projects left goes too


def test_a_run_whose_owner_lives_is_left_alone(make_world: Callable[..., World]) -> None:
    world = make_world()
    started = datetime.now(UTC)
    with journal.opened(world.settings, world.spec, "alive", started, True, lambda names: None) as root:
        assert recover_dead(world.rescuer()) == []
        assert ScratchPaths.claim(root).is_file()
    assert world.runs_left() == []


def test_a_dead_local_run_is_removed_not_committed(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.run_and_die([{"die": True}], local=True)
    (line,) = _recovered(world)
    assert "a `submit --local` run" in line and world.stored() is None


def test_a_dead_run_without_a_claim_is_removed(make_world: Callable[..., World]) -> None:
    world = make_world()
    journal.scratch_root(world.settings, world.spec, "early").mkdir(parents=True)  # died before its claim
    (line,) = _recovered(world)
    assert "no claim" in line


def test_a_rescuer_that_dies_after_its_commit_leaves_the_files_for_the_next_pass(
    make_world: Callable[..., World],
) -> None:
    world = make_world()
    world.run_and_die([{"die": True}])  # its try's end never journaled: rebuilt from Pier's files
    world.rescue_and_die("after")  # committed, then the rescuer died before publishing
    record = world.stored()
    assert record is not None and record.trial_dir == "task_001__run1x"
    assert not (world.paths.job_dir / record.trial_dir).exists()
    (line,) = _recovered(world)
    assert "its files are put in place" in line
    assert (world.paths.job_dir / record.trial_dir / "result.json").is_file()


def test_a_run_a_process_still_works_in_is_kept_until_it_is_gone(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.run_and_die([{"die": True}])
    (run,) = [p for p in world.runs_left() if p.is_dir()]
    # A Pier stopped by its worker's death still going down (compose, its result.json) works in there.
    ending = subprocess.Popen(["sleep", "60"], cwd=run / "try-1")
    try:
        (line,) = recover_dead(world.rescuer())
        assert "a process still works in it; looked at again later" in line
        assert recover_dead(world.rescuer()) == []  # kept, said once
        assert run.is_dir() and world.stored() is None and world.runtime.cleaned == []
    finally:
        ending.kill()
        ending.wait()
    (line,) = _recovered(world)
    assert "its record is committed" in line and world.stored() is not None


def test_a_run_the_store_could_not_take_is_kept_and_committed_by_a_later_pass(
    make_world: Callable[..., World],
) -> None:
    world = make_world()
    world.run_and_die([{"die": True}])

    (line,) = recover_dead(replace(world.rescuer(), coord=Away(world.coord())))
    assert "not ended (BrokerUnavailableError" in line and "looked at again later" in line
    assert any(p.is_dir() for p in world.runs_left()) and world.stored() is None
    (line,) = _recovered(world)
    assert "its record is committed" in line and world.stored() is not None


def test_only_the_scratch_s_own_layout_is_looked_at(make_world: Callable[..., World]) -> None:
    world = make_world()
    scratch = world.settings.scratch_root
    scratch.mkdir(mode=0o700, parents=True)
    foreign = [scratch / "models" / "llama-7b", scratch / str(world.spec.job_id) / "weights"]
    for directory in foreign:
        directory.mkdir(parents=True)
        (directory / "data.bin").write_text("not the worker's")
    assert recover_dead(world.rescuer()) == []
    assert all((directory / "data.bin").is_file() for directory in foreign)
    assert not list(scratch.glob("**/*.lock"))


def test_a_scratch_root_others_may_write_is_refused(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.settings.scratch_root.mkdir(parents=True)
    world.settings.scratch_root.chmod(0o777)
    with pytest.raises(WorkspaceError, match="no one else may write"):
        recover_dead(world.rescuer())


def test_a_lock_file_left_without_its_run_is_removed(make_world: Callable[..., World]) -> None:
    world = make_world()
    root = journal.scratch_root(world.settings, world.spec, "gone")
    journal.private_dir(root.parent)
    ScratchPaths.lock(root).write_text("")  # its process died between removing the run and the lock
    assert recover_dead(world.rescuer()) == []
    assert not root.parent.exists()


def test_a_forked_child_does_not_keep_the_run_locks_its_parent_holds(
    make_world: Callable[..., World],
) -> None:
    world = make_world()
    world.run_and_die([{"die": True}])
    (dead,) = journal.dead_runs(world.settings.scratch_root)
    ready, started = os.pipe()
    child = os.fork()
    if child == 0:  # a pool process Celery forks while the recoverer holds a run
        os.write(started, b".")  # past the fork hooks: it kept what it kept
        time.sleep(10)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"."
        dead.let_go()
        again = list(journal.dead_runs(world.settings.scratch_root))
        assert [d.root for d in again] == [dead.root], "the child holds the lock it inherited"
        for d in again:
            d.let_go()
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(ready)
        os.close(started)


def test_a_run_opens_though_the_job_s_scratch_goes_as_another_run_of_it_ends(
    make_world: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another run of the job ends between this run making the job's scratch and locking in it: its
    # end removes the then empty directory (seen in the soak: a WorkspaceError, a trial lost).
    world = make_world()
    made = journal.private_dir
    raced: list[Path] = []

    def racing(path: Path) -> None:
        made(path)
        if path.name == str(world.spec.job_id) and not raced:
            raced.append(path)
            path.rmdir()

    monkeypatch.setattr(journal, "private_dir", racing)
    started = datetime.now(UTC)
    with journal.opened(world.settings, world.spec, "me", started, True, lambda names: None) as root:
        assert raced and ScratchPaths.claim(root).is_file()
    assert world.runs_left() == []


def test_a_new_run_of_the_trial_removes_a_dead_one_and_what_its_compose_left(
    make_world: Callable[..., World],
) -> None:
    world = make_world()
    world.run_and_die([{"result": False, "die": True}])
    cleaned: list[tuple[str, ...]] = []
    with journal.opened(world.settings, world.spec, "copy", datetime.now(UTC), True, cleaned.append) as root:
        assert [p for p in world.runs_left() if p.is_dir()] == [root]
    assert cleaned == [("task_001__run1x",)]


def test_a_job_scratch_removed_between_its_check_and_its_use_is_made_again(
    make_world: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world()
    job_scratch = ScratchPaths(world.settings.scratch_root).job_dir(world.spec.job_id)
    seen = os.path.lexists
    lied: list[str] = []

    def there_a_moment_ago(path: Any) -> bool:
        if Path(path) == job_scratch and not lied:
            lied.append(str(path))
            return True  # it was there when looked at, and went before its lstat
        return seen(path)

    monkeypatch.setattr(os.path, "lexists", there_a_moment_ago)
    with journal.opened(world.settings, world.spec, "me", datetime.now(UTC), True, lambda names: None):
        assert lied
    assert world.runs_left() == []


def test_a_job_scratch_gone_while_a_pass_looks_at_it_is_no_error(
    make_world: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world()
    world.run_and_die([{"die": True}])
    take = journal._take_lock
    gone: list[Path] = []

    def after_it_went(path: Path, wait_sec: float) -> int | None:
        if not gone:  # its last run ended between the listing and this lock
            gone.append(path)
            raise FileNotFoundError(path)
        return take(path, wait_sec)

    monkeypatch.setattr(journal, "_take_lock", after_it_went)
    assert recover_dead(world.rescuer()) == [] and gone
    (line,) = _recovered(world)  # the next pass
    assert "its record is committed" in line


def test_a_run_whose_pier_result_cannot_be_read_runs_again(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.run_and_die([{"die": True}])
    (result,) = world.settings.scratch_root.glob("*/*/try-1/job/task_001__*/result.json")
    data = json.loads(result.read_text())
    result.write_text(json.dumps({**data, "verifier_result": "not a mapping"}))
    (line,) = _recovered(world)
    assert "its Pier result cannot be read" in line and world.stored() is None


def test_a_run_kept_longer_than_its_bound_is_removed(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.run_and_die([{"die": True}])
    (run,) = [p for p in world.runs_left() if p.is_dir()]
    marker = run / ".deferred"
    marker.write_text("")
    old = time.time() - KEEP_MAX_SEC - 60
    os.utime(marker, (old, old))
    world.runtime.unhealthy = None

    lines = recover_dead(replace(world.rescuer(), coord=Away(world.coord())))
    assert len(lines) == 1 and "removed after 6.0 h unended" in lines[0]
    assert world.runs_left() == [] and world.runtime.cleaned == ["task_001__run1x"]
