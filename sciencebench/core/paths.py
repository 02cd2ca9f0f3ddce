"""The jobs layout: one frozen paths object per place (`JobPaths`, `SelectionPaths`, `ScratchPaths`).

The job directory belongs to its submitter, who may rename, swap or link
anything in it at any time. A worker therefore keeps nothing there while a
trial runs (its scratch is host-local: `Settings.scratch_dir`) and writes
into it only through directory descriptors opened one component at a time
without following a link (`open_job_dir`, `write_atomic_at`): whatever the
submitter does, the worker's writes stay inside the job directory. Each
class's docstring draws its tree.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from sciencebench.core.errors import OutputLimitError

# Where jobs go unless --jobs-dir says otherwise (relative to the working directory).
DEFAULT_JOBS_DIR = Path("jobs")
META_DIR_NAME = ".sciencebench"
SCRATCH_DIR_NAME = "scratch"


@dataclass(frozen=True)
class JobPaths:
    """The paths of one job under its jobs directory.

    <jobs-dir>/<job-name>/
    ├── result.json                  Pier JobResult shape, written by the finalizer
    ├── summary.json                 {generated_at, jobs_dir, trial_count, missing_trials, flaky_tasks,
    │                                 rows, stats}
    ├── summary.csv                  one row per trial directory
    ├── task_002__a1b2c3d/           a trial directory exactly as Pier writes it
    │   ├── result.json, config.json, trial.log, agent/, artifacts/
    │   ├── verifier/{reward.txt, reward.json, ctrf.json, test-stdout.txt}
    │   └── network-policy-<session>.json
    └── .sciencebench/
        ├── job.json                 the JobSpec of the submit
        ├── trials/002-1.json        the latest TrialRecord of task 002, attempt 1
        └── superseded/              trial directories replaced by a later run
    """

    jobs_dir: Path
    job_name: str

    @property
    def job_dir(self) -> Path:
        """`<jobs dir>/<job name>`."""
        return self.jobs_dir / self.job_name

    @property
    def result_json(self) -> Path:
        """The job's `result.json` (Pier's JobResult shape)."""
        return self.job_dir / "result.json"

    @property
    def config_json(self) -> Path:
        """The job's `config.json` (Pier's JobConfig)."""
        return self.job_dir / "config.json"

    @property
    def summary_json(self) -> Path:
        """`summary.json`."""
        return self.job_dir / "summary.json"

    @property
    def summary_csv(self) -> Path:
        """`summary.csv`."""
        return self.job_dir / "summary.csv"

    @property
    def meta_dir(self) -> Path:
        """The job's own sciencebench files: `.sciencebench/`."""
        return self.job_dir / META_DIR_NAME

    @property
    def job_spec(self) -> Path:
        """The job's JobSpec: `.sciencebench/job.json`."""
        return self.meta_dir / "job.json"

    @property
    def trials_dir(self) -> Path:
        """Where trial records go: `.sciencebench/trials/`."""
        return self.meta_dir / "trials"

    @property
    def superseded_dir(self) -> Path:
        """Trial directories replaced by a later try or run: `.sciencebench/superseded/`."""
        return self.meta_dir / "superseded"

    def trial_record(self, task_id: str, attempt: int) -> Path:
        """The record of one trial: `.sciencebench/trials/<task id>-<attempt>.json`."""
        return self.trials_dir / f"{task_id}-{attempt}.json"

    def parts(self, path: Path) -> tuple[str, ...]:
        """The components of `path` (one of these paths) below the job directory, for `open_job_dir`."""
        return path.relative_to(self.job_dir).parts


@dataclass(frozen=True)
class SelectionPaths:
    """The paths of a materialized selection, and the files sciencebench keeps in it.

    <selection>/
    ├── task_002/                    a task directory
    ├── batch-run.json               the run record of the latest submit
    └── .sciencebench/
        ├── agent-images.json        the baked agent images (`images bake`), and its .agent-images.lock
        └── secrets/                 a running job's --agent-env and --agent-kwarg values (0700)
    """

    selection: Path

    def task_dir(self, task_id: str) -> Path:
        """A task's directory: `task_<id>/`."""
        return self.selection / f"task_{task_id}"

    @property
    def run_record(self) -> Path:
        """The run record of the latest submit: `batch-run.json`."""
        return self.selection / "batch-run.json"

    @property
    def meta_dir(self) -> Path:
        """The selection's own sciencebench files: `.sciencebench/`."""
        return self.selection / META_DIR_NAME

    @property
    def agent_images(self) -> Path:
        """The baked agent images: `.sciencebench/agent-images.json`."""
        return self.meta_dir / "agent-images.json"

    @property
    def agent_images_lock(self) -> Path:
        """The lock one bake of the selection holds: `.sciencebench/.agent-images.lock`."""
        return self.meta_dir / ".agent-images.lock"

    @property
    def secrets_dir(self) -> Path:
        """Where submit keeps a job's --agent-env and --agent-kwarg values: `.sciencebench/secrets/`."""
        return self.meta_dir / "secrets"


@dataclass(frozen=True)
class ScratchPaths:
    """A worker host's scratch of running trials: host-local, the worker's own, never in a job directory.

    <scratch root>/<job id>/         host-local, the worker's own (`worker.journal`)
    ├── <task id>-<attempt>.<owner>.lock     flock held by the owner process while the run lives
    └── <task id>-<attempt>.<owner>/         one run of a trial
        ├── claim.json                       its message, lease owner and start
        └── try-<n>/                         one try: the task snapshot, Pier's job, try.json (how it ended)
    """

    root: Path

    @classmethod
    def under(cls, state_dir: Path) -> ScratchPaths:
        """The default scratch root: `<state dir>/scratch`."""
        return cls(state_dir / SCRATCH_DIR_NAME)

    def job_dir(self, job_id: UUID | str) -> Path:
        """A job's scratch: `<root>/<job id>/`."""
        return self.root / str(job_id)

    def trial_dir(self, job_id: UUID | str, task_id: str, attempt: int, owner: str) -> Path:
        """One run of a trial: `<root>/<job id>/<task id>-<attempt>.<owner>/`."""
        return self.job_dir(job_id) / f"{task_id}-{attempt}.{owner}"

    @staticmethod
    def try_dir(trial_dir: Path, number: int) -> Path:
        """One try of a run (`--max-retries`): `<trial dir>/try-<n>/`."""
        return trial_dir / f"try-{number}"

    @staticmethod
    def lock(trial_dir: Path) -> Path:
        """The flock its owner process holds while the run lives: `<trial dir>.lock`, beside it."""
        return trial_dir.with_name(f"{trial_dir.name}.lock")

    @staticmethod
    def claim(trial_dir: Path) -> Path:
        """The run's claim: its message, lease owner and start (`<trial dir>/claim.json`)."""
        return trial_dir / "claim.json"

    @staticmethod
    def try_end(try_dir: Path) -> Path:
        """How a try ended, once known (`<try dir>/try.json`)."""
        return try_dir / "try.json"


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write a file so readers see the old content or the new, never a part.

    The temporary file sits beside the target (same filesystem) and is
    fsynced before the rename.
    """
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_job_dir(paths: JobPaths, parts: Sequence[str] | Path = (), *, create: bool = False) -> int:
    """A descriptor of `<job dir>/<parts...>`, each component opened without following a link.

    `parts` may also be one of `paths`' directories (`paths.meta_dir`).

    The jobs directory itself is the worker's configured root (checked at
    admission; created when `create` and missing); from the job directory
    down every component must be a real directory, created (mode 0755) when
    `create` and missing. Raises OSError
    (ELOOP for a link, ENOTDIR for anything else).
    """
    if isinstance(parts, Path):
        parts = paths.parts(parts)
    if create:
        paths.jobs_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(paths.jobs_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in (paths.job_name, *parts):
            if part in ("", ".", "..") or "/" in part:
                raise OSError(errno.EINVAL, "not one path component", part)
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_atomic_at(dir_fd: int, name: str, data: str | bytes, mode: int = 0o644) -> None:
    """`write_atomic` of `name` in the directory `dir_fd`: a fresh temporary file, fsynced, renamed over it.

    The temporary file is created exclusively and without following a link;
    the rename replaces whatever `name` is (a link included) and follows none.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, _NEW_FILE_FLAGS, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def write_in_job(paths: JobPaths, relative: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write `<job dir>/<relative>` atomically through `open_job_dir` (its directories created as needed)."""
    parts = relative.parts
    fd = open_job_dir(paths, parts[:-1], create=True)
    try:
        write_atomic_at(fd, parts[-1], data, mode)
    finally:
        os.close(fd)


# Directories deep a copy of a trial's tree goes (`copy_tree_at`): Pier's layout is a few levels, and
# what a container sent is at most `network.transfer.MAX_DEPTH` below the directory it was written to.
MAX_TREE_DEPTH = 96
# Directory descriptors a removal (`remove_tree_at`) keeps open along its path, whatever the depth.
_REMOVE_FDS = 32
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _with_new_directory(src: int, name: str, parent_fd: int) -> tuple[int, int]:
    """`src` (an open directory) and the new directory `name` in `parent_fd`, open; closes `src` if not."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
        return src, os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except BaseException:
        os.close(src)
        raise


def copy_tree_at(source: Path, parent_fd: int, name: str, *, max_depth: int = MAX_TREE_DEPTH) -> None:
    """Copy the directory `source` to a new directory `name` in `parent_fd`, following no link on either side.

    `source` is the worker's own (a trial's scratch) but a container shaped
    what is in it: links and special files are left out, a sparse file's
    holes stay holes, and a directory more than `max_depth` below `source`
    raises OutputLimitError. The walk is iterative, every entry opened
    relative to its directory's descriptor, the copy's entries created
    exclusively. Raises OSError (FileExistsError when `name` exists); a
    failed copy may leave a partial `name`.
    """
    src, dst = _with_new_directory(os.open(source, _DIR_FLAGS), name, parent_fd)
    # One level per directory being copied: its two descriptors and the entries still to copy.
    stack: list[tuple[int, int, list[str]]] = [(src, dst, [])]
    try:
        stack[0][2].extend(sorted(os.listdir(src)))
        while stack:
            src, dst, names = stack[-1]
            if not names:
                stack.pop()
                os.close(src)
                os.close(dst)
                continue
            entry = names.pop()
            info = os.stat(entry, dir_fd=src, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                if len(stack) > max_depth:
                    raise OutputLimitError(f"{source}: deeper than {max_depth} directories; not copied")
                child, copy = _with_new_directory(os.open(entry, _DIR_FLAGS, dir_fd=src), entry, dst)
                stack.append((child, copy, []))
                stack[-1][2].extend(sorted(os.listdir(child)))
            elif stat.S_ISREG(info.st_mode):
                _copy_file_at(src, entry, dst)
    finally:
        for src, dst, _ in stack:
            os.close(src)
            os.close(dst)


def _copy_file_at(src_dir: int, name: str, dst_dir: int) -> None:
    """Copy the regular file `name` of `src_dir` to a new file `name` in `dst_dir`, its holes kept holes."""
    src = os.open(name, _READ_FLAGS, dir_fd=src_dir)
    try:
        info = os.fstat(src)
        if not stat.S_ISREG(info.st_mode):  # replaced since it was listed
            return
        dst = os.open(name, _NEW_FILE_FLAGS, 0o755 if info.st_mode & 0o100 else 0o644, dir_fd=dst_dir)
        try:
            os.set_blocking(src, True)
            offset = 0
            while offset < info.st_size:
                try:
                    offset = os.lseek(src, offset, os.SEEK_DATA)
                    end = min(os.lseek(src, offset, os.SEEK_HOLE), info.st_size)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # only a hole is left
                        break
                    if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                        raise
                    end = info.st_size  # a filesystem that cannot tell holes: all of it is copied
                while offset < end and (chunk := os.pread(src, min(end - offset, 1 << 20), offset)):
                    view = memoryview(chunk)
                    while view:
                        written = os.pwrite(dst, view, offset)
                        view, offset = view[written:], offset + written
                offset = max(offset, end)
            os.ftruncate(dst, info.st_size)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def remove_tree_at(parent_fd: int, name: str) -> None:
    """Remove `name` in `parent_fd`: a directory tree of any depth, or anything else; no link followed.

    The walk is iterative and opens every directory relative to its parent's
    descriptor with O_NOFOLLOW, so a link is removed, never followed. At most
    `_REMOVE_FDS` descriptors stay open along the path: an ancestor closed on
    the way down is opened again as `..` and must be the directory it was
    (else OSError ESTALE: the tree was moved while it was removed). Raises
    OSError (FileNotFoundError when `name` is missing).
    """
    try:
        top = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        os.unlink(name, dir_fd=parent_fd)
        return
    # One level per directory on the path: its descriptor (None once closed), identity, name, entries left.
    stack: list[_Level] = [_Level(top, os.fstat(top), name)]
    held = 1
    try:
        while stack:
            level = stack[-1]
            fd = level.fd
            assert fd is not None  # the deepest level is always open
            if level.names is None:
                level.names = os.listdir(fd)
            if level.names:
                entry = level.names.pop()
                try:
                    child = os.open(entry, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno == errno.ENOENT:
                        continue
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    os.unlink(entry, dir_fd=fd)
                    continue
                stack.append(_Level(child, os.fstat(child), entry))
                held += 1
                if held > _REMOVE_FDS:  # the shallowest open one is closed
                    oldest = stack[len(stack) - held]
                    if oldest.fd is not None:
                        os.close(oldest.fd)
                        oldest.fd = None
                    held -= 1
                continue
            stack.pop()
            if stack and stack[-1].fd is None:
                stack[-1].fd = _reopen_parent(fd, stack[-1].info)
                held += 1
            os.close(fd)
            level.fd = None
            held -= 1
            os.rmdir(level.name, dir_fd=stack[-1].fd if stack else parent_fd)
    finally:
        for level in stack:
            if level.fd is not None:
                os.close(level.fd)


@dataclass
class _Level:
    """A directory on the path of `remove_tree_at`."""

    fd: int | None
    info: os.stat_result
    name: str
    names: list[str] | None = None


def _reopen_parent(fd: int, expected: os.stat_result) -> int:
    """The parent of the directory `fd`, which must be the directory `expected` (else OSError ESTALE)."""
    parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
    if not os.path.samestat(os.fstat(parent), expected):
        os.close(parent)
        raise OSError(errno.ESTALE, "moved while it was removed")
    return parent
