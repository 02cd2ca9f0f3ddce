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
from pathlib import Path

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


def read_regular(path: Path) -> bytes:
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
    digest = hashlib.sha256()
    for name in DEFINING_FILES:
        digest.update(name.encode())
        digest.update(read_regular(task_dir / name))
    for path in compose_paths(task_dir):
        data = read_regular(path)
        # Length-framed: a compose file's bytes cannot pose as another file's name.
        digest.update(f"\0{path.relative_to(task_dir)}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()
