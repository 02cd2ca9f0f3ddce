"""A materialized selection directory -> one validated Selection.

Tasks are never picked implicitly: the ids come from `selection.json` when
it exists, else from the `task_NNN` directory names, and `--task-id` may only
narrow them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from sciencebench.core.errors import SelectionError, TaskSpecError
from sciencebench.core.paths import SelectionPaths
from sciencebench.login.taskspec import TaskSpec, load_task

_TASK_ID = re.compile(r"[0-9]{3,}")
_TASK_DIR = re.compile(r"^task_([0-9]{3,})$")
_ID_TOKEN = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")
# Bounds that no real selection comes near; they keep a typo from building a
# huge list (or int() from refusing a >4300-digit string with a ValueError).
_MAX_ID_DIGITS = 12
_MAX_RANGE_IDS = 100_000


class SelectionFile(BaseModel):
    """`<path>/selection.json` as materialize.py writes it."""

    model_config = ConfigDict(extra="ignore")

    # None when the file says nothing: the original records null then.
    allow_restricted_licenses: bool | None = None
    task_ids: list[str]


class Selection(BaseModel):
    """The tasks of one submit: ids in run order, their specs, their images."""

    model_config = ConfigDict(frozen=True)

    path: Path
    task_ids: list[str]
    allow_restricted_licenses: bool | None
    tasks: dict[str, TaskSpec]

    @property
    def sha256(self) -> str:
        """The selection hash the original runner records."""
        return selection_sha256(self.task_ids)

    @property
    def image_refs(self) -> list[str]:
        """Every image the selection needs, each once, in first-use order."""
        refs: dict[str, None] = {}
        for task_id in self.task_ids:
            refs.update(dict.fromkeys(self.tasks[task_id].image_refs))
        return list(refs)


def selection_sha256(task_ids: list[str]) -> str:
    """The hash the original runner records: SHA-256 of the JSON task-id list."""
    payload = json.dumps({"task_ids": task_ids}, sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def parse_task_id_filter(text: str) -> list[str]:
    """Parse `002,005-007` into ["002", "005", "006", "007"] (ranges inclusive).

    Ids keep the zero-padded width of the token that names them. Raises
    SelectionError on bad syntax or a descending range.
    """
    ids: list[str] = []
    for token in (part.strip() for part in text.split(",")):
        match = _ID_TOKEN.match(token)
        if not match:
            raise SelectionError(f"--task-id: bad token {token!r} (expected e.g. 002,005-007)")
        start, end = match.group(1), match.group(2)
        if max(len(start), len(end or "")) > _MAX_ID_DIGITS:
            raise SelectionError(f"--task-id: a task id has more than {_MAX_ID_DIGITS} digits")
        if end is None:
            ids.append(start)
            continue
        if int(end) < int(start):
            raise SelectionError(f"--task-id: descending range {token!r}")
        if int(end) - int(start) >= _MAX_RANGE_IDS:
            raise SelectionError(f"--task-id: range {token!r} names more than {_MAX_RANGE_IDS} ids")
        width = len(start)
        ids.extend(str(n).zfill(width) for n in range(int(start), int(end) + 1))
    return list(dict.fromkeys(ids))


def _listed_ids(path: Path) -> tuple[list[str], bool | None]:
    selection_file = path / "selection.json"
    if selection_file.is_file():
        try:
            parsed = SelectionFile.model_validate_json(selection_file.read_bytes())
        except (OSError, ValidationError) as exc:
            detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else exc
            raise SelectionError(f"{selection_file}: unusable ({detail})") from None
        # An id names the directory task_<id>: "002/" or "002/." would too, and
        # then leak into trial names and record paths.
        bad = next((task_id for task_id in parsed.task_ids if not _TASK_ID.fullmatch(task_id)), None)
        if bad is not None:
            raise SelectionError(f"{selection_file}: task id {bad!r} is not a number such as 002")
        return parsed.task_ids, parsed.allow_restricted_licenses
    ids = sorted(
        match.group(1)
        for child in path.iterdir()
        if child.is_dir() and (match := _TASK_DIR.match(child.name))
    )
    return ids, None


def load_selection(path: Path, task_id_filter: str | None = None) -> Selection:
    """Validate a materialized selection directory and every task in it.

    Raises SelectionError or TaskSpecError (both InputError) with one line
    naming the problem and where it is.
    """
    if not path.exists():
        raise SelectionError(f"--path {path}: no such directory")
    if not path.is_dir():
        raise SelectionError(f"--path {path}: not a directory")
    try:
        ids, restricted = _listed_ids(path)
    except PermissionError:
        raise SelectionError(f"--path {path}: permission denied") from None
    if not ids:
        raise SelectionError(f"--path {path}: not a materialized selection (no task_NNN/ directories)")
    root = path.resolve()
    real_dirs = _real_dirs(path)
    for task_id in ids:
        if f"task_{task_id}" in real_dirs:
            continue  # a directory, not a symlink: it resolves to root / its name
        task_dir = SelectionPaths(path).task_dir(task_id)
        if not task_dir.is_dir():
            raise SelectionError(f"{path}: task {task_id} is listed but task_{task_id}/ is missing")
        if task_dir.is_symlink() or task_dir.resolve() != root / task_dir.name:
            raise SelectionError(
                f"{task_dir}: a symlink (it resolves to {task_dir.resolve()}); a task directory "
                "must be a real directory inside the selection"
            )
    if task_id_filter is not None:
        wanted = parse_task_id_filter(task_id_filter)
        unknown = [task_id for task_id in wanted if task_id not in ids]
        if unknown:
            raise SelectionError(f"--task-id: unknown task id {unknown[0]} in {path}")
        ids = [task_id for task_id in ids if task_id in wanted]

    tasks: dict[str, TaskSpec] = {}
    for task_id in ids:
        task_dir = SelectionPaths(path).task_dir(task_id)
        tasks[task_id] = load_task(task_dir, task_id, root / task_dir.name)
    if len(tasks) != len(ids):
        raise TaskSpecError(f"{path}: duplicate task ids in the selection")
    return Selection(
        path=root,
        task_ids=ids,
        allow_restricted_licenses=restricted,
        tasks=tasks,
    )


def _real_dirs(path: Path) -> set[str]:
    """The real directories (not symlinks) in `path`, from one `os.scandir`; none if it cannot be listed."""
    try:
        with os.scandir(path) as listing:
            return {entry.name for entry in listing if entry.is_dir(follow_symlinks=False)}
    except OSError:
        return set()
