"""A claimed trial's journal in the host's scratch: enough for another process of the host to end it.

A run's scratch directory (`core.paths.ScratchPaths`) is host-local and the
worker's own. From the claim until the run is over its owner process holds
`<run>.lock` beside it, an flock the kernel drops when the process dies
(`opened`, which lists what the journal keeps). A run whose lock nobody
holds belongs to a dead process (`dead_runs`): `worker.recovery` commits
what it can of it and removes it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sciencebench.core.errors import WorkspaceError
from sciencebench.core.models import TrialRecord, TrialSpec
from sciencebench.core.paths import ScratchPaths, remove_tree_at
from sciencebench.core.settings import SCRATCH_DIR_ENV, Settings
from sciencebench.worker.pier.layout import find_trial_dirs
from sciencebench.worker.stages import PIER_JOB, Try

log = logging.getLogger(__name__)

_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
_MAX_JOURNAL_BYTES = 4 * 1024 * 1024
# How long an owner waits for a lock file a recoverer holds for a moment (a run that just ended).
_OWNER_WAIT_SEC = 5.0
# The scratch's own names (`ScratchPaths`): `<job id>/<task id>-<attempt>.<owner>`. Nothing else in
# the scratch root is looked at, let alone removed.
_JOB_NAME = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_RUN_NAME = re.compile(r"^[0-9]{3,12}-[0-9]+\.[A-Za-z0-9_-]+$")
_DEFERRED = ".deferred"

# Run-lock descriptors this process holds: its own runs', and dead runs' it is ending. A fork waits
# for `_HELD_LOCK`, so no descriptor is between its opening (or closing) and this set when it forks.
_HELD: set[int] = set()
_HELD_LOCK = threading.RLock()


def _close_held() -> None:
    """In a forked child: close the run locks the parent holds (the child holds none of them)."""
    global _HELD_LOCK
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()
    _HELD_LOCK = threading.RLock()  # the parent's is held across the fork


os.register_at_fork(
    before=lambda: _HELD_LOCK.acquire(),
    after_in_parent=lambda: _HELD_LOCK.release(),
    after_in_child=_close_held,
)


class Claimed(BaseModel):
    """A run's claim: the trial's message, its lease's owner and host, when the run started.

    `clustered`: a Celery worker's run (a `submit --local` run is not run again by a worker).
    """

    model_config = ConfigDict(frozen=True)

    spec: TrialSpec
    owner: str
    host: str
    started: datetime
    clustered: bool


class TryEnd(BaseModel):
    """How one try ended (`worker.stages.Try`), its Pier trial directory relative to the run's scratch."""

    model_config = ConfigDict(frozen=True)

    record: TrialRecord
    pier_dir: str | None
    retryable: bool
    retry_after_sec: float | None = None
    leftovers: tuple[str, ...] = ()

    @classmethod
    def of(cls, attempt: Try, root: Path) -> TryEnd:
        """The journal entry of `attempt`, a try of the run in `root`."""
        pier_dir = str(attempt.pier_dir.relative_to(root)) if attempt.pier_dir is not None else None
        return cls(record=attempt.record, pier_dir=pier_dir, retryable=attempt.retryable,
                   retry_after_sec=attempt.retry_after_sec, leftovers=attempt.leftovers)  # fmt: skip

    def to_try(self, root: Path) -> Try:
        """The Try again; a Pier directory that would lie outside `root` is dropped."""
        pier_dir = root / self.pier_dir if self.pier_dir else None
        if pier_dir is not None and (".." in Path(self.pier_dir or "").parts or pier_dir.is_symlink()):
            pier_dir = None
        return Try(record=self.record, pier_dir=pier_dir, retryable=self.retryable,
                   retry_after_sec=self.retry_after_sec, leftovers=self.leftovers)  # fmt: skip


def scratch_root(settings: Settings, spec: TrialSpec, owner: str) -> Path:
    """This run's private scratch directory: host-local, the worker's own, never in the job directory.

    `<scratch root>/<job id>/<task id>-<attempt>.<owner>`: the job directory
    is its submitter's, who could rename or swap anything in it while a trial
    runs there; nobody but the worker can touch this one (`private_dir`).
    """
    return ScratchPaths(settings.scratch_root).trial_dir(spec.job_id, spec.task_id, spec.attempt, owner)


def private_dir(path: Path) -> None:
    """Create `path` (and missing parents) with mode 0700; refuse one that is not the worker's own.

    Refused (WorkspaceError): a link, something other than a directory, a
    directory of another account or one that others may write.
    """
    for tries_left in (2, 1, 0):
        try:
            missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
            for directory in reversed(missing):
                with contextlib.suppress(FileExistsError):
                    directory.mkdir(mode=0o700)
            info = path.lstat()
            break
        except FileNotFoundError:  # removed as it was made (a job's last other run ended): again
            if not tries_left:
                raise WorkspaceError(f"scratch directory {path}: removed as it was made") from None
        except OSError as exc:
            raise WorkspaceError(f"scratch directory {path}: unusable ({exc.strerror})") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise WorkspaceError(
            f"scratch directory {path} must be a directory of the worker's own account that no one else "
            f"may write (set {SCRATCH_DIR_ENV} to one)"
        )


@contextlib.contextmanager
def opened(
    settings: Settings, spec: TrialSpec, owner: str, started: datetime, clustered: bool,
    clean_up: Callable[[tuple[str, ...]], None],
) -> Iterator[Path]:  # fmt: skip
    """The run's scratch directory with its claim written, the run's lock held; all gone at the end.

    Runs of the same trial that dead processes of this host left are removed
    first, after what their compose projects left (`clean_up` of their Pier
    trial directories' names): the claim just taken makes them impossible to
    commit. Raises WorkspaceError when the scratch cannot take the run.

        claim.json         the trial's message, the owner of its lease, when the run started (`Claimed`)
        try-<n>/try.json   how try n ended, once known (`TryEnd`): its record, Pier's trial
                           directory, whether it was worth another try

    The lock file is unlinked by whoever holds it, before letting go, so a lock
    is held only while the file at its path is the one locked (`_take_lock`); a
    process forked while this one holds run locks closes its copies
    (`os.register_at_fork`), or a run would look alive for as long as the child
    lives.
    """
    root = scratch_root(settings, spec, owner)
    private_dir(settings.scratch_root)
    private_dir(root.parent)
    lock = ScratchPaths.lock(root)
    fd = None
    for _ in range(3):
        try:
            fd = _take_lock(lock, _OWNER_WAIT_SEC)
            break
        except FileNotFoundError:  # the job's scratch went as its last other run ended: again
            private_dir(root.parent)
        except OSError as exc:
            raise WorkspaceError(
                f"scratch directory {root.parent}: cannot lock {lock.name} ({exc.strerror})"
            ) from None
    if fd is None:
        raise WorkspaceError(f"scratch directory {root.parent}: {lock.name} is held by another process")
    try:
        for dead in dead_runs(
            settings.scratch_root, within=root.parent, prefix=f"{spec.task_id}-{spec.attempt}."
        ):
            if dead.in_use():  # its Pier is still ending: `worker.recovery` removes it after
                dead.let_go()
                continue
            try:
                clean_up(dead.leftovers())
            finally:
                dead.remove()
        try:
            root.mkdir(mode=0o700)
            claim = Claimed(
                spec=spec, owner=owner, host=settings.hostname, started=started, clustered=clustered
            )
            _write(ScratchPaths.claim(root), claim.model_dump_json())
        except OSError as exc:
            raise WorkspaceError(f"scratch directory {root}: unusable ({exc.strerror})") from None
        yield root
    finally:
        try:
            remove_run(root)
        finally:
            _let_go(lock, fd)  # the lock goes after the directory: a live lock always has its run beside it
        with contextlib.suppress(OSError):
            root.parent.rmdir()  # the job's directory in scratch, once no trial of it runs here


def remove_run(root: Path) -> None:
    """Remove a run's scratch directory, however deep a container made it (`core.paths.remove_tree_at`).

    Best effort, as its end must go on to release the run's lock: a failure is logged.
    """
    try:
        parent = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        remove_tree_at(parent, root.name)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("%s: its scratch could not be removed whole (%s)", root.name, exc)
    finally:
        os.close(parent)


def _take_lock(path: Path, wait_sec: float) -> int | None:
    """Hold the run lock at `path` (made if missing): its descriptor, or None when a live process holds it.

    Waits up to `wait_sec` for a holder. The file at `path` must still be the
    one locked: a holder unlinks it before letting go, and a lock taken on an
    unlinked file is no lock, so then the new file is taken instead.
    """
    deadline = time.monotonic() + wait_sec
    while True:
        with _HELD_LOCK:
            fd = _locked(path)
        if fd is not None:
            return fd
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _locked(path: Path) -> int | None:
    """One try of `_take_lock` (under `_HELD_LOCK`): the held descriptor, None when another holds it."""
    fd = os.open(path, _LOCK_FLAGS, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        current = os.stat(path, follow_symlinks=False)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.ENOENT):
            return None  # held, or unlinked by its holder as it let go: tried again
        raise
    if not os.path.samestat(os.fstat(fd), current):
        os.close(fd)
        return None
    _HELD.add(fd)
    return fd


def _let_go(path: Path, fd: int) -> None:
    """Unlink a held run lock, then release it."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    _release(fd)


def _release(fd: int) -> None:
    """Release a held run lock (its file stays)."""
    with _HELD_LOCK:
        _HELD.discard(fd)
        os.close(fd)


def record_try(root: Path, number: int, attempt: Try) -> None:
    """Journal how try `number` of the run in `root` ended (best effort: a run without it is run again)."""
    directory = ScratchPaths.try_dir(root, number)
    try:
        directory.mkdir(mode=0o700, exist_ok=True)  # a try that failed before its first stage has none
        _write(ScratchPaths.try_end(directory), TryEnd.of(attempt, root).model_dump_json())
    except (OSError, ValueError) as exc:
        log.warning("%s: could not journal how try %d ended (%s)", root.name, number, exc)


def _write(path: Path, text: str) -> None:
    """Write a journal file of the worker's own scratch (no link followed at the file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def _read(path: Path) -> str | None:
    """A journal file's text; None when it is missing, not a regular file or too large."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        data = handle.read(_MAX_JOURNAL_BYTES + 1)
    return data.decode("utf-8", errors="replace") if len(data) <= _MAX_JOURNAL_BYTES else None


@dataclass
class DeadRun:
    """A run whose owner process is gone; this process holds its lock until `remove` or `let_go`."""

    root: Path
    fd: int

    def claimed(self) -> Claimed | None:
        """Its claim; None when it has none (it died first) or it cannot be read."""
        text = _read(ScratchPaths.claim(self.root))
        try:
            return Claimed.model_validate_json(text) if text is not None else None
        except ValueError:
            return None

    def tries(self) -> tuple[list[Try], Path | None]:
        """The tries whose end it journaled, in order, and the try directory after them, if it has one.

        That last directory is a try whose end was not journaled: it ran (or
        was running) when its process died.
        """
        ended: list[Try] = []
        for directory in self._try_dirs():
            text = _read(ScratchPaths.try_end(directory))
            try:
                if text is None:
                    return ended, directory
                ended.append(TryEnd.model_validate_json(text).to_try(self.root))
            except ValueError:
                return ended, directory
        return ended, None

    def leftovers(self) -> tuple[str, ...]:
        """The names of every Pier trial directory of its tries: whose compose projects may be left."""
        return tuple(
            trial.name for directory in self._try_dirs() for trial in find_trial_dirs(directory / PIER_JOB)
        )

    def _try_dirs(self) -> Iterator[Path]:
        """Its try directories in order (`try-1`, `try-2`, ...), up to the first missing one; no link."""
        number = 1
        while (directory := ScratchPaths.try_dir(self.root, number)).is_dir() and not directory.is_symlink():
            yield directory
            number += 1

    def in_use(self) -> bool:
        """Whether a live process works in it still (its Pier ending after the worker died, a compose)."""
        root = os.path.realpath(self.root)
        try:
            pids = [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]
        except OSError:
            return False
        for pid in pids:
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if cwd == root or cwd.startswith(root + os.sep):
                return True
        return False

    def kept_for(self) -> float:
        """How long it has been kept for a later look (s); 0.0 the first time, which marks it kept."""
        marker = self.root / _DEFERRED
        try:
            return max(0.0, time.time() - marker.lstat().st_mtime)
        except FileNotFoundError:
            pass
        try:
            _write(marker, "")
        except OSError:  # a full scratch, say: kept since its claim, so never kept for ever
            with contextlib.suppress(OSError):
                return max(0.0, time.time() - ScratchPaths.claim(self.root).lstat().st_mtime)
        return 0.0

    def let_go(self) -> None:
        """Release its lock, leaving it as it is (a later look takes it again)."""
        _release(self.fd)

    def remove(self) -> None:
        """Remove the run's scratch and its lock (what its process would have done at its end)."""
        try:
            remove_run(self.root)
        finally:
            _let_go(ScratchPaths.lock(self.root), self.fd)
        with contextlib.suppress(OSError):
            self.root.parent.rmdir()


def dead_runs(scratch: Path, within: Path | None = None, prefix: str = "") -> Iterator[DeadRun]:
    """The runs in `scratch` (or only in its job directory `within`) whose owner process is gone.

    Only the scratch's own layout is looked at: job directories named by a
    job id and run directories `<task id>-<attempt>.<owner>`, each a directory
    of this account that no one else may write; anything else is left alone.
    A run's lock that no live process holds is taken here and yielded with
    its run; the caller ends with `DeadRun.remove` or `DeadRun.let_go`. A run
    without a lock file (its process died between the two removals, or
    before there were locks) is taken too; a lock file left without its run
    is removed.
    """
    jobs = [within] if within is not None else [j for j in _subdirs(scratch) if _JOB_NAME.match(j.name)]
    for job in jobs:
        if not _own_private(job):
            continue
        for root in _subdirs(job):
            if not (_RUN_NAME.match(root.name) and root.name.startswith(prefix) and _own_private(root)):
                continue
            try:
                fd = _take_lock(ScratchPaths.lock(root), 0.0)
            except OSError:  # its job's scratch went meanwhile (its last run ended)
                continue
            if fd is None:
                continue  # its process lives
            if not root.is_dir():  # it ended meanwhile: the lock file is all that is left
                _let_go(ScratchPaths.lock(root), fd)
                continue
            yield DeadRun(root, fd)
        _remove_lone_locks(job, prefix)
        with contextlib.suppress(OSError):
            job.rmdir()  # once nothing of it is left


def _remove_lone_locks(job: Path, prefix: str) -> None:
    """Remove the lock files in `job` whose run is gone and whose lock nobody holds."""
    try:
        names = [name for name in os.listdir(job) if name.endswith(".lock")]
    except OSError:
        return
    for name in names:
        run = job / name.removesuffix(".lock")
        if not (_RUN_NAME.match(run.name) and run.name.startswith(prefix)) or os.path.lexists(run):
            continue
        with contextlib.suppress(OSError):
            fd = _take_lock(job / name, 0.0)
            if fd is not None and not os.path.lexists(run):
                _let_go(job / name, fd)
            elif fd is not None:
                _release(fd)


def check_scratch(scratch: Path) -> bool:
    """Whether the scratch root exists; WorkspaceError when it is not the worker's own (`private_dir`)."""
    if not os.path.lexists(scratch):
        return False
    private_dir(scratch)
    return True


def _own_private(path: Path) -> bool:
    """Whether `path` is a directory (not a link) of this account that no one else may write."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _subdirs(directory: Path) -> list[Path]:
    """The real directories in `directory` (no link), sorted; none when it cannot be listed."""
    try:
        with os.scandir(directory) as entries:
            return sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return []
