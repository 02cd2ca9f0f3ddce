"""Host-local state of a worker host: flocks under its state directory.

The state directory (`SCIENCEBENCH_STATE_DIR`, default /var/tmp/sciencebench)
is on a local filesystem of the host, shared by every worker process of the
host. Its locks are flocks the kernel drops when their holder dies:
exclusive host locks (`host_lock`, e.g. one pull per image digest) and
shared live-trial locks (`hold_live_trial`), which a leftover sweep
respects. These are not the store's trial leases: those say which host
runs a trial; these say which trials run on this host.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from sciencebench.core.errors import PullError, WorkspaceError
from sciencebench.core.settings import STATE_DIR_ENV, state_dir_from_env
from sciencebench.dockerhost.naming import compose_project_name

LIVE_DIR = "live"


def state_dir() -> Path:
    """The host-local state directory: `$SCIENCEBENCH_STATE_DIR` or /var/tmp/sciencebench.

    It must be on a local filesystem of the worker host (pull locks, the pull
    log and live-trial locks live there), shared by all worker processes of the host.
    """
    return state_dir_from_env()


def owner_id(state: Path | None = None) -> str:
    """This host state's id for container labels: host name and state directory, hashed."""
    where = f"{os.uname().nodename}:{(state or state_dir()).resolve()}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def open_state_file(path: Path, flags: int) -> int:
    """Open a file of the host state dir; WorkspaceError (one line) when that is impossible.

    Never through a symlink at the file itself (`O_NOFOLLOW`): a file of the
    state dir is the host's own, and one that a symlink replaced is refused.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        raise WorkspaceError(
            f"host state dir {path.parent} is unusable ({exc.strerror or exc.__class__.__name__}): "
            f"set {STATE_DIR_ENV} to a writable host-local directory"
        ) from None


@contextlib.contextmanager
def host_lock(path: Path, timeout_sec: float, what: str) -> Iterator[float]:
    """Hold an exclusive flock on `path`; yields the seconds spent waiting.

    flock locks belong to the open file description, so two threads of one
    process exclude each other as two processes do (each opens its own fd).
    The kernel drops the lock when its holder dies.
    """
    started = time.monotonic()
    fd = open_state_file(path, os.O_RDWR | os.O_CREAT)
    try:
        # Poll (a blocking flock could not time out): the cap keeps the hand-over
        # from a finished pull to the next waiter short, and costs ~20 syscalls/s.
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if time.monotonic() - started > timeout_sec:
                raise PullError(
                    f"waited {timeout_sec:.0f}s for another process on this host to finish {what}; giving up"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        yield time.monotonic() - started
    finally:
        os.close(fd)  # releases the lock


def _live_path(state: Path, key: str) -> Path:
    return state / LIVE_DIR / f"{compose_project_name(key)}.lock"


@contextlib.contextmanager
def hold_live_trial(key: str, state: Path | None = None) -> Iterator[None]:
    """Mark the trials whose projects start with `key` as live on this host.

    `key` is a trial name, or — before Pier has named the trial — the
    `pier_trial_prefix` of its task directory (which also covers other
    attempts of that task on this host; a sweep then merely waits). Hold it
    around the Pier run: `sweep_leftovers` in any process of the host leaves
    those projects alone. The lock is a shared flock, so it ends when the
    block ends or its holder dies, and never outlives a crashed worker.

    Raises WorkspaceError when the host state dir cannot be written.
    """
    fd = open_state_file(_live_path(state or state_dir(), key), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def live_trial_locks(state: Path | None = None) -> set[str]:
    """Keys (compose-normalized) of the live-trial locks some live process of this host holds."""
    directory = (state or state_dir()) / LIVE_DIR
    try:
        paths = sorted(directory.glob("*.lock"))
    except OSError:
        return set()
    held: set[str] = set()
    for path in paths:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            held.add(path.name.removesuffix(".lock"))
        finally:
            os.close(fd)
    return held


def live_trial_held(project: str, state: Path | None = None) -> bool:
    """Whether a live process on this host holds a live-trial lock covering `project`."""
    return any(project.startswith(key) for key in live_trial_locks(state))
