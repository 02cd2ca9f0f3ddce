"""A job reads only what its submitter may: the worker copies a task with the job owner's rights.

Issue 34, item 2. Admission checks that a job's selection lies under the
worker's roots, not that the job's owner (the account owning the job
directory) may read it; a worker running as root copied another account's
private task into the trial. Two real accounts (uids without a passwd entry,
as `test_secret_ownership.py` uses): alice (2000) keeps a task with a hidden
test in a 0700 selection; bob (2001) owns the job. Every file here lies in a
directory both accounts can reach (pytest's own is root's only).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from sciencebench.core.errors import RefusedError, Stage, TrialError
from sciencebench.core.paths import JobPaths
from sciencebench.core.taskdir import task_toml_sha256
from sciencebench.login.options import SubmitOptions
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import persist
from sciencebench.worker import ownerread, tries
from sciencebench.worker.admission import Admitted
from sciencebench.worker.snapshot import snapshot_task
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import make_selection, make_task

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(os.geteuid() != 0, reason="switching to other uids needs root"),
]

ALICE, BOB = 2000, 2001
HIDDEN = "hidden-test-canary-7f3a"


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every account may enter; each test's files are in it."""
    root = Path(tempfile.mkdtemp(prefix="sb-owner-reads-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _give(tree: Path, uid: int, mode_dirs: int = 0o700) -> None:
    """Make `tree` and everything in it `uid`'s; directories `mode_dirs`, files private to their owner."""
    for dirpath, _, filenames in os.walk(tree):
        os.chown(dirpath, uid, uid)
        os.chmod(dirpath, mode_dirs)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), uid, uid)
            os.chmod(os.path.join(dirpath, name), 0o600)


def _alices_task(shared: Path) -> Path:
    task = make_task(shared / "alice-selection", "001")
    (task / "tests" / "test_hidden.py").write_text(f"SECRET = {HIDDEN!r}\n")
    _give(shared / "alice-selection", ALICE)
    return task


def _bobs_task(shared: Path) -> Path:
    task = make_task(shared / "bob-selection", "001")
    _give(shared / "bob-selection", BOB)
    return task


def _no_canary(tree: Path) -> None:
    for dirpath, _, filenames in os.walk(tree):
        for name in filenames:
            assert HIDDEN not in Path(dirpath, name).read_text(errors="replace"), name


def test_another_accounts_private_selection_is_refused(shared: Path, tmp_path: Path) -> None:
    task = _alices_task(shared)  # bob's job.json names alice's 0700 selection
    with pytest.raises(RefusedError, match=rf"uid {BOB}") as refused:
        snapshot_task(task, dst := tmp_path / task.name, owner_uid=BOB)
    assert isinstance(refused.value, TrialError)  # a refused record, not an exception out of the trial
    _no_canary(dst) if dst.exists() else None


def test_the_owners_own_selection_snapshots_to_the_same_hash(shared: Path, tmp_path: Path) -> None:
    task = _bobs_task(shared)
    digest = snapshot_task(task, dst := tmp_path / task.name, owner_uid=BOB)
    assert digest == task_toml_sha256(task) == task_toml_sha256(dst)
    assert (dst / "tests" / "test.sh").read_bytes() == (task / "tests" / "test.sh").read_bytes()
    # The copy is the worker's (root's), as before: modes of its own, nothing of the owner's.
    assert all(p.stat().st_uid == os.getuid() for p in dst.rglob("*"))


def test_a_hard_link_to_a_file_the_owner_cannot_read_is_refused(shared: Path, tmp_path: Path) -> None:
    hidden = _alices_task(shared) / "tests" / "test_hidden.py"
    task = _bobs_task(shared)
    # Bob's own (readable) directory holds a second name of alice's 0600 file; the kernel's
    # protected_hardlinks stops bob making it on this host, not on every filesystem.
    os.link(hidden, task / "tests" / "test_hidden.py")
    assert os.stat(task / "tests" / "test_hidden.py").st_nlink == 2
    with pytest.raises(RefusedError, match=r"tests/test_hidden\.py.*uid 2001"):
        snapshot_task(task, dst := tmp_path / task.name, owner_uid=BOB)
    _no_canary(dst)


def test_a_file_of_another_account_in_the_owners_task_is_refused(shared: Path, tmp_path: Path) -> None:
    task = _bobs_task(shared)
    planted = task / "environment" / "notes.txt"
    planted.write_text(HIDDEN)
    os.chown(planted, ALICE, ALICE)
    planted.chmod(0o600)
    with pytest.raises(RefusedError, match=r"environment/notes\.txt"):
        snapshot_task(task, dst := tmp_path / task.name, owner_uid=BOB)
    _no_canary(dst)


def test_what_the_owner_may_read_through_other_rights_is_copied(shared: Path, tmp_path: Path) -> None:
    # Alice's file, readable by others: bob may read it, so his task may hold it.
    task = _bobs_task(shared)
    shared_file = task / "environment" / "data.txt"
    shared_file.write_text("public\n")
    os.chown(shared_file, ALICE, ALICE)
    shared_file.chmod(0o644)
    snapshot_task(task, dst := tmp_path / task.name, owner_uid=BOB)
    assert (dst / "environment" / "data.txt").read_text() == "public\n"


def test_the_owners_rights_are_not_roots(shared: Path, tmp_path: Path) -> None:
    # A file of bob's own with mode 0000: root could read it, bob cannot; so the reads are not root's.
    task = _bobs_task(shared)
    (task / "environment" / "Dockerfile").chmod(0)
    with pytest.raises(RefusedError, match=r"environment/Dockerfile: the job's owner \(uid 2001\) may not"):
        snapshot_task(task, tmp_path / task.name, owner_uid=BOB)


def test_the_owners_supplementary_groups_count(
    shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Alice's file is readable by group 3000 only; bob may read it when (and only when) he is in it.
    task = _bobs_task(shared)
    grouped = task / "environment" / "group.txt"
    grouped.write_text("group\n")
    os.chown(grouped, ALICE, 3000)
    grouped.chmod(0o640)
    assert ownerread.owner_groups(BOB) == (ownerread.NO_GROUP, [])  # no passwd entry: no group
    with pytest.raises(RefusedError, match=r"environment/group\.txt"):
        snapshot_task(task, tmp_path / "without" / task.name, owner_uid=BOB)
    monkeypatch.setattr(ownerread, "owner_groups", lambda uid: (BOB, [BOB, 3000]))
    snapshot_task(task, dst := tmp_path / "with" / task.name, owner_uid=BOB)
    assert (dst / "environment" / "group.txt").read_text() == "group\n"


def test_the_refusal_is_the_trials_record(shared: Path, tmp_path: Path) -> None:
    # Bob's job names a task alice made private after submit: the try ends in a refused record.
    selection = make_selection(shared / "alice-selection", ["002"])
    (selection / "task_002" / "tests" / "test_hidden.py").write_text(f"SECRET = {HIDDEN!r}\n")
    prepared = prepare(SubmitOptions(path=selection, jobs_dir=tmp_path / "jobs", job_name="steal"))
    done = persist(prepared, build_run_record(prepared.job, prepared.trials[0], "redis://x", []))
    _give(selection, ALICE)
    spec = done.trials[0]
    admitted = Admitted(job=done.job, paths=JobPaths(done.job.jobs_dir, done.job.job_name), owner_uid=BOB)
    ctx = SimpleNamespace(settings=SimpleNamespace(hostname="host"))
    root = tmp_path / "scratch"
    root.mkdir(mode=0o700)
    started = datetime.now(UTC)
    attempt = tries._one_try(spec, ctx, admitted, None, started, root, 1)  # type: ignore[arg-type]
    assert attempt.record.exception_type == "RefusedError"
    assert attempt.record.stage == Stage.ADMISSION and not attempt.retryable and attempt.pier_dir is None
    assert "a job reads only what its submitter may" in (attempt.record.exception_message or "")
    _no_canary(root)


def _as_worker(uid: int, src: Path, dst: Path, owner: int) -> str:
    """`snapshot_task(src, dst, owner_uid=owner)` in a process of account `uid` (not root): how it ended."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        outcome = "did not report"
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            outcome = f"copied {snapshot_task(src, dst, owner_uid=owner)}"
        except BaseException as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(write_end, outcome.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        outcome = pipe.read().decode()
    os.waitpid(pid, 0)
    return outcome


WORKER = 2002  # a worker account that is not root and not the submitter (a shared group's, say)


def _workers_scratch(shared: Path) -> Path:
    scratch = shared / "scratch"
    scratch.mkdir()
    os.chown(scratch, WORKER, WORKER)
    return scratch


def _bobs_readable_task(shared: Path) -> Path:
    task = make_task(shared / "bob-selection", "001")
    _give(shared / "bob-selection", BOB, mode_dirs=0o755)
    for path in task.rglob("*"):
        if path.is_file():
            path.chmod(0o644)
    return task


def test_a_worker_that_is_not_root_copies_the_owners_own_files(shared: Path) -> None:
    task = _bobs_readable_task(shared)
    outcome = _as_worker(WORKER, task, _workers_scratch(shared) / task.name, BOB)
    assert outcome == f"copied {task_toml_sha256(task)}"


def test_a_worker_that_is_not_root_refuses_a_file_the_owner_does_not_own(shared: Path) -> None:
    # The worker's own private file, linked into bob's task: the worker could read it, bob could not.
    task = _bobs_readable_task(shared)
    scratch = _workers_scratch(shared)
    private = scratch / "worker-private.txt"
    private.write_text(HIDDEN)
    os.chown(private, WORKER, WORKER)
    private.chmod(0o600)
    os.link(private, task / "tests" / "test_hidden.py")
    outcome = _as_worker(WORKER, task, scratch / task.name, BOB)
    assert outcome.startswith(
        f"RefusedError: {task.name}: tests/test_hidden.py belongs to another account (uid {WORKER}) "
        f"than the job's owner (uid {BOB})"
    ), outcome
    _no_canary(scratch / task.name)


def test_a_worker_that_is_not_root_refuses_another_accounts_selection(shared: Path) -> None:
    # Alice's task, readable by everyone, in bob's job: not bob's own, so not copied.
    task = _alices_task(shared)
    for path in (task.parent, task, *task.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    scratch = _workers_scratch(shared)
    outcome = _as_worker(WORKER, task, scratch / task.name, BOB)
    assert outcome.startswith(f"RefusedError: {task.name} belongs to another account (uid {ALICE})"), outcome
    assert not (scratch / task.name).exists()


# --- the reader process itself (a review's findings) ----------------------------------------------


def _root_only(shared: Path) -> Path:
    secret = shared / "root-only.txt"
    secret.write_text(HIDDEN)
    secret.chmod(0o600)
    return secret


def test_the_reader_holds_no_descriptor_of_the_workers_and_no_capability(shared: Path) -> None:
    leaked = os.open(_root_only(shared), os.O_RDONLY)  # inheritable: posix_spawn would pass it on
    os.set_inheritable(leaked, True)
    try:
        with ownerread.opener_for(BOB) as access:
            os.close(access.open(shared, os.O_RDONLY | os.O_DIRECTORY, None))  # answered: it is serving
            reader = access.open.__self__  # type: ignore[attr-defined]
            # The reader closes what it sent just after sending it: wait for that, not for the leak.
            deadline = time.monotonic() + 5
            while (fds := {int(fd) for fd in os.listdir(f"/proc/{reader.pid}/fd")}) != {0, 1, 2, 3}:
                assert time.monotonic() < deadline, (fds, leaked)
                time.sleep(0.01)
            status = Path(f"/proc/{reader.pid}/status").read_text()
            caps = {k: v.strip() for k, v in (line.split(":", 1) for line in status.splitlines())}
            assert caps["CapEff"] == caps["CapPrm"] == caps["CapAmb"] == "0" * 16
    finally:
        os.close(leaked)


KEEP_CAPABILITIES = """
import ctypes, sys
from sciencebench.worker import ownerread
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(28, 1 << 2, 0, 0, 0) == 0  # PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP: caps kept
try:
    with ownerread.opener_for(int(sys.argv[2])) as access:
        fd = access.open(sys.argv[1], 0, None)
except Exception as exc:
    print("refused:", type(exc).__name__)
else:
    print("opened:", open(fd).read())
"""


def test_a_reader_that_kept_roots_capabilities_opens_nothing(shared: Path) -> None:
    # A worker whose supervisor set SECBIT_NO_SETUID_FIXUP keeps its capabilities across the setuid.
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", KEEP_CAPABILITIES, str(_root_only(shared)), str(BOB)],
        capture_output=True, text=True, timeout=60, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("refused:") and HIDDEN not in run.stdout, run.stdout
