"""What a transfer refused, added to the trial's `transfer-refusals.json` (written following no link)."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from sciencebench.core.piertrial import TRANSFER_REFUSALS
from sciencebench.network.transfer import (
    FILE_MODE,
    MAX_RECORDED,
    NEW_FILE_FLAGS,
    READ_FLAGS,
    SPOOL_BYTES,
    Refusal,
    open_trial_dir,
    write_all,
)


def _read_refusals(dir_fd: int) -> list[dict[str, str]]:
    try:
        fd = os.open(TRANSFER_REFUSALS, READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        try:
            data = json.loads(handle.read(SPOOL_BYTES) or b"{}")
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
        fd = os.open(TRANSFER_REFUSALS, NEW_FILE_FLAGS, FILE_MODE, dir_fd=dir_fd)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
                raise OSError(errno.EEXIST, f"{TRANSFER_REFUSALS} is not a regular file")
            os.ftruncate(fd, 0)
            os.set_blocking(fd, True)
            write_all(fd, body)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
