"""Writing a tar stream from a container below a directory of the trial, following nothing it names.

`extract` (a directory) and `extract_file` (one file) write what the
Engine's archive API sends (`network.transfer`'s bounds and host paths):
only regular files and directories, modes masked, within `MAX_TOTAL_BYTES`,
`MAX_MEMBERS`, `MAX_DEPTH` and the trial's `Budget` over all its transfers
(sparse members by apparent size), every host path opened one component at a time with
O_NOFOLLOW; what is skipped is named in the returned refusals (`extract`
gives each rule).
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
import tarfile
from collections.abc import Sequence
from typing import IO

from sciencebench.core.errors import TransferRefused
from sciencebench.network.transfer import (
    DIR_MODE,
    EXEC_MODE,
    FILE_MODE,
    MAX_DEPTH,
    MAX_MEMBERS,
    MAX_TOTAL_BYTES,
    NEW_FILE_FLAGS,
    Budget,
    Refusal,
    Transfer,
    open_dir,
    write_all,
)

_CHUNK = 1024 * 1024
_KINDS = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
}


def _member_parts(name: str) -> list[str] | str:
    """The components of a member name, or why the name is refused."""
    if "\x00" in name:
        return "name holds a NUL byte"
    if name.startswith("/"):
        return "absolute name"
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        return "name with '..'"
    return parts


def excluded(parts: Sequence[str], patterns: Sequence[str]) -> bool:
    """Whether `tar --exclude` with `patterns` leaves out a member (any run of components matches)."""
    return any(
        fnmatch.fnmatchcase("/".join(parts[i : j + 1]), pattern)
        for pattern in patterns
        for i in range(len(parts))
        for j in range(i, len(parts))
    )


class _Writer:
    """Creates members below one destination directory fd, keeping open only the directories of one path.

    A tar lists a directory's members together, so the fds of the last
    member's directories are kept (at most `MAX_DEPTH`), not one per directory.
    """

    def __init__(self, dest_fd: int, result: Transfer) -> None:
        self._dest = dest_fd
        self._path: list[tuple[str, int]] = []  # the open directories below dest_fd: (name, fd)
        self._made: set[tuple[str, ...]] = set()
        self.result = result

    def close(self) -> None:
        for _, fd in self._path:
            os.close(fd)
        self._path.clear()

    def directory(self, parts: Sequence[str]) -> int:
        key = tuple(parts)
        shared = 0
        while shared < min(len(key), len(self._path)) and self._path[shared][0] == key[shared]:
            shared += 1
        for _, fd in self._path[shared:]:
            os.close(fd)
        del self._path[shared:]
        for depth in range(shared, len(key)):
            fd = open_dir(self._path[-1][1] if self._path else self._dest, key[depth : depth + 1])
            self._path.append((key[depth], fd))
            if key[: depth + 1] not in self._made:
                self._made.add(key[: depth + 1])
                os.fchmod(fd, DIR_MODE)
                self.result.directories += 1
        return self._path[-1][1] if self._path else self._dest

    def file(self, parts: Sequence[str], name: str, member: tarfile.TarInfo, data: IO[bytes] | None) -> None:
        parent = self.directory(parts)
        fd = os.open(name, NEW_FILE_FLAGS, FILE_MODE, dir_fd=parent)
        try:
            info = os.fstat(fd)
            # Checked before truncating: an existing file shared with another path is never written.
            if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
                raise OSError(errno.EEXIST, "not a regular file with one link")
            os.ftruncate(fd, 0)
            os.set_blocking(fd, True)
            while data is not None and (chunk := data.read(_CHUNK)):
                write_all(fd, chunk)
            os.fchmod(fd, EXEC_MODE if member.mode & 0o111 else FILE_MODE)
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)
        self.result.files += 1
        self.result.bytes += member.size


def _kind(member: tarfile.TarInfo) -> str | None:
    """Why a member's type is refused, or None for a regular file or a directory."""
    if member.isreg() or member.isdir():
        return None
    kind = _KINDS.get(member.type, f"member of type {member.type!r}")
    if member.issym() or member.islnk():
        kind += f" to {member.linkname[:200]!r}"
    return kind + " (not created on the host)"


def extract(
    stream: IO[bytes],
    dest_fd: int,
    *,
    strip: str | None = None,
    exclude: Sequence[str] = (),
    max_bytes: int = MAX_TOTAL_BYTES,
    max_members: int = MAX_MEMBERS,
    max_depth: int = MAX_DEPTH,
    budget: Budget | None = None,
) -> Transfer:
    """Write the regular files and directories of a tar `stream` below `dest_fd` (a directory fd).

    `strip`: the first component every member must have (the basename of
    the directory the Engine archived), left out on the host; its own entry
    must be a directory. Members `exclude` matches are left out silently.
    `budget`: the trial's, charged with what this transfer carried.
    Returns what was written and what was refused; raises TransferRefused
    when the archived path itself is not a directory, tarfile.TarError for a
    corrupt stream.

    - only regular files and directories are created; a symbolic link, hard
      link, device, FIFO or any other member is skipped and named in the
      returned refusals, and so is an absolute name or one with `..`;
    - modes are masked: directories 0755, files 0644 (0755 when any execute bit
      is set), never setuid, setgid or sticky; owners are the host user's;
    - at most `MAX_TOTAL_BYTES` of file data and `MAX_MEMBERS` members: what
      exceeds a bound is refused and extraction stops there;
    - every host path is opened one component at a time relative to a directory
      fd with O_NOFOLLOW (O_DIRECTORY for directories, O_CREAT and O_NONBLOCK
      for files, truncated only once fstat shows a regular file with one link),
      so a link on the host side is never followed either: the kernel answers
      ELOOP or ENOTDIR and the member is refused.
    """
    result = Transfer()
    writer = _Writer(dest_fd, result)
    budget = budget if budget is not None else Budget(max_bytes, max_members)
    count = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                count += 1
                if count > max_members:
                    result.refuse(member.name, f"more than {max_members} members: extraction stopped")
                    break
                if budget.members + count > budget.max_members:
                    bound = f"more than the trial's {budget.max_members} members over all its transfers"
                    result.refuse(member.name, f"{bound}: extraction stopped")
                    break
                if not _extract_one(archive, member, writer, strip, exclude, max_bytes, max_depth, budget):
                    break
    finally:
        writer.close()
        budget.members += count
        budget.bytes += result.bytes
    return result


def _extract_one(
    archive: tarfile.TarFile,
    member: tarfile.TarInfo,
    writer: _Writer,
    strip: str | None,
    exclude: Sequence[str],
    max_bytes: int,
    max_depth: int,
    budget: Budget,
) -> bool:
    """Extract one member (or refuse it); False when extraction must stop."""
    result = writer.result
    parts = _member_parts(member.name)
    if isinstance(parts, str):
        result.refuse(member.name, parts)
        return True
    if strip is not None:
        if not parts or parts[0] != strip:
            result.refuse(member.name, "outside the archived directory")
            return True
        parts = parts[1:]
        if not parts:
            if not member.isdir():
                raise TransferRefused([Refusal(strip, _kind(member) or "not a directory")])
            return True
    elif not parts:
        result.refuse(member.name, "empty name")
        return True
    name = "/".join(parts)
    # Depth first: the task's exclude patterns cost time that grows with a member's depth.
    if len(parts) - (0 if member.isdir() else 1) > max_depth:
        result.refuse(name, f"deeper than {max_depth} directories: extraction stopped")
        return False
    if exclude and excluded(parts, exclude):
        return True
    reason = _kind(member)
    if reason is not None:
        result.refuse(name, reason)
        return True
    if member.isreg() and result.bytes + member.size > max_bytes:
        result.refuse(name, f"over the {max_bytes} byte bound of one transfer: extraction stopped")
        return False
    if member.isreg() and budget.bytes + result.bytes + member.size > budget.max_bytes:
        bound = f"over the trial's {budget.max_bytes} byte bound over all its transfers"
        result.refuse(name, f"{bound}: extraction stopped")
        return False
    try:
        if member.isdir():
            writer.directory(parts)
        else:
            writer.file(parts[:-1], parts[-1], member, archive.extractfile(member))
    except OSError as exc:
        result.refuse(name, f"host path refused ({errno.errorcode.get(exc.errno or 0, exc.strerror)})")
    return True


def extract_file(
    stream: IO[bytes],
    parent_fd: int,
    name: str,
    *,
    max_bytes: int = MAX_TOTAL_BYTES,
    budget: Budget | None = None,
) -> Transfer:
    """Write the single regular file of a tar `stream` as `parent_fd/name`.

    Raises TransferRefused when the archive's first member is not a regular
    file (a link, a directory, ...), is over `max_bytes` or what is left of
    the trial's `budget`, or cannot be created without following a link.
    """
    result = Transfer()
    writer = _Writer(parent_fd, result)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            member = archive.next()
            if member is None:
                raise TransferRefused([Refusal(name, "empty archive")])
            if not member.isreg():
                raise TransferRefused([Refusal(name, _kind(member) or "a directory, not a file")])
            if member.size > max_bytes:
                raise TransferRefused([Refusal(name, f"over the {max_bytes} byte bound of one transfer")])
            if budget is not None and budget.bytes + member.size > budget.max_bytes:
                bound = f"over the trial's {budget.max_bytes} byte bound over all its transfers"
                raise TransferRefused([Refusal(name, bound)])
            try:
                writer.file((), name, member, archive.extractfile(member))
            except OSError as exc:
                reason = f"host path refused ({errno.errorcode.get(exc.errno or 0, exc.strerror)})"
                raise TransferRefused([Refusal(name, reason)]) from None
    finally:
        writer.close()
        if budget is not None:
            budget.members += 1
            budget.bytes += result.bytes
    return result
