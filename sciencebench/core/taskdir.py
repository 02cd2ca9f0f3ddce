"""A task directory as both sides read it: the files that define it, and their hash.

    task_002/
    ├── task.toml, instruction.md, pre_artifacts.sh    DEFINING_FILES (always present)
    ├── environment/docker-compose.yaml                 compose files Pier may use (optional):
    ├── tests/docker-compose.yaml                       the agent's, the separate verifier's,
    └── steps/<name>/tests/docker-compose.yaml          and a step's verifier's

The environment and tests directories are the compose project directories
Pier runs `docker compose` in (`--project-directory`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sciencebench.core.errors import SciencebenchError

# The files whose bytes define what a trial of the task does.
DEFINING_FILES = ("task.toml", "pre_artifacts.sh", "instruction.md")
# The compose files Pier reads from a task directory, relative to it (steps add their own).
COMPOSE_FILES = ("environment/docker-compose.yaml", "tests/docker-compose.yaml")
_STEP_COMPOSE_GLOB = "steps/*/tests/docker-compose.yaml"


def compose_paths(task_dir: Path) -> list[Path]:
    """Every compose file of the task that exists (or is a dangling symlink), in a fixed order."""
    candidates = [task_dir / relative for relative in COMPOSE_FILES]
    candidates += sorted(task_dir.glob(_STEP_COMPOSE_GLOB))
    return [path for path in candidates if os.path.lexists(path)]


def read_regular(path: str | Path) -> bytes:
    """The bytes of a regular file, never following a symlink and never blocking on a FIFO.

    Raises OSError: FileNotFoundError when missing, ELOOP for a symlink,
    EINVAL ("not a regular file") for a FIFO, device, socket or directory.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symlink", str(path)) from None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return handle.read()


def task_toml_sha256(task_dir: Path) -> str:
    """Hash of a task's definition (its defining files and compose files), to notice a change after submit.

    A task without compose files hashes as it always did. Raises OSError when
    a file cannot be read, is a symlink or is not a regular file.
    """
    defining = [read_regular(task_dir / name) for name in DEFINING_FILES]
    compose = ((str(path.relative_to(task_dir)), read_regular(path)) for path in compose_paths(task_dir))
    return definition_sha256(defining, compose)


def definition_sha256(defining: list[bytes], compose: Iterable[tuple[str, bytes]]) -> str:
    """`task_toml_sha256` of bytes already read.

    `defining`: the bytes of DEFINING_FILES, in order; `compose`: (relative
    path, bytes) of each compose file, in `compose_paths` order.
    """
    digest = hashlib.sha256()
    for name, data in zip(DEFINING_FILES, defining, strict=True):
        digest.update(name.encode())
        digest.update(data)
    for relative, data in compose:
        # Length-framed: a compose file's bytes cannot pose as another file's name.
        digest.update(f"\0{relative}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


# --- one pass over a task directory ------------------------------------------------------

# The compose project directories at the top of a task (a step's tests directory is one too).
PROJECT_DIRS = ("environment", "tests")
_WATCHED = frozenset({"Dockerfile", "docker-compose.yaml", "test.sh", ".env"})


class _Unusual(SciencebenchError):
    """Something a scan does not decide by itself: the per-path checks must look."""


@dataclass(frozen=True)
class TaskScan:
    """A task directory read in one pass: what the checks and the hash need to know of it.

    Made by `scan_task_dir` only for an ordinary task directory: every top-level
    entry a regular file or a real directory, the defining files regular and
    readable, no symlink among the entries the checks consult (the compose
    project directories, their compose, `.env`, Dockerfile and test.sh
    entries, the steps). For such a directory every answer here is the one the
    per-path checks (`compose_paths`, `read_regular`, `Path.is_file`, the
    policy's entry checks) would give; anything else gets no scan, and those
    checks run as they always did.
    """

    defining: tuple[bytes, ...]  # DEFINING_FILES' bytes, in order
    files: frozenset[str]  # relative paths, among the watched ones, that are regular files
    dotenv: tuple[str, ...]  # compose project directories (relative) holding a `.env`, in check order
    # Each compose file (`compose_paths` order): relative path, and its bytes or
    # why `read_regular` refused it (a symlink, not a regular file).
    compose: tuple[tuple[str, bytes | OSError], ...]


def _entries(path: str) -> dict[str, os.DirEntry[str]]:
    with os.scandir(path) as listing:
        return {entry.name: entry for entry in listing}


def _kind(entry: os.DirEntry[str] | None) -> str:
    """`dir`, `file` or the empty string (absent); `_Unusual` for a symlink or a special file."""
    if entry is None:
        return ""
    if entry.is_symlink():
        raise _Unusual(entry.path)
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    if entry.is_file(follow_symlinks=False):
        return "file"
    raise _Unusual(entry.path)


@dataclass
class _Found:
    files: list[str] = field(default_factory=list)
    dotenv: list[str] = field(default_factory=list)
    compose: list[tuple[str, bytes | OSError]] = field(default_factory=list)

    def project(self, root: str, relative: str) -> None:
        """Note what the compose project directory `relative` (a real directory) holds."""
        entries = _entries(f"{root}/{relative}")
        for name in sorted(_WATCHED & entries.keys()):
            if _kind(entries[name]) == "file":
                self.files.append(f"{relative}/{name}")
        if ".env" in entries:
            self.dotenv.append(relative)
        if "docker-compose.yaml" in entries:
            try:
                data: bytes | OSError = read_regular(f"{root}/{relative}/docker-compose.yaml")
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.EINVAL):
                    raise
                data = exc
            self.compose.append((f"{relative}/docker-compose.yaml", data))


def scan_task_dir(task_dir: Path) -> TaskScan | None:
    """One `os.scandir` per directory of the task the checks look into; None when the directory is unusual.

    None (the task directory a symlink, a symlink or special file where the
    checks look, a defining file missing or not regular, anything unreadable)
    means: use the per-path checks, which then say what is wrong.
    """
    root = os.fspath(task_dir)
    found = _Found()
    try:
        if os.path.islink(root):
            return None
        kinds = {name: _kind(entry) for name, entry in _entries(root).items()}
        if any(kinds.get(name) != "file" for name in DEFINING_FILES):
            return None
        defining = tuple(read_regular(f"{root}/{name}") for name in DEFINING_FILES)
        for relative in PROJECT_DIRS:
            if kinds.get(relative) == "dir":
                found.project(root, relative)
        if kinds.get("steps") == "dir":
            # `compose_paths`' glob steps/*/tests/docker-compose.yaml, in its (sorted) order.
            for step, entry in sorted(_entries(f"{root}/steps").items()):
                if _kind(entry) == "dir" and _kind(_entries(entry.path).get("tests")) == "dir":
                    found.project(root, f"steps/{step}/tests")
    except (OSError, _Unusual):
        return None
    return TaskScan(
        defining=defining,
        files=frozenset(found.files),
        dotenv=tuple(found.dotenv),
        compose=tuple(found.compose),
    )


def scanned_sha256(scan: TaskScan) -> str:
    """`task_toml_sha256` of a scanned task, from the bytes the scan read. Raises OSError as it does."""
    compose = []
    for relative, data in scan.compose:
        if isinstance(data, OSError):
            raise data
        compose.append((relative, data))
    return definition_sha256(list(scan.defining), compose)
