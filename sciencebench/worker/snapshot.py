"""The worker's own copy of a task directory, taken once per try before anything is checked.

The selection belongs to the submitter, who may change it at any moment:
between the worker's checks and Pier's `docker compose up`, during an image
build, while Pier copies `environment/` into an agent build context. So the
worker copies the task into the try's scratch directory first
(`<scratch>/task/task_NNN`, the name Pier derives the task's name from),
and every check and Pier itself (`--path`) use that copy; nothing of the
selection is read again. How it copies: `snapshot_task`; its bounds: `SnapshotLimits`.
Every entry is opened with the rights of the job's owner (`worker.ownerread`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sciencebench.core.errors import RefusedError, TrialError, WorkspaceError
from sciencebench.core.taskdir import COMPOSE_FILES, DEFINING_FILES, definition_sha256
from sciencebench.worker.ownerread import Access, opener_for

# Files and directories in one task (the real tasks: about ten).
MAX_ENTRIES = 10_000
# Bytes of all files together (the real tasks: tens of kilobytes; a build context may be more).
MAX_BYTES = 256 * 2**20
# Directories deep (the real tasks: two; Pier's own layout: steps/<name>/tests/...).
MAX_DEPTH = 32

_CHUNK = 2**20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class SnapshotLimits:
    """How much of a task directory a snapshot copies before refusing it.

    `MAX_ENTRIES` files and directories, `MAX_BYTES` in all, `MAX_DEPTH`
    directories deep. A real task holds about ten files and tens of kilobytes;
    `environment/` may hold an image's build context, so the byte bound leaves
    room for one.
    """

    max_entries: int = MAX_ENTRIES
    max_bytes: int = MAX_BYTES
    max_depth: int = MAX_DEPTH


def _hashed(relative: str) -> bool:
    """Whether the task hash covers this file: a defining file or a compose file Pier may use."""
    if relative in DEFINING_FILES or relative in COMPOSE_FILES:
        return True
    parts = relative.split("/")
    return len(parts) == 4 and parts[0] == "steps" and parts[2:] == ["tests", "docker-compose.yaml"]


def _is_link(dir_fd: int | None, path: str | Path) -> bool:
    """Whether `path` (relative to `dir_fd`) is a symlink now: only to name a refusal, never to decide one."""
    try:
        return stat.S_ISLNK(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


@dataclass
class _Copy:
    source: Path
    limits: SnapshotLimits
    before_open: Callable[[str], None] | None
    owner_uid: int
    access: Access
    entries: int = 0
    total: int = 0
    kept: dict[str, bytes] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.source.name

    def symlink(self, relative: str) -> RefusedError:
        return RefusedError(f"{self.name}: {relative} is a symlink; a task's files must be inside it")

    def changed(self, relative: str) -> WorkspaceError:
        return WorkspaceError(f"{self.source}: {relative} changed while the worker copied it; try again")

    def opened(self, fd: int, relative: str) -> int:
        """`fd`, when the owner may have it (a worker that cannot open as the owner keeps only its own)."""
        if self.access.as_owner:
            return fd
        found = os.fstat(fd).st_uid
        if found == self.owner_uid:
            return fd
        os.close(fd)
        what = f"{self.name}: {relative}" if relative else self.name
        raise RefusedError(
            f"{what} belongs to another account (uid {found}) than the job's owner "
            f"(uid {self.owner_uid}); a worker not running as root copies only the owner's own files"
        )

    def not_owners(self, relative: str, exc: OSError) -> TrialError:
        """The error of a failed open: a refusal when the owner may not read the entry."""
        what = f"{self.name}: {relative}" if relative else self.name
        if self.access.as_owner and exc.errno in (errno.EACCES, errno.EPERM):
            return RefusedError(
                f"{what}: the job's owner (uid {self.owner_uid}) may not read it; "
                "a job reads only what its submitter may"
            )
        if relative:
            return self.unreadable(relative, exc)
        return WorkspaceError(
            f"{self.source}: unreadable on this worker ({exc.strerror}); "
            "is the selection on the shared filesystem?"
        )

    def unreadable(self, relative: str, exc: OSError) -> WorkspaceError:
        return WorkspaceError(f"{self.source}: {relative}: unreadable on this worker ({exc.strerror})")

    def directory(self, src_fd: int, dst_fd: int, relative: str, depth: int) -> None:
        """Copy the directory open as `src_fd` into the one open as `dst_fd` (both already checked)."""
        found = []
        with os.scandir(src_fd) as listing:
            for entry in listing:  # counted as listed: a huge directory is refused before it is held
                self.entries += 1
                if self.entries > self.limits.max_entries:
                    raise RefusedError(
                        f"{self.name}: more than {self.limits.max_entries} files and directories; "
                        "a task snapshot holds no more"
                    )
                found.append(entry)
        for entry in sorted(found, key=lambda entry: entry.name):
            here = f"{relative}/{entry.name}" if relative else entry.name
            if entry.is_symlink():
                raise self.symlink(here)
            if self.before_open is not None:
                self.before_open(here)
            if entry.is_dir(follow_symlinks=False):
                self.subdirectory(src_fd, dst_fd, entry.name, here, depth + 1)
            elif entry.is_file(follow_symlinks=False):
                self.file(src_fd, dst_fd, entry.name, here)
            else:
                raise RefusedError(f"{self.name}: {here} is not a regular file or directory")

    def open_source(self, src_fd: int, name: str, relative: str, flags: int) -> int:
        try:
            fd = self.access.open(name, flags, src_fd)
        except OSError as exc:
            # A symlink now, where the listing had none (O_DIRECTORY makes a symlink ENOTDIR).
            if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and _is_link(src_fd, name)):
                raise self.symlink(relative) from None
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                raise self.changed(relative) from None
            raise self.not_owners(relative, exc) from None
        return self.opened(fd, relative)

    def subdirectory(self, src_fd: int, dst_fd: int, name: str, relative: str, depth: int) -> None:
        if depth > self.limits.max_depth:
            raise RefusedError(f"{self.name}: {relative} is deeper than {self.limits.max_depth} directories")
        if _hashed(relative):
            raise RefusedError(f"{self.name}: {relative} is not a regular file")
        child = self.open_source(src_fd, name, relative, _DIR_FLAGS)
        try:
            os.mkdir(name, 0o700, dir_fd=dst_fd)
            copy = os.open(name, _DIR_FLAGS, dir_fd=dst_fd)
            try:
                os.fchmod(copy, 0o755)
                self.directory(child, copy, relative, depth)
            finally:
                os.close(copy)
        finally:
            os.close(child)

    def file(self, src_fd: int, dst_fd: int, name: str, relative: str) -> None:
        source = self.open_source(src_fd, name, relative, _FILE_FLAGS)
        try:
            info = os.fstat(source)
            if not stat.S_ISREG(info.st_mode):  # a FIFO, a device or a directory now
                raise self.changed(relative)
            self.over_budget(info.st_size)
            mode = 0o755 if info.st_mode & 0o111 else 0o644
            chunks = self.copy_bytes(source, dst_fd, name, relative, mode)
        finally:
            os.close(source)
        if _hashed(relative):
            self.kept[relative] = b"".join(chunks)

    def copy_bytes(self, source: int, dst_fd: int, name: str, relative: str, mode: int) -> list[bytes]:
        """Read `source` once into a new file `name` of mode `mode`; the chunks, for the hash."""
        chunks: list[bytes] = []
        keep = _hashed(relative)
        target = os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=dst_fd)
        try:
            os.fchmod(target, mode)
            while True:
                try:
                    chunk = os.read(source, _CHUNK)
                except OSError as exc:
                    raise self.unreadable(relative, exc) from None
                if not chunk:
                    return chunks
                self.total += len(chunk)
                self.over_budget(0)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(target, view) :]
                if keep:
                    chunks.append(chunk)
        finally:
            os.close(target)

    def over_budget(self, more: int) -> None:
        if self.total + more > self.limits.max_bytes:
            raise RefusedError(
                f"{self.name}: more than {self.limits.max_bytes} bytes; a task snapshot holds no more"
            )

    def digest(self) -> str:
        """`task_toml_sha256` of what was copied (`core.taskdir.compose_paths` order)."""
        for name in DEFINING_FILES:
            if name not in self.kept:
                raise WorkspaceError(
                    f"{self.source}: {name} is missing or not a regular file on this worker; "
                    "is the selection on the shared filesystem?"
                )
        compose = [relative for relative in COMPOSE_FILES if relative in self.kept]
        steps = [r for r in self.kept if r.startswith("steps/")]
        compose += sorted(steps, key=lambda relative: relative.split("/"))
        return definition_sha256(
            [self.kept[name] for name in DEFINING_FILES], ((r, self.kept[r]) for r in compose)
        )


def snapshot_task(
    src: Path,
    dst: Path,
    limits: SnapshotLimits | None = None,
    *,
    owner_uid: int | None = None,
    before_open: Callable[[str], None] | None = None,
) -> str:
    """Copy the task directory `src` to the new directory `dst`; the task hash of the bytes copied.

    `dst` must not exist (its parents are made). Every entry of `src` is
    opened with the rights of account `owner_uid` (the job's owner; None:
    the worker's own uid). `before_open(relative)` is called before each
    entry is opened (tests change the task there). Raises RefusedError for
    a symlink or special file anywhere, an entry the owner may not read
    (on a worker that is neither root nor the owner: one the owner does
    not own), or a task beyond `limits`; WorkspaceError when `src` or an
    entry cannot be read, a defining file is missing, or an entry changed
    while it was copied. A refused copy may leave a partial `dst` (never a
    link in it).

    The copy follows no link: each entry is opened relative to its directory's
    file descriptor with `O_NOFOLLOW` (`O_NONBLOCK` for files, so a FIFO never
    blocks), its type checked on the descriptor; a symlink or a special file
    anywhere is refused, as the policy refuses it in a task
    (`core.compose_policy`), and an entry whose type changed since the listing
    is refused too. Each file is read exactly once; the task hash
    (`core.taskdir.definition_sha256`) is computed from the bytes copied. A hard
    link is copied as bytes (a fresh file). The copy's modes are the worker's:
    directories 0755, files 0644, or 0755 when executable; no setuid or setgid.
    """
    owner = os.geteuid() if owner_uid is None else owner_uid
    with opener_for(owner) as access:
        copy = _Copy(Path(src), limits or SnapshotLimits(), before_open, owner, access)
        _copy_tree(copy, Path(src), Path(dst))
    return copy.digest()


def _copy_tree(copy: _Copy, src: Path, dst: Path) -> None:
    try:
        root = copy.access.open(src, _DIR_FLAGS, None)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and _is_link(None, src)):
            raise RefusedError(f"{copy.name} is a symlink; a task directory must be a directory") from None
        raise copy.not_owners("", exc) from None
    root = copy.opened(root, "")
    try:
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(dst, 0o700)
        target = os.open(dst, _DIR_FLAGS)
        try:
            os.fchmod(target, 0o755)
            try:
                copy.directory(root, target, "", 0)
            except OSError as exc:  # listing a directory, or writing the copy
                raise WorkspaceError(f"{src}: cannot copy the task on this worker ({exc.strerror})") from None
        finally:
            os.close(target)
    finally:
        os.close(root)
