"""A tar of a host directory or file for a container, read without following a link.

`build_tar` reads every entry the same no-follow way `network.extract`
writes them: links and special files are skipped and named, modes are
masked, owners root, at most `MAX_TOTAL_BYTES` of file data; a directory
deeper than `MAX_DEPTH` is skipped and named.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from sciencebench.core.errors import TransferRefused
from sciencebench.network.transfer import (
    DIR_MODE,
    EXEC_MODE,
    FILE_MODE,
    MAX_DEPTH,
    MAX_TOTAL_BYTES,
    READ_FLAGS,
    SPOOL_BYTES,
    Refusal,
    Transfer,
    open_dir,
)


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
            fd = os.open(entry, READ_FLAGS, dir_fd=dir_fd)
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

    def add_tree(self, dir_fd: int, prefix: str, depth: int = 0) -> None:
        with os.scandir(dir_fd) as entries:
            listing = sorted(entries, key=lambda e: e.name)
        for entry in listing:
            arcname = f"{prefix}{entry.name}"
            if entry.is_symlink():
                self.result.refuse(arcname, "symbolic link (not copied)")
            elif entry.is_dir(follow_symlinks=False):
                if depth >= MAX_DEPTH:
                    self.result.refuse(arcname, f"deeper than {MAX_DEPTH} directories (not copied)")
                    continue
                try:
                    child = open_dir(dir_fd, [entry.name], create=False)
                except OSError:
                    self.result.refuse(arcname, "directory not opened without following a link")
                    continue
                try:
                    self.archive.addfile(_dir_info(arcname))
                    self.result.directories += 1
                    self.add_tree(child, f"{arcname}/", depth + 1)
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
    spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115
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
