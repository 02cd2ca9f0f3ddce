"""A task directory read in one pass (`core.taskdir.scan_task_dir`) validates as path-by-path reading does.

`load_task` reads an ordinary task directory in one pass and hashes the bytes
it read; every case here is loaded both ways (the scan turned off for the
second) and must give the same TaskSpec or the same error, and the hash must
be the one the worker computes from the files (`task_toml_sha256`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sciencebench.core.errors import TaskSpecError
from sciencebench.core.taskdir import scan_task_dir, task_toml_sha256
from sciencebench.login import taskspec
from sciencebench.login.taskspec import TaskSpec, load_task
from tests.fixtures.selection import DEFAULT_AGENT_IMAGE, make_task

pytestmark = pytest.mark.unit

COMPOSE = f"services:\n  main:\n    image: {DEFAULT_AGENT_IMAGE}\n    environment:\n      FOO: ${{BAR}}\n"


def _write(task: Path, relative: str, text: str | bytes = COMPOSE) -> None:
    path = task / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")


def _symlink(task: Path, relative: str, target: str) -> None:
    (task / relative).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, task / relative)


def _compose_only(task: Path) -> None:
    (task / "environment" / "Dockerfile").unlink()
    _write(task, "environment/docker-compose.yaml")


def _steps(task: Path) -> None:
    # Sorted as compose_paths sorts them: by step name ("a" before "a-b"; "/" sorts after "-").
    for step in ("b", "a-b", "a", ".hidden"):
        _write(task, f"steps/{step}/tests/docker-compose.yaml", COMPOSE.replace("BAR", f"V_{len(step)}"))
    _write(task, "steps/file-not-dir", "x")
    _write(task, "steps/c/tests", "a file, not a directory")
    (task / "steps" / "d").mkdir()


def _toml(task: Path, change: Callable[[str], str]) -> None:
    path = task / "task.toml"
    path.write_bytes(change(path.read_text(encoding="utf-8")).encode())


def _replace(task: Path, relative: str, make: Callable[[Path], object]) -> None:
    """`relative` removed and made again by `make` (e.g. a directory instead of a file)."""
    (task / relative).unlink()
    make(task / relative)


CASES: dict[str, Callable[[Path], None]] = {
    "plain": lambda task: None,
    "compose in environment": lambda task: _write(task, "environment/docker-compose.yaml"),
    "compose instead of the Dockerfile": _compose_only,
    "compose in tests": lambda task: _write(task, "tests/docker-compose.yaml"),
    "steps": _steps,
    "steps is a file": lambda task: _write(task, "steps", "x"),
    ".env in environment": lambda task: _write(task, "environment/.env", "A=1"),
    ".env directory in tests": lambda task: (task / "tests" / ".env").mkdir(),
    ".env in a step": lambda task: (_steps(task), _write(task, "steps/a/tests/.env", "A=1")),
    "compose not UTF-8": lambda task: _write(task, "tests/docker-compose.yaml", b"\xff\xfe"),
    "compose not YAML": lambda task: _write(task, "tests/docker-compose.yaml", "a: [b"),
    "compose refused": lambda task: _write(task, "tests/docker-compose.yaml", f"{COMPOSE}    ipc: host\n"),
    "compose a directory": lambda task: (task / "tests" / "docker-compose.yaml").mkdir(),
    "compose a FIFO": lambda task: os.mkfifo(task / "environment" / "docker-compose.yaml"),
    "compose a symlink": lambda task: _symlink(task, "tests/docker-compose.yaml", "../pre_artifacts.sh"),
    "compose a dangling symlink": lambda task: _symlink(task, "tests/docker-compose.yaml", "nowhere"),
    "step a symlink": lambda task: (_steps(task), _symlink(task, "steps/e", "a")),
    "step tests a symlink": lambda task: _symlink(task, "steps/x/tests", "../../tests"),
    "instruction a symlink": lambda task: (
        (task / "instruction.md").rename(task / "i.md"),
        _symlink(task, "instruction.md", "i.md"),
    ),
    "task.toml a symlink": lambda task: (
        (task / "task.toml").rename(task / "t.toml"),
        _symlink(task, "task.toml", "t.toml"),
    ),
    "environment a symlink": lambda task: (
        (task / "environment").rename(task / "env"),
        _symlink(task, "environment", "env"),
    ),
    "Dockerfile a symlink": lambda task: (
        (task / "environment" / "Dockerfile").rename(task / "environment" / "D"),
        _symlink(task, "environment/Dockerfile", "D"),
    ),
    "test.sh a directory": lambda task: _replace(task, "tests/test.sh", Path.mkdir),
    "a FIFO at the top": lambda task: os.mkfifo(task / "pipe"),
    "task.toml a directory": lambda task: _replace(task, "task.toml", Path.mkdir),
    "task.toml missing": lambda task: (task / "task.toml").unlink(),
    "pre_artifacts.sh missing": lambda task: (task / "pre_artifacts.sh").unlink(),
    "tests missing": lambda task: [p.unlink() for p in (task / "tests").iterdir()],
    "instruction not UTF-8": lambda task: _write(task, "instruction.md", b"\xff"),
    "pre_artifacts.sh not UTF-8": lambda task: _write(task, "pre_artifacts.sh", b"#!/bin/sh\n\xff"),
    "task.toml not UTF-8": lambda task: _write(task, "task.toml", b"\xff"),
    "task.toml malformed": lambda task: _toml(task, lambda text: text + "[[x\n"),
    "task.toml CRLF": lambda task: _toml(task, lambda text: text.replace("\n", "\r\n")),
    "task.toml CRLF in a string": lambda task: _toml(task, lambda text: text + 'note = """a\r\nb"""\n'),
    "task.toml lone CR": lambda task: _toml(task, lambda text: text + 'note = """a\rb"""\n'),
    "task.toml invalid": lambda task: _toml(task, lambda text: text.replace("cpus = 1", "cpus = 0")),
    "env key that steers the harness": lambda task: _toml(
        task, lambda text: text + "\n[environment.env]\nDOCKER_HOST = 'tcp://x'\n"
    ),
    "env template": lambda task: _toml(task, lambda text: text + '\n[environment.env]\nA = "${TOKEN}"\n'),
    "internet allowed": lambda task: _toml(task, lambda t: t.replace("internet = false", "internet = true")),
}  # fmt: skip


def _outcome(task: Path) -> TaskSpec | str:
    try:
        return load_task(task, "001", task.resolve())
    except TaskSpecError as exc:
        return f"TaskSpecError: {exc}"


@pytest.mark.parametrize("case", list(CASES))
def test_one_pass_and_path_by_path_agree(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    task = make_task(tmp_path, "001")
    CASES[case](task)
    scanned = _outcome(task)
    monkeypatch.setattr(taskspec, "scan_task_dir", lambda task_dir: None)
    assert scanned == _outcome(task)
    if isinstance(scanned, TaskSpec):
        assert scanned.task_hash == task_toml_sha256(task)  # what the worker computes


@pytest.mark.parametrize(
    "case",
    ["plain", "compose in environment", "steps", ".env in a step", "compose refused", "task.toml CRLF"],
)
def test_an_ordinary_task_is_read_in_one_pass(tmp_path: Path, case: str) -> None:
    task = make_task(tmp_path, "001")
    CASES[case](task)
    assert scan_task_dir(task) is not None


@pytest.mark.parametrize(
    "case",
    ["compose a symlink", "step a symlink", "instruction a symlink", "a FIFO at the top", "task.toml missing",
     "compose a FIFO", "environment a symlink"],
)  # fmt: skip
def test_an_unusual_task_is_read_path_by_path(tmp_path: Path, case: str) -> None:
    task = make_task(tmp_path, "001")
    CASES[case](task)
    assert scan_task_dir(task) is None


def test_a_symlinked_task_directory_is_read_path_by_path(tmp_path: Path) -> None:
    task = make_task(tmp_path, "001")
    os.symlink(task, tmp_path / "task_002")
    assert scan_task_dir(tmp_path / "task_002") is None
