"""Issue 34, bounded outputs: a tree a container shaped never loses its trial nor wedges the host's scratch.

The attack: a container leaves a directory tree 1,100 levels deep. Every walk
of such a tree (the copy into the job directory, the scratch's removal at a
run's end or a dead run's, the extraction from a container) used to recurse;
Python's recursion limit then raised RecursionError out of the copy and out of
`shutil.rmtree(ignore_errors=True)`, so the run's lock was never released.
Each test builds that tree (directories made relative to their parent's
descriptor: no path is ever longer than a component) and asserts what must hold.
The last tests bound what all of a trial's downloads carry together (each
transfer was bounded alone) and name a download stopped at a bound as the
trial's output-limit failure.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from pier.models.task.config import EnvironmentConfig
from pier.models.trial.paths import TrialPaths

from sciencebench.core.errors import OutputLimitError, Stage, TransferRefused
from sciencebench.core.failures import recorded_failure
from sciencebench.core.models import TrialRecord, TrialSpec
from sciencebench.core.paths import MAX_TREE_DEPTH, JobPaths, ScratchPaths, copy_tree_at, remove_tree_at
from sciencebench.core.settings import Settings
from sciencebench.login.options import SubmitOptions
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import persist
from sciencebench.network.environment import IsolatedDockerEnvironment
from sciencebench.network.extract import extract, extract_file
from sciencebench.network.refusals import record_refusals
from sciencebench.network.tarbuild import build_tar
from sciencebench.network.transfer import MAX_DEPTH, Budget, Refusal, Transfer
from sciencebench.worker import journal, publish, stages
from sciencebench.worker.dispatch import Answer
from sciencebench.worker.pier.layout import read_trial_outcome
from sciencebench.worker.trial import commit
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit

DEEP = 1_100
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@pytest.fixture(autouse=True)
def _removed_after(tmp_path: Path) -> Iterator[None]:
    """Each test's trees are removed by the walk under test (pytest's own cleanup recurses)."""
    yield
    fd = os.open(tmp_path, _DIR)
    try:
        for name in os.listdir(fd):
            remove_tree_at(fd, name)
    finally:
        os.close(fd)


def _deep_tree(top: Path, depth: int = DEEP) -> None:
    """`top/d/.../d/leaf`: `depth` directories below `top`, each made relative to its parent's descriptor."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, _DIR)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
        leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644, dir_fd=fd)
        os.write(leaf, b"deep")
        os.close(leaf)
    finally:
        os.close(fd)


def _depth(top: Path) -> int:
    """How many directories deep `top` goes along its `d` chain."""
    fd = os.open(top, _DIR)
    depth = 0
    try:
        while True:
            try:
                child = os.open("d", _DIR, dir_fd=fd)
            except FileNotFoundError:
                return depth
            os.close(fd)
            fd = child
            depth += 1
    finally:
        os.close(fd)


def test_a_tree_deeper_than_the_bound_is_not_copied_and_fails_as_an_output_limit(tmp_path: Path) -> None:
    _deep_tree(tmp_path / "trial")
    (tmp_path / "job").mkdir()
    job_fd = os.open(tmp_path / "job", _DIR)
    try:
        with pytest.raises(OutputLimitError, match=f"deeper than {MAX_TREE_DEPTH} directories"):
            copy_tree_at(tmp_path / "trial", job_fd, "copy")
    finally:
        os.close(job_fd)


def test_a_copy_within_the_bound_keeps_files_skips_links_and_keeps_holes(tmp_path: Path) -> None:
    _deep_tree(tmp_path / "trial", MAX_TREE_DEPTH - 1)
    source = tmp_path / "trial"
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o755)
    (source / "link").symlink_to("/etc/passwd")
    os.mkfifo(source / "fifo")
    with (source / "sparse.img").open("wb") as handle:
        handle.seek(2**30)
        handle.write(b"end")
    (tmp_path / "job").mkdir()
    job_fd = os.open(tmp_path / "job", _DIR)
    try:
        copy_tree_at(source, job_fd, "copy")
    finally:
        os.close(job_fd)
    copy = tmp_path / "job" / "copy"
    assert _depth(copy) == MAX_TREE_DEPTH - 1
    assert sorted(p.name for p in copy.iterdir()) == ["d", "run.sh", "sparse.img"]
    assert stat.S_IMODE((copy / "run.sh").stat().st_mode) == 0o755
    sparse = (copy / "sparse.img").stat()
    assert sparse.st_size == 2**30 + 3 and sparse.st_blocks * 512 < 2**20  # its hole stays a hole
    with (copy / "sparse.img").open("rb") as handle:
        handle.seek(2**30 - 2)
        assert handle.read() == b"\0\0end"


def test_a_1100_level_tree_is_removed_without_following_a_link(tmp_path: Path) -> None:
    _deep_tree(tmp_path / "scratch" / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("theirs")
    (tmp_path / "scratch" / "run" / "to-outside").symlink_to(outside)
    parent = os.open(tmp_path / "scratch", _DIR)
    try:
        remove_tree_at(parent, "run")
    finally:
        os.close(parent)
    assert list((tmp_path / "scratch").iterdir()) == []
    assert (outside / "keep").read_text() == "theirs"


def _world(tmp_path: Path) -> tuple[Settings, TrialSpec]:
    selection = make_selection(tmp_path / "sel", ["002"])
    prepared = prepare(SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="deep"))
    done = persist(prepared, build_run_record(prepared.job, prepared.trials[0], "redis://x", []))
    settings = Settings.from_env({"SCIENCEBENCH_STATE_DIR": str(tmp_path / "state")})
    return settings, done.trials[0]


def test_a_run_ending_with_a_1100_level_tree_frees_its_scratch_and_releases_its_lock(tmp_path: Path) -> None:
    settings, spec = _world(tmp_path)
    with journal.opened(settings, spec, "me", datetime.now(UTC), True, lambda names: None) as root:
        _deep_tree(root / "try-1" / "pier")
    assert not root.exists()
    assert not ScratchPaths.lock(root).exists()
    # The lock is free: the next run of the trial on this host takes it at once.
    with journal.opened(settings, spec, "next", datetime.now(UTC), True, lambda names: None) as again:
        assert again.is_dir()


def test_a_dead_run_with_a_1100_level_tree_is_removed_and_its_lock_released(tmp_path: Path) -> None:
    settings, spec = _world(tmp_path)
    root = journal.scratch_root(settings, spec, "dead")
    journal.private_dir(root)
    _deep_tree(root / "try-1" / "pier")
    (dead,) = journal.dead_runs(settings.scratch_root)
    dead.remove()
    assert not root.exists() and not ScratchPaths.lock(root).exists()
    assert list(journal.dead_runs(settings.scratch_root)) == []


def test_a_trial_directory_too_deep_is_not_staged_and_leaves_no_partial_copy(tmp_path: Path) -> None:
    _, spec = _world(tmp_path)
    paths = JobPaths(tmp_path / "jobs", "deep")
    trial = tmp_path / "scratch" / "task_002__abcdefg"
    _deep_tree(trial / "artifacts")
    record = TrialRecord(job_id=spec.job_id, job_name=spec.job_name, task_id="002", attempt=1)
    with pytest.raises(OutputLimitError):
        publish.stage_dirs(paths, spec, [stages.Try(record=record, pier_dir=trial, retryable=False)])
    assert not (paths.job_dir / publish.incoming_name(trial.name)).exists()


def _deep_tar(depth: int) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        name = "artifacts"
        for _ in range(depth + 1):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(info)
            name += "/d"
        info = tarfile.TarInfo(name + "/leaf")
        info.size = 4
        archive.addfile(info, io.BytesIO(b"deep"))
    buffer.seek(0)
    return buffer


def test_extraction_stops_at_the_depth_bound_and_names_it(tmp_path: Path) -> None:
    (tmp_path / "artifacts").mkdir()
    fd = os.open(tmp_path / "artifacts", _DIR)
    try:
        result: Transfer = extract(_deep_tar(DEEP), fd, strip="artifacts")
    finally:
        os.close(fd)
    assert any(f"deeper than {MAX_DEPTH} directories" in r.reason for r in result.refusals)
    assert any("extraction stopped" in r.reason for r in result.refusals)
    assert _depth(tmp_path / "artifacts") == MAX_DEPTH
    # What one transfer leaves is always copied whole into the job directory, wherever it was written.
    assert MAX_DEPTH + 8 <= MAX_TREE_DEPTH


def test_a_member_past_the_depth_bound_stops_extraction_before_the_exclude_patterns_see_it(
    tmp_path: Path,
) -> None:
    # The task author's patterns cost time growing with a member's depth (a review measured 32 s for
    # one member 2,000 deep): the bound is checked first, and an excluded name does not pass it.
    members = _tar_of({"/".join(["d"] * (MAX_DEPTH + 40)) + "/x.pyc": b"1", "after": b"2"})
    fd = os.open(tmp_path, _DIR)
    try:
        result = extract(members, fd, strip="artifacts", exclude=["*.pyc"])
    finally:
        os.close(fd)
    assert [r.reason for r in result.refusals] == [f"deeper than {MAX_DEPTH} directories: extraction stopped"]


def test_an_upload_of_a_1100_level_tree_stops_at_the_depth_bound_and_names_it(tmp_path: Path) -> None:
    _deep_tree(tmp_path / "outputs")
    archive, result = build_tar(tmp_path / "outputs")
    with archive, tarfile.open(fileobj=archive, mode="r|") as members:
        deepest = max(member.name.count("/") + 1 for member in members)
    assert deepest == MAX_DEPTH
    assert [r.reason for r in result.refusals] == [f"deeper than {MAX_DEPTH} directories (not copied)"]


def _tar_of(files: dict[str, bytes], top: str = "artifacts") -> io.BytesIO:
    """A tar of `files` below the directory `top`, or of the files alone when `top` is empty."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        if top:
            info = tarfile.TarInfo(top)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def test_the_trials_budget_bounds_bytes_and_members_over_all_its_transfers(tmp_path: Path) -> None:
    (tmp_path / "artifacts").mkdir()
    fd = os.open(tmp_path / "artifacts", _DIR)
    try:
        budget = Budget(max_bytes=10, max_members=100)
        first = extract(_tar_of({"a": b"123456"}), fd, strip="artifacts", budget=budget)
        assert first.refusals == [] and (budget.bytes, budget.members) == (6, 2)
        second = extract(_tar_of({"b": b"123456"}), fd, strip="artifacts", budget=budget)
        assert [r.reason for r in second.refusals] == [
            "over the trial's 10 byte bound over all its transfers: extraction stopped"
        ]
        with pytest.raises(TransferRefused, match="trial's 10 byte bound"):
            extract_file(_tar_of({"c": b"12345"}, top=""), fd, "c", budget=budget)
        members = Budget(max_members=3)
        extract(_tar_of({"d": b"", "e": b""}), fd, strip="artifacts", budget=members)
        third = extract(_tar_of({"f": b""}), fd, strip="artifacts", budget=members)
        assert [r.reason for r in third.refusals] == [
            "more than the trial's 3 members over all its transfers: extraction stopped"
        ]
    finally:
        os.close(fd)
    assert sorted(p.name for p in (tmp_path / "artifacts").iterdir()) == ["a", "d", "e"]


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar makes the sparse member")
def test_a_sparse_member_counts_by_its_apparent_size(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    with (source / "big").open("wb") as handle:
        handle.seek(64 * 2**20)
        handle.write(b"end")
    archive = tmp_path / "sparse.tar"
    subprocess.run(["tar", "--sparse", "-cf", str(archive), "-C", str(tmp_path), "src"], check=True)
    assert archive.stat().st_size < 2**20  # 64 MiB of holes in a small tar
    (tmp_path / "out").mkdir()
    fd = os.open(tmp_path / "out", _DIR)
    try:
        with archive.open("rb") as stream:
            result = extract(stream, fd, strip="src", max_bytes=2**20)
    finally:
        os.close(fd)
    assert [r.reason for r in result.refusals] == [
        f"over the {2**20} byte bound of one transfer: extraction stopped"
    ]
    assert not (tmp_path / "out" / "big").exists()


def test_a_download_stopped_at_a_bound_is_the_trials_output_limit_failure(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "result.json").write_text('{"verifier_result": {"rewards": {"reward": 1.0}}}')
    reason = f"deeper than {MAX_DEPTH} directories: extraction stopped"
    record_refusals(trial, "download", "/logs/artifacts", str(trial / "artifacts"), [Refusal("d/d", reason)])
    outcome = read_trial_outcome(trial)
    assert outcome.exception_type == OutputLimitError.__name__
    assert recorded_failure(OutputLimitError.__name__) == (Stage.COLLECT, True)
    # A refused item (a link) is still the transfer's refusal.
    (trial / "transfer-refusals.json").unlink()
    record_refusals(trial, "download", "/logs/agent", str(trial / "agent"), [Refusal("x", "symbolic link")])
    assert read_trial_outcome(trial).exception_type == "TransferRefused"


def _environment(tmp_path: Path) -> IsolatedDockerEnvironment:
    image = "127.0.0.1:5555/sciencebench/base@sha256:" + "c" * 64
    task = tmp_path / "task_001"
    (task / "environment").mkdir(parents=True, exist_ok=True)
    (task / "environment" / "Dockerfile").write_text(f"FROM {image}\n")
    (task / "task.toml").write_text("[environment]\n")
    trial_paths = TrialPaths(trial_dir=tmp_path / "trial")
    trial_paths.mkdir()  # type: ignore[no-untyped-call]
    return IsolatedDockerEnvironment(
        environment_dir=task / "environment", environment_name="t", session_id="t__x",
        trial_paths=trial_paths, owner="o", task_env_config=EnvironmentConfig(docker_image=image),
    )  # fmt: skip


def test_the_policy_environments_charge_every_download_of_a_trial_to_one_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_env, verifier_env = _environment(tmp_path), _environment(tmp_path)  # a separate verifier's too
    assert agent_env._received is verifier_env._received
    archives = iter([_tar_of({"a": b"123456"}, "agent"), _tar_of({"b": b"123456"}, "verifier")])
    for env in (agent_env, verifier_env):
        monkeypatch.setattr(env, "_archive", lambda source: next(archives))
        monkeypatch.setattr(env, "_close_docker", lambda: None)
    agent_env._received.max_bytes = 10
    trial = tmp_path / "trial"
    agent_env._download("/logs/agent", trial / "agent", file=False)
    verifier_env._download("/logs/verifier", trial / "verifier", file=False)
    assert (trial / "agent" / "a").read_bytes() == b"123456"
    assert not (trial / "verifier" / "b").exists()
    (trial / "result.json").write_text("{}")
    assert read_trial_outcome(trial).exception_type == OutputLimitError.__name__
    assert _environment(tmp_path / "other")._received is not agent_env._received


class _Store:
    """The one coordinator call `commit` makes before it publishes: the record is stored."""

    def __init__(self) -> None:
        self.stored: list[str] = []

    def commit_result(self, job: object, key: object, owner: object, record: str, status: object) -> bool:
        self.stored.append(record)
        return True


def test_a_trial_whose_directory_is_too_deep_is_committed_as_an_output_limit_failure(tmp_path: Path) -> None:
    settings, spec = _world(tmp_path)
    paths = JobPaths(tmp_path / "jobs", "deep")
    trial = tmp_path / "scratch" / "task_002__abcdefg"
    _deep_tree(trial / "artifacts")
    record = TrialRecord(
        job_id=spec.job_id, job_name=spec.job_name, task_id="002", attempt=1, trial_dir=trial.name
    )
    store = _Store()
    ctx = SimpleNamespace(coord=store, settings=settings, owner="me")
    admitted = SimpleNamespace(paths=paths)
    tries = [stages.Try(record=record, pier_dir=trial, retryable=False)]
    outcome = commit(spec, ctx, admitted, record, tries)  # type: ignore[arg-type]
    assert isinstance(outcome, Answer)
    assert outcome.record.exception_type == OutputLimitError.__name__
    assert outcome.record.stage == Stage.COLLECT
    assert TrialRecord.model_validate_json(store.stored[0]).exception_type == OutputLimitError.__name__
    assert not (paths.job_dir / publish.incoming_name(trial.name)).exists()
    assert not (paths.job_dir / trial.name).exists()


def test_an_earlier_try_too_deep_leaves_no_partial_copy_in_superseded(tmp_path: Path) -> None:
    _, spec = _world(tmp_path)
    paths = JobPaths(tmp_path / "jobs", "deep")
    earlier = tmp_path / "scratch" / "task_002__earlier"
    _deep_tree(earlier / "artifacts")
    final = tmp_path / "scratch" / "task_002__final"
    final.mkdir()
    record = TrialRecord(job_id=spec.job_id, job_name=spec.job_name, task_id="002", attempt=1)
    tries = [stages.Try(record=record, pier_dir=d, retryable=False) for d in (earlier, final)]
    with pytest.raises(OutputLimitError):
        publish.stage_dirs(paths, spec, tries)
    assert list(paths.superseded_dir.iterdir()) == []
