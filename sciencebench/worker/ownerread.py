"""Opening files with the rights of a job's owner: what the worker reads of a job, its submitter may read.

A worker that runs as root can read every selection; a job must not get a
file its owner (the account owning the job directory, `worker.admission`)
could not open. So the opens are the kernel's own decision for that
account, not a re-implementation of modes: `opener_for(uid)` gives an
`Access` whose `open(path, flags, dir_fd)` opens as `uid` (how, per kind of
worker: its docstring). A hard link is the inode's, so a second name of
someone else's private file does not open either.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sciencebench.core.errors import WorkspaceError
from sciencebench.worker import ownerread_child as child

NO_GROUP = 65534  # the gid of an owner without a passwd entry on this host: no group's rights
ANSWER_TIMEOUT_SEC = 120.0  # one open on a shared filesystem; a hung mount fails the try

Opener = Callable[[str | Path, int, int | None], int]


@dataclass(frozen=True)
class Access:
    """How a worker opens a job owner's files."""

    open: Opener
    as_owner: bool  # the opens are the owner's own; else the worker's: keep only what the owner owns


def owner_groups(uid: int) -> tuple[int, list[int]]:
    """The primary gid and supplementary groups of account `uid` on this host (none when unknown)."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return NO_GROUP, []
    return entry.pw_gid, os.getgrouplist(entry.pw_name, entry.pw_gid)


def _open_directly(path: str | Path, flags: int, dir_fd: int | None) -> int:
    """`os.open` with the worker's own rights."""
    return os.open(path, flags, dir_fd=dir_fd)


@contextlib.contextmanager
def opener_for(uid: int) -> Iterator[Access]:
    """How this worker opens account `uid`'s files.

    - The worker is `uid` itself: `os.open`, its own rights are the owner's.
    - The worker is root: a helper process (`worker.ownerread_child`, started
      with `os.posix_spawn`, so nothing runs between fork and exec in the
      worker, which has threads) takes the owner's supplementary groups (those
      of its passwd entry; an account this host does not know gets none, gid
      65534), gid and uid before it opens anything, and passes each descriptor
      back over a socket pair. The worker reads and copies from those
      descriptors with its own rights; it never reopens a path.
    - Any other worker (an account sharing a group with the submitters,
      docs/deployment.md) cannot take another account's rights. It opens with
      its own (`Access.as_owner` is False), and the caller keeps only what the
      owner owns, compared on the descriptor as `worker.secrets` does. What an
      account owns it may read (it may change the file's mode), so this grants
      no more than the owner's rights; it refuses some files the owner could
      read (another account's, readable by all or by a group).

    When the opens are the owner's (`Access.as_owner`), a file the owner cannot
    open is an `OSError` (`EACCES`) like any other open failure.
    """
    worker_uid = os.geteuid()
    if uid == worker_uid:
        yield Access(_open_directly, as_owner=True)
        return
    if worker_uid != 0:
        yield Access(_open_directly, as_owner=False)
        return
    reader = _Reader(uid)
    try:
        yield Access(reader.open, as_owner=True)
    finally:
        reader.close()


class _Reader:
    """The helper process of one owner and the worker's end of its socket."""

    def __init__(self, uid: int) -> None:
        self.uid = uid
        gid, groups = owner_groups(uid)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            given = theirs.fileno()
            if given == child.SOCKET_FD:  # dup2 onto itself would keep close-on-exec
                given = os.dup(given)
            try:
                argv = [sys.executable, "-I", "-S", child.__file__, str(uid), str(gid), *map(str, groups)]
                self.pid = os.posix_spawn(sys.executable, argv, {}, file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_DUP2, given, child.SOCKET_FD),
                ])  # fmt: skip
            finally:
                if given != theirs.fileno():
                    os.close(given)
        except OSError as exc:
            ours.close()
            raise WorkspaceError(f"cannot start the reader for uid {uid} ({exc.strerror})") from None
        finally:
            theirs.close()
        ours.settimeout(ANSWER_TIMEOUT_SEC)
        self.sock = ours

    def open(self, path: str | Path, flags: int, dir_fd: int | None) -> int:
        """A descriptor of `path` opened by the helper as the owner; OSError with the open's errno."""
        request = child.INT.pack(flags) + os.fsencode(path)
        try:
            socket.send_fds(self.sock, [request], [] if dir_fd is None else [dir_fd])
            message, fds, msg_flags, _ = socket.recv_fds(
                self.sock, child.INT.size, 1, socket.MSG_CMSG_CLOEXEC
            )
        except OSError as exc:  # a timeout, or the helper is gone
            raise WorkspaceError(f"the reader for uid {self.uid} stopped answering ({exc})") from None
        code = child.INT.unpack(message)[0] if len(message) == child.INT.size else -1
        if code != 0 or len(fds) != 1 or msg_flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            for fd in fds:
                os.close(fd)
            if code > 0:
                raise OSError(code, os.strerror(code))
            raise WorkspaceError(f"the reader for uid {self.uid} ended or answered out of turn")
        return fds[0]

    def close(self) -> None:
        self.sock.close()  # the helper's next read is the end
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        # Reaped aside: a helper stuck in an open no signal interrupts (a hung mount) must not hold the trial.
        threading.Thread(target=_reap, args=(self.pid,), name="ownerread-reap", daemon=True).start()


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
