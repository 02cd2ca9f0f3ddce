"""A task directory as both sides read it: the files that define it, and their hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

# The files whose bytes define what a trial of the task does.
DEFINING_FILES = ("task.toml", "pre_artifacts.sh", "instruction.md")


def task_toml_sha256(task_dir: Path) -> str:
    """Hash of a task's definition, to notice a selection changed after submit.

    Raises OSError when a defining file cannot be read.
    """
    digest = hashlib.sha256()
    for name in DEFINING_FILES:
        digest.update(name.encode())
        digest.update((task_dir / name).read_bytes())
    return digest.hexdigest()
