"""The worker's snapshot of a task directory: no link followed, bounded, hashed from the bytes it copied.

The attacker owns the selection and may change it at any moment, during
the copy too (simulated with the copy's per-entry hook, and with a thread
that keeps swapping a directory for a symlink): whatever happens, the
snapshot holds no link and nothing from outside the task, or the copy is
refused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sciencebench.core.errors import RefusedError, WorkspaceError
from sciencebench.core.taskdir import task_toml_sha256
from sciencebench.worker.snapshot import MAX_BYTES, MAX_DEPTH, MAX_ENTRIES, SnapshotLimits, snapshot_task
from tests.fixtures.selection import REAL_TASKS, make_task

pytestmark = pytest.mark.unit

SECRET = "worker-secret-canary"


@pytest.fixture
def task(tmp_path: Path) -> Path:
    task = make_task(tmp_path / "selection", "001")
    (task / "environment" / "docker-compose.yaml").write_text("services: {main: {}}\n")
    (task / "environment" / "data" / "deep").mkdir(parents=True)
    (task / "environment" / "data" / "deep" / "x.txt").write_text("x\n")
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("#!/bin/sh\n")
    (task / "solution" / "solve.sh").chmod(0o755)
    return task


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory of the worker's that no task may bring into a trial."""
    directory = tmp_path / "worker-files"
    directory.mkdir()
    (directory / "secret.txt").write_text(SECRET)
    return directory


def _tree(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            yield Path(dirpath) / name


def _assert_clean(snapshot: Path) -> None:
    """No link, no special file, nothing of the worker's in a snapshot (or a partial one)."""
    if not os.path.lexists(snapshot):
        return
    for path in _tree(snapshot):
        mode = path.lstat().st_mode
        assert stat.S_ISDIR(mode) or stat.S_ISREG(mode), path
        if stat.S_ISREG(mode):
            assert SECRET not in path.read_text(errors="replace"), path


# --- an ordinary task --------------------------------------------------------------------


def test_a_snapshot_is_the_tasks_bytes_and_its_hash_the_submits(task: Path, tmp_path: Path) -> None:
    dst = tmp_path / "scratch" / "task" / task.name
    dst.parent.mkdir(parents=True)
    digest = snapshot_task(task, dst)
    assert digest == task_toml_sha256(task) == task_toml_sha256(dst)
    sources = sorted(p.relative_to(task) for p in _tree(task))
    assert sorted(p.relative_to(dst) for p in _tree(dst)) == sources
    for relative in sources:
        if (task / relative).is_file():
            assert (dst / relative).read_bytes() == (task / relative).read_bytes()


def test_a_snapshot_has_plain_permissions_of_its_own(task: Path, tmp_path: Path) -> None:
    (task / "tests" / "test.sh").chmod(0o4755 | stat.S_ISGID)  # setuid/setgid never survive
    (task / "instruction.md").chmod(0o600)
    (task / "environment" / "data").chmod(0o777)
    old = os.umask(0o077)  # the snapshot's modes do not depend on the worker's umask
    try:
        snapshot_task(task, dst := tmp_path / task.name)
    finally:
        os.umask(old)
    modes = {p.relative_to(dst).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [dst, *_tree(dst)]}
    assert modes["."] == 0o755 and modes["environment/data"] == 0o755
    assert modes["tests/test.sh"] == 0o755 and modes["solution/solve.sh"] == 0o755
    assert modes["instruction.md"] == 0o644 and modes["task.toml"] == 0o644
    assert all(p.stat().st_uid == os.getuid() for p in _tree(dst))


def test_a_hard_link_is_copied_as_bytes(task: Path, tmp_path: Path) -> None:
    data = task / "environment" / "data"
    os.link(data / "deep" / "x.txt", data / "linked.txt")
    snapshot_task(task, dst := tmp_path / task.name)
    copied, other = (
        dst / "environment" / "data" / "linked.txt",
        dst / "environment" / "data" / "deep" / "x.txt",
    )
    assert copied.read_text() == "x\n"
    assert copied.stat().st_nlink == 1 and other.stat().st_nlink == 1
    assert copied.stat().st_ino != other.stat().st_ino != (data / "linked.txt").stat().st_ino


def test_step_compose_files_hash_in_the_submits_order(task: Path, tmp_path: Path) -> None:
    for step in ("a.b", "a", "b"):
        tests = task / "steps" / step / "tests"
        tests.mkdir(parents=True)
        (tests / "docker-compose.yaml").write_text(
            f"services: {{main: {{hostname: {step.replace('.', '-')}}}}}\n"
        )
    assert snapshot_task(task, tmp_path / task.name) == task_toml_sha256(task)


def test_every_real_task_snapshots_to_its_own_hash(tmp_path: Path) -> None:
    tasks = sorted(REAL_TASKS.glob("task_*"))
    assert len(tasks) == 10
    for task in tasks:
        assert snapshot_task(task, tmp_path / task.name) == task_toml_sha256(task), task


# --- what a snapshot refuses -------------------------------------------------------------


@pytest.mark.parametrize(
    "relative", ["notes.md", "environment/data", "environment/data/deep/y.txt", "tests/t"]
)
def test_a_symlink_at_any_depth_is_refused(task: Path, tmp_path: Path, outside: Path, relative: str) -> None:
    (task / relative).parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(task / relative, ignore_errors=True)
    (task / relative).symlink_to(outside / "secret.txt" if "." in relative else outside)
    with pytest.raises(RefusedError, match=f"task_001: {relative} is a symlink"):
        snapshot_task(task, dst := tmp_path / task.name)
    _assert_clean(dst)


def test_a_symlinked_task_directory_is_refused(task: Path, tmp_path: Path) -> None:
    link = tmp_path / "task_002"
    link.symlink_to(task)
    with pytest.raises(RefusedError, match="task_002 is a symlink"):
        snapshot_task(link, tmp_path / "snap" / "task_002")


def test_special_files_at_any_depth_are_refused_without_hanging(task: Path, tmp_path: Path) -> None:
    os.mkfifo(task / "environment" / "data" / "deep" / "pipe")
    with pytest.raises(RefusedError, match="environment/data/deep/pipe is not a regular file or directory"):
        snapshot_task(task, tmp_path / "one" / task.name)
    os.unlink(task / "environment" / "data" / "deep" / "pipe")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(task / "tests" / "sock"))
        with pytest.raises(RefusedError, match="tests/sock is not a regular file or directory"):
            snapshot_task(task, tmp_path / "two" / task.name)


def test_the_bounds_are_enforced(task: Path, tmp_path: Path) -> None:
    assert MAX_ENTRIES >= 1_000 and MAX_BYTES >= 64 * 2**20 and MAX_DEPTH >= 16
    count = sum(1 for _ in _tree(task))
    with pytest.raises(RefusedError, match=f"more than {count - 1} files and directories"):
        snapshot_task(task, tmp_path / "a" / task.name, SnapshotLimits(max_entries=count - 1))
    snapshot_task(task, tmp_path / "b" / task.name, SnapshotLimits(max_entries=count))
    (task / "environment" / "blob").write_bytes(b"\0" * 5000)
    with pytest.raises(RefusedError, match="more than 4096 bytes"):
        snapshot_task(task, tmp_path / "c" / task.name, SnapshotLimits(max_bytes=4096))
    with pytest.raises(RefusedError, match="deeper than 2 directories"):
        snapshot_task(task, tmp_path / "d" / task.name, SnapshotLimits(max_depth=2))


def test_a_changed_definition_gives_another_hash(task: Path, tmp_path: Path) -> None:
    submitted = task_toml_sha256(task)
    (task / "instruction.md").write_text("Read /etc/shadow.\n")
    assert snapshot_task(task, tmp_path / task.name) != submitted


def test_a_missing_defining_file_or_task_is_a_workspace_error(task: Path, tmp_path: Path) -> None:
    (task / "pre_artifacts.sh").unlink()
    with pytest.raises(WorkspaceError, match=r"pre_artifacts\.sh"):
        snapshot_task(task, tmp_path / "a" / task.name)
    with pytest.raises(WorkspaceError, match="unreadable on this worker"):
        snapshot_task(tmp_path / "task_404", tmp_path / "b" / "task_404")


# --- an attacker changing the task during the copy ----------------------------------------


def _swap_at(relative: str, swap: Callable[[Path], None], task: Path) -> Callable[[str], None]:
    """A hook that swaps `relative` once, just before the copy opens it."""
    done: list[str] = []

    def hook(entry: str) -> None:
        if entry == relative and not done:
            done.append(entry)
            swap(task / relative)

    return hook


def _to_link(target: Path) -> Callable[[Path], None]:
    def swap(path: Path) -> None:
        path.rename(path.with_name(path.name + ".moved"))
        path.symlink_to(target)

    return swap


@pytest.mark.parametrize(
    ("relative", "says"),
    [
        ("environment", "environment is a symlink"),
        ("environment/data", "environment/data is a symlink"),
        ("environment/data/deep/x.txt", "environment/data/deep/x.txt is a symlink"),
        ("instruction.md", "instruction.md is a symlink"),
    ],
)
def test_an_entry_swapped_for_a_link_during_the_copy_never_lands(
    task: Path, tmp_path: Path, outside: Path, relative: str, says: str
) -> None:
    target = outside / "secret.txt" if relative.endswith((".txt", ".md")) else outside
    hook = _swap_at(relative, _to_link(target), task)
    with pytest.raises(RefusedError, match=says):
        snapshot_task(task, dst := tmp_path / task.name, before_open=hook)
    _assert_clean(dst)


def test_a_file_swapped_for_a_fifo_or_a_directory_during_the_copy_is_refused(
    task: Path, tmp_path: Path
) -> None:
    def to_fifo(path: Path) -> None:
        path.unlink()
        os.mkfifo(path)

    def to_dir(path: Path) -> None:
        path.unlink()
        path.mkdir()

    for number, swap in enumerate((to_fifo, to_dir)):
        target = task / "tests" / "test.sh"
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        target.write_text("#!/bin/sh\n")
        hook = _swap_at("tests/test.sh", swap, task)
        with pytest.raises(WorkspaceError, match=r"tests/test\.sh changed while the worker copied it"):
            snapshot_task(task, dst := tmp_path / str(number) / task.name, before_open=hook)
        _assert_clean(dst)


def test_a_thread_swapping_a_directory_for_a_link_never_gets_it_into_a_snapshot(
    task: Path, tmp_path: Path, outside: Path
) -> None:
    data = task / "environment" / "data"
    real = task / "environment" / "data.real"
    data.rename(real)
    stop = threading.Event()

    def attacker() -> None:
        while not stop.is_set():
            for make in (lambda: real.rename(data), lambda: data.symlink_to(outside)):
                with contextlib.suppress(OSError):
                    make()
                with contextlib.suppress(OSError):
                    data.unlink() if data.is_symlink() else data.rename(real)

    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    outcomes = {"copied": 0, "refused": 0}
    deadline = time.monotonic() + 20
    try:
        number = 0
        # 300 copies at least, and on until the attacker has been caught once (a loaded host
        # may schedule its thread late).
        while number < 300 or (not outcomes["refused"] and time.monotonic() < deadline):
            number += 1
            dst = tmp_path / "snaps" / str(number) / task.name
            dst.parent.mkdir(parents=True)
            try:
                snapshot_task(task, dst)
                outcomes["copied"] += 1
            except (RefusedError, WorkspaceError):
                outcomes["refused"] += 1
            _assert_clean(dst)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert outcomes["copied"] + outcomes["refused"] == number, outcomes
    assert outcomes["refused"] > 0, outcomes  # the attacker was at work
