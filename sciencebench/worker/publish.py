"""A committed trial's directories put into the job directory, no link followed on the way.

`stage_dirs` copies a trial's tries' directories into the job directory
before its record is committed (the final one under a temporary name);
`Staged.publish` renames it into place once the record is stored,
`Staged.discard` removes it when the lease was lost; `write_record` writes
the record into `.sciencebench/trials/`.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from dataclasses import dataclass

from sciencebench.core.errors import OutputLimitError
from sciencebench.core.models import TrialRecord, TrialSpec
from sciencebench.core.paths import (
    JobPaths,
    copy_tree_at,
    open_job_dir,
    remove_tree_at,
    write_in_job,
)
from sciencebench.worker.stages import Try


@dataclass
class Staged:
    """A try's trial directories copied into the job directory, the final one under a temporary name.

    `stage_dirs` makes it before the record is committed (a job directory
    that cannot take the copy, a full disk, fails the try instead of losing
    its files); `publish` renames it into place once the record is stored,
    `discard` removes it when the lease was lost.
    """

    paths: JobPaths
    previous: str | None  # an earlier run's trial directory, to move to superseded/
    incoming: str | None  # the final try's copy, under its temporary name
    final_name: str | None

    def publish(self) -> None:
        """Move an earlier run's directory to `superseded/` and the final copy into place. Raises OSError."""
        job_fd = open_job_dir(self.paths)
        try:
            if self.previous is not None and self.previous != self.final_name:
                superseded_fd = open_job_dir(self.paths, self.paths.superseded_dir, create=True)
                try:
                    os.rename(self.previous, _free_name(superseded_fd, self.previous), src_dir_fd=job_fd,
                              dst_dir_fd=superseded_fd)  # fmt: skip
                finally:
                    os.close(superseded_fd)
            if self.incoming is not None and self.final_name is not None:
                os.rename(self.incoming, self.final_name, src_dir_fd=job_fd, dst_dir_fd=job_fd)
        finally:
            os.close(job_fd)

    def discard(self) -> None:
        """Remove the final copy (best effort): its record was not stored."""
        if self.incoming is None:
            return
        with contextlib.suppress(OSError):
            job_fd = open_job_dir(self.paths)
            try:
                remove_tree_at(job_fd, self.incoming)
            finally:
                os.close(job_fd)


def stage_dirs(paths: JobPaths, spec: TrialSpec, tries: list[Try]) -> Staged:
    """Copy the try's trial directories into the job directory: earlier tries' into `superseded/`.

    Pier's layout and naming: `<jobs-dir>/<job-name>/<task>__<trial>/`. The
    final copy keeps a temporary name until `Staged.publish`, so a trial
    directory is either absent or complete; every step goes through
    directory descriptors that follow no link (`core.paths.open_job_dir`), so
    nothing the job's owner put in the job directory takes a write outside
    it. Raises OSError when the job directory cannot take them, OutputLimitError
    when a directory is deeper than a copy goes (`core.paths.copy_tree_at`).
    """
    final = tries[-1].pier_dir if tries else None
    earlier = [t.pier_dir for t in tries[:-1] if t.pier_dir is not None and t.pier_dir.is_dir()]
    staged = Staged(paths, _previous_trial_dir(paths, spec), None, final.name if final else None)
    job_fd = open_job_dir(paths)
    try:
        if earlier:
            superseded_fd = open_job_dir(paths, paths.superseded_dir, create=True)
            try:
                for directory in earlier:
                    name = _free_name(superseded_fd, directory.name)
                    try:
                        copy_tree_at(directory, superseded_fd, name)
                    except (OSError, OutputLimitError):
                        with contextlib.suppress(OSError):  # no partial copy is left behind
                            remove_tree_at(superseded_fd, name)
                        raise
            finally:
                os.close(superseded_fd)
        if final is not None and final.is_dir():
            incoming = incoming_name(final.name)
            staged.incoming = incoming
            _remove_entry(job_fd, incoming)  # a copy its run's dead process left half made
            try:
                copy_tree_at(final, job_fd, incoming)
            except (OSError, OutputLimitError):
                staged.discard()
                raise
    finally:
        os.close(job_fd)
    return staged


def staged_before(paths: JobPaths, spec: TrialSpec, final_name: str) -> Staged:
    """What `stage_dirs` left of a run whose process died after its record's commit: published by the caller.

    Its final copy is still under its temporary name unless it was put in place.
    """
    incoming = incoming_name(final_name)
    try:
        job_fd = open_job_dir(paths)
        try:
            left = stat.S_ISDIR(os.lstat(incoming, dir_fd=job_fd).st_mode)
        finally:
            os.close(job_fd)
    except OSError:
        left = False
    return Staged(paths, _previous_trial_dir(paths, spec), incoming if left else None, final_name)


def incoming_name(final_name: str) -> str:
    """The temporary name of a final copy in the job directory (Pier's trial directory names are unique)."""
    return f".incoming-{final_name}"


def _remove_entry(dir_fd: int, name: str) -> None:
    """Remove `name` in `dir_fd` if it is there, a directory tree or anything else; no link followed."""
    try:
        info = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        remove_tree_at(dir_fd, name)
    else:
        os.unlink(name, dir_fd=dir_fd)


def publish_dirs(paths: JobPaths, spec: TrialSpec, tries: list[Try]) -> None:
    """`stage_dirs`, then `Staged.publish`: the try's trial directories into the job. Raises OSError."""
    stage_dirs(paths, spec, tries).publish()


def _free_name(dir_fd: int, name: str) -> str:
    """`name`, or `name` with a suffix when the directory `dir_fd` has an entry of that name."""
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return name
    return f"{name}.{uuid.uuid4().hex[:6]}"


def _previous_trial_dir(paths: JobPaths, spec: TrialSpec) -> str | None:
    """The name of an earlier run's trial directory of this trial (retry --failed) in the job directory.

    A record names it by its name alone; anything else (a path, `..`) is not
    moved, and what that name is now (a link included) only ever moves
    within the job directory.
    """
    try:
        old = TrialRecord.model_validate_json(paths.trial_record(spec.task_id, spec.attempt).read_bytes())
    except (OSError, ValueError):
        return None
    name = old.trial_dir
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        return None
    return name if os.path.lexists(paths.job_dir / name) else None


def write_record(paths: JobPaths, spec: TrialSpec, record_json: str) -> None:
    """Write the trial's record into `.sciencebench/trials/` (no link followed on the way). Raises OSError."""
    write_in_job(
        paths, paths.trial_record(spec.task_id, spec.attempt).relative_to(paths.job_dir), record_json
    )
