"""A task's policy review, cached per worker process by what the review reads of the snapshot.

`core.taskreview.review_task_dir` reads the snapshot's task.toml and
compose files (all covered by the task hash the snapshot computed from the
bytes it copied, `core.taskdir.definition_sha256`) and looks at the tree's
entries (names and types: symlinks, special files, `.env` files, bind mount
sources). The cache key is both: the task hash and the snapshot's listing, so
a task whose reviewed bytes or entries changed is reviewed again. The
snapshot is the worker's own copy (`worker.snapshot`), so nothing changes it
between the key and the review.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path

from sciencebench.core.taskreview import TaskReview, review_task_dir

# Reviews kept per process (a job's tasks, a few jobs).
MAX_REVIEWS = 512

_lock = threading.Lock()
_reviews: OrderedDict[str, TaskReview] = OrderedDict()


def review_key(task_dir: Path, digest: str) -> str:
    """The task hash and every entry of the snapshot (relative path, type, executable bit), hashed."""
    key = hashlib.sha256(digest.encode())
    for root, dirs, files in os.walk(task_dir):
        dirs.sort()
        for name in [*(f"{d}/" for d in dirs), *sorted(files)]:
            path = os.path.join(root, name.rstrip("/"))
            kind = "d" if name.endswith("/") else ("l" if os.path.islink(path) else "f")
            executable = "x" if kind == "f" and os.access(path, os.X_OK) else "-"
            key.update(f"\0{os.path.relpath(path, task_dir)}\0{kind}{executable}".encode())
    return key.hexdigest()


def reviewed(task_dir: Path, digest: str) -> TaskReview:
    """`review_task_dir(task_dir)`, once per (task hash, listing) in this process.

    `digest` is the task hash of the snapshot at `task_dir`. Raises what
    `review_task_dir` raises (never cached).
    """
    key = review_key(task_dir, digest)
    with _lock:
        found = _reviews.get(key)
        if found is not None:
            _reviews.move_to_end(key)
            return found
    review = review_task_dir(task_dir)
    with _lock:
        _reviews[key] = review
        while len(_reviews) > MAX_REVIEWS:
            _reviews.popitem(last=False)
    return review
