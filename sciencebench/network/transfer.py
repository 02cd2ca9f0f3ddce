"""Copying files between a trial's containers and the host without following anything a container wrote.

Nothing of a trial container is mounted on the host: every file Pier reads
on the host (logs, rewards, artifacts) arrives through the Engine's archive
API as a tar stream and is written under a directory of the trial by
`network.extract`; `network.tarbuild` is the other direction (a tar of host
files for a container); `network.refusals` records what either refused in
the trial's `transfer-refusals.json`. Here is what they share: the bounds of
a transfer and of a trial (`Budget`), modes, what a copy did (`Transfer`,
`Refusal`), host paths opened one component at a time, following no link.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from sciencebench.core.errors import TransferRefused

# What one transfer may carry: 2 GiB of file data (a trial's logs and patch are
# megabytes; a container filling its log directory is stopped here, not the disk).
MAX_TOTAL_BYTES = 2 * 1024**3
MAX_MEMBERS = 100_000
# Directories deep below the directory one transfer writes (the snapshot's bound is 32; a trial's
# outputs may hold a repository's tree). Deeper is refused and extraction stops: a container's tree
# 1,000 levels deep would otherwise outrun every walk of the trial's files on the host.
MAX_DEPTH = 64
# What all of one trial's transfers to the host carry together: the scratch holds them until the
# trial ends, and a container's files may be asked for again and again (each step, the verifier).
MAX_TRIAL_BYTES = 4 * 1024**3
MAX_TRIAL_MEMBERS = 200_000
# Refusals kept in a trial's transfer-refusals.json (a container can plant millions of links).
MAX_RECORDED = 1000
DIR_MODE = 0o755
FILE_MODE = 0o644
EXEC_MODE = 0o755
# Trial subdirectories a download may write into (never result.json, config.json, the policy records).
DOWNLOAD_ROOTS = frozenset({"agent", "verifier", "artifacts", "steps"})
# Bytes a spooled tar keeps in memory (and the most of a refusals file read back).
SPOOL_BYTES = 64 * 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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


@dataclass
class Budget:
    """What a trial's transfers to the host carried so far, against the bounds of all of them together."""

    max_bytes: int = MAX_TRIAL_BYTES
    max_members: int = MAX_TRIAL_MEMBERS
    bytes: int = 0
    members: int = 0


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


def posix_parts(path: str) -> list[str]:
    """The components of an absolute container path (`/logs/agent` -> ['logs', 'agent'])."""
    return [p for p in PurePosixPath(path).parts if p not in ("/", "")]


def write_all(fd: int, chunk: bytes) -> None:
    """Write all of `chunk` to `fd` (a blocking fd)."""
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view) :]
