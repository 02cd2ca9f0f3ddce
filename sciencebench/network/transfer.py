"""Copying files between a trial's containers and the host without following anything a container wrote.

Nothing of a trial container is mounted on the host: every file Pier reads
on the host (logs, rewards, artifacts) arrives through the Engine's archive
API as a tar stream, and `extract` writes it under a directory of the trial:

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

`build_tar` is the other direction: a tar of a host directory or file, read
the same no-follow way, links and special files skipped and named.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import io
import json
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from sciencebench.network.errors import TransferRefused
from sciencebench.worker.pier.layout import TRANSFER_REFUSALS

# What one transfer may carry: 2 GiB of file data (a trial's logs and patch are
# megabytes; a container filling its log directory is stopped here, not the disk).
MAX_TOTAL_BYTES = 2 * 1024**3
MAX_MEMBERS = 100_000
# Refusals kept in a trial's transfer-refusals.json (a container can plant millions of links).
MAX_RECORDED = 1000
DIR_MODE = 0o755
FILE_MODE = 0o644
EXEC_MODE = 0o755
# Trial subdirectories a download may write into (never result.json, config.json, the policy records).
DOWNLOAD_ROOTS = frozenset({"agent", "verifier", "artifacts", "steps"})
_CHUNK = 1024 * 1024
_SPOOL_BYTES = 64 * 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
}


@dataclass(frozen=True)
class Refusal:
    """One member that was not copied, and why."""

    member: str
    reason: str

    def __str__(self) -> str:
        return f"{self.member or '.'}: {self.reason}"


@dataclass
class Transfer:
    """What one copy did: counts, bytes, and every refused member."""

    files: int = 0
    directories: int = 0
    bytes: int = 0
    refusals: list[Refusal] = field(default_factory=list)

    def refuse(self, member: str, reason: str) -> None:
        """Name one member that was not copied."""
        self.refusals.append(Refusal(member[:300], reason[:300]))


class ChunkReader(io.RawIOBase):
    """A read-only stream over an iterator of byte chunks (the Engine's archive response)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        """Always readable."""
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        """Fill `buffer` from the next chunks; 0 at the end."""
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


# --- host paths, opened without following links ---


def trial_relative(
    trial_dir: Path, target: Path, *, roots: frozenset[str] | None = DOWNLOAD_ROOTS
) -> list[str]:
    """The components of `target` below `trial_dir`, compared lexically (no link on the way is resolved).

    Raises TransferRefused for a target outside the trial directory, the
    trial directory itself, a `..` component, or (with `roots`) a first
    component that is not one of them.
    """
    target_text = os.path.abspath(target)
    for base in dict.fromkeys((os.path.abspath(trial_dir), os.path.realpath(trial_dir))):
        relative = os.path.relpath(target_text, base)
        parts = [] if relative == "." else relative.split(os.sep)
        if parts and parts[0] != "..":
            break
    else:
        raise TransferRefused([Refusal(str(target), "outside the trial directory")])
    if ".." in parts or (roots is not None and parts[0] not in roots):
        raise TransferRefused([Refusal(str(target), "not a directory a trial's downloads may write")])
    return parts


def open_dir(parent_fd: int, parts: Sequence[str], *, create: bool = True) -> int:
    """An fd of `parent_fd/parts...`, each component opened with O_NOFOLLOW (created 0755 when missing).

    Raises OSError: ELOOP or ENOTDIR where a component is a link or not a directory.
    """
    fd = os.dup(parent_fd)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, DIR_MODE, dir_fd=fd)
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_trial_dir(trial_dir: Path) -> int:
    """An fd of the trial directory itself (created by the worker and Pier on the host: trusted)."""
    return os.open(trial_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


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
    """Creates members below one destination directory fd, caching the directory fds it opened."""

    def __init__(self, dest_fd: int, result: Transfer) -> None:
        self._dirs: dict[tuple[str, ...], int] = {(): dest_fd}
        self._owned: list[int] = []
        self.result = result

    def close(self) -> None:
        for fd in self._owned:
            os.close(fd)
        self._owned.clear()

    def directory(self, parts: Sequence[str]) -> int:
        key = tuple(parts)
        if key not in self._dirs:
            parent = self.directory(key[:-1])
            fd = open_dir(parent, key[-1:])
            self._owned.append(fd)
            self._dirs[key] = fd
            os.fchmod(fd, DIR_MODE)
            self.result.directories += 1
        return self._dirs[key]

    def file(self, parts: Sequence[str], name: str, member: tarfile.TarInfo, data: IO[bytes] | None) -> None:
        parent = self.directory(parts)
        fd = os.open(name, _NEW_FILE_FLAGS, FILE_MODE, dir_fd=parent)
        try:
            info = os.fstat(fd)
            # Checked before truncating: an existing file shared with another path is never written.
            if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
                raise OSError(errno.EEXIST, "not a regular file with one link")
            os.ftruncate(fd, 0)
            os.set_blocking(fd, True)
            while data is not None and (chunk := data.read(_CHUNK)):
                _write_all(fd, chunk)
            os.fchmod(fd, EXEC_MODE if member.mode & 0o111 else FILE_MODE)
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)
        self.result.files += 1
        self.result.bytes += member.size


def _write_all(fd: int, chunk: bytes) -> None:
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view) :]


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
) -> Transfer:
    """Write the regular files and directories of a tar `stream` below `dest_fd` (a directory fd).

    `strip`: the first component every member must have (the basename of
    the directory the Engine archived), left out on the host; its own entry
    must be a directory. Members `exclude` matches are left out silently.
    Returns what was written and what was refused; raises TransferRefused
    when the archived path itself is not a directory, tarfile.TarError for a
    corrupt stream.
    """
    result = Transfer()
    writer = _Writer(dest_fd, result)
    count = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                count += 1
                if count > max_members:
                    result.refuse(member.name, f"more than {max_members} members: extraction stopped")
                    break
                if not _extract_one(archive, member, writer, strip, exclude, max_bytes):
                    break
    finally:
        writer.close()
    return result


def _extract_one(
    archive: tarfile.TarFile,
    member: tarfile.TarInfo,
    writer: _Writer,
    strip: str | None,
    exclude: Sequence[str],
    max_bytes: int,
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
    if exclude and excluded(parts, exclude):
        return True
    reason = _kind(member)
    if reason is not None:
        result.refuse(name, reason)
        return True
    if member.isreg() and result.bytes + member.size > max_bytes:
        result.refuse(name, f"over the {max_bytes} byte bound of one transfer: extraction stopped")
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
    stream: IO[bytes], parent_fd: int, name: str, *, max_bytes: int = MAX_TOTAL_BYTES
) -> Transfer:
    """Write the single regular file of a tar `stream` as `parent_fd/name`.

    Raises TransferRefused when the archive's first member is not a regular
    file (a link, a directory, ...), is over `max_bytes`, or cannot be
    created without following a link.
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
            try:
                writer.file((), name, member, archive.extractfile(member))
            except OSError as exc:
                reason = f"host path refused ({errno.errorcode.get(exc.errno or 0, exc.strerror)})"
                raise TransferRefused([Refusal(name, reason)]) from None
    finally:
        writer.close()
    return result


# --- the other direction: a tar of host files ---


def _dir_info(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = DIR_MODE
    info.uname = info.gname = "root"
    return info


def directory_headers(parts: Sequence[str]) -> list[tarfile.TarInfo]:
    """Directory entries for `a`, `a/b`, ... (the target directories the container lacks)."""
    return [_dir_info("/".join(parts[: i + 1])) for i in range(len(parts))]


class _TarBuilder:
    def __init__(self, archive: tarfile.TarFile, result: Transfer, max_bytes: int) -> None:
        self.archive = archive
        self.result = result
        self.max_bytes = max_bytes

    def add_file(self, dir_fd: int, entry: str, arcname: str) -> None:
        try:
            fd = os.open(entry, _READ_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            self.result.refuse(arcname, f"not read ({errno.errorcode.get(exc.errno or 0, exc.strerror)})")
            return
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self.result.refuse(arcname, "not a regular file (not copied)")
                return
            if self.result.bytes + info.st_size > self.max_bytes:
                bound = f"over the {self.max_bytes} byte bound of one transfer"
                raise TransferRefused([Refusal(arcname, bound)])
            os.set_blocking(fd, True)
            member = tarfile.TarInfo(arcname)
            member.size = info.st_size
            member.mtime = int(info.st_mtime)
            member.mode = EXEC_MODE if info.st_mode & 0o111 else FILE_MODE
            member.uname = member.gname = "root"
            self.archive.addfile(member, handle)
            self.result.files += 1
            self.result.bytes += info.st_size

    def add_tree(self, dir_fd: int, prefix: str) -> None:
        with os.scandir(dir_fd) as entries:
            listing = sorted(entries, key=lambda e: e.name)
        for entry in listing:
            arcname = f"{prefix}{entry.name}"
            if entry.is_symlink():
                self.result.refuse(arcname, "symbolic link (not copied)")
            elif entry.is_dir(follow_symlinks=False):
                try:
                    child = open_dir(dir_fd, [entry.name], create=False)
                except OSError:
                    self.result.refuse(arcname, "directory not opened without following a link")
                    continue
                try:
                    self.archive.addfile(_dir_info(arcname))
                    self.result.directories += 1
                    self.add_tree(child, f"{arcname}/")
                finally:
                    os.close(child)
            elif entry.is_file(follow_symlinks=False):
                self.add_file(dir_fd, entry.name, arcname)
            else:
                self.result.refuse(arcname, "special file (not copied)")


def build_tar(
    source: Path,
    prefix: Sequence[str] = (),
    *,
    file_name: str | None = None,
    max_bytes: int = MAX_TOTAL_BYTES,
) -> tuple[IO[bytes], Transfer]:
    """A tar (a rewound spooled file) of `source`'s contents, or of `source` alone as `file_name`.

    Members are placed below `prefix` (directory entries included for it).
    `source` itself is opened with O_NOFOLLOW (its parents are the host's
    own), every entry below it too; links and special files are skipped and
    named in the refusals; modes are masked, owners root. Raises
    TransferRefused when `source` is a link or of the wrong kind, or the
    data is over `max_bytes`.
    """
    spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115
    result = Transfer()
    try:
        with tarfile.open(fileobj=spool, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for header in directory_headers(prefix):
                archive.addfile(header)
            builder = _TarBuilder(archive, result, max_bytes)
            base = "".join(f"{p}/" for p in prefix)
            parent = os.open(source.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                if file_name is not None:
                    if source.is_symlink() or not source.is_file():
                        raise TransferRefused([Refusal(str(source), "not a regular file (not copied)")])
                    builder.add_file(parent, source.name, base + file_name)
                    if result.refusals:
                        raise TransferRefused(result.refusals)
                else:
                    try:
                        root = open_dir(parent, [source.name], create=False)
                    except OSError:
                        raise TransferRefused([Refusal(str(source), "not a directory (or a link)")]) from None
                    try:
                        builder.add_tree(root, base)
                    finally:
                        os.close(root)
            finally:
                os.close(parent)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool, result


def describe(refusals: Iterable[Refusal], limit: int = 10) -> str:
    """`a: why; b: why` for the first `limit` refusals, with a count of the rest."""
    items = list(refusals)
    text = "; ".join(str(r) for r in items[:limit])
    return text + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def posix_parts(path: str) -> list[str]:
    """The components of an absolute container path (`/logs/agent` -> ['logs', 'agent'])."""
    return [p for p in PurePosixPath(path).parts if p not in ("/", "")]


def _read_refusals(dir_fd: int) -> list[dict[str, str]]:
    try:
        fd = os.open(TRANSFER_REFUSALS, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        try:
            data = json.loads(handle.read(_SPOOL_BYTES) or b"{}")
        except ValueError:
            return []
    entries = data.get("refusals") if isinstance(data, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def record_refusals(
    trial_dir: Path, direction: str, source: str, target: str, refusals: Sequence[Refusal]
) -> None:
    """Add `refusals` to the trial's `transfer-refusals.json` (written without following a link).

    The worker reads this file (`worker.pier.layout.read_transfer_refusals`)
    into the trial's record. Raises OSError when the trial directory is gone.
    """
    if not refusals:
        return
    dir_fd = open_trial_dir(trial_dir)
    try:
        entries = _read_refusals(dir_fd)
        entries += [
            {"direction": direction, "source": source, "target": target, "item": r.member, "reason": r.reason}
            for r in refusals
        ]
        body = json.dumps({"refusals": entries[:MAX_RECORDED]}, indent=2).encode() + b"\n"
        fd = os.open(TRANSFER_REFUSALS, _NEW_FILE_FLAGS, FILE_MODE, dir_fd=dir_fd)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
                raise OSError(errno.EEXIST, f"{TRANSFER_REFUSALS} is not a regular file")
            os.ftruncate(fd, 0)
            os.set_blocking(fd, True)
            _write_all(fd, body)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
