"""Admission: may this worker host run a trial of this job at all? Decided before claiming it.

A message and the `job.json` it points to are untrusted input: whoever can
write to the broker or to the shared filesystem can write them, and a worker
holds the Docker socket. So every path they name must resolve (symlinks
followed) under a root the worker is configured with, and the job must be
the one its submit wrote (the `job_id` in the message and in `job.json`).
A job uses only its own submitter's secrets (`load_owned_job`); the two
verdicts besides admission are in `admit`'s docstring.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path

from sciencebench.core.agent_kwargs import agent_kwargs_problem
from sciencebench.core.capacity import NOTHING, fits
from sciencebench.core.errors import RefusedError, UnfitError, WorkspaceError
from sciencebench.core.gateways import allowed_by, refusal_reason
from sciencebench.core.models import JobSpec, TrialSpec, agent_env_file_name, check_job_name
from sciencebench.core.paths import JobPaths, SelectionPaths
from sciencebench.core.settings import Settings
from sciencebench.worker.context import load_job


@dataclass(frozen=True)
class Admitted:
    """A trial this host may run: its job, read from the job directory the message named."""

    job: JobSpec
    paths: JobPaths
    owner_uid: int  # owns the job's directory, `.sciencebench/` and `job.json`; its secrets must be its own


def under(path: Path, roots: Sequence[Path]) -> bool:
    """Whether `path`, symlinks resolved, lies in one of `roots` (also resolved)."""
    real = path.resolve()
    return any(real.is_relative_to(root.resolve()) for root in roots)


def _roots_text(roots: Sequence[Path]) -> str:
    return ", ".join(map(str, roots)) or "none configured"


def admit(spec: TrialSpec, settings: Settings) -> Admitted:
    """Admit `spec` on this host, or raise UnfitError / RefusedError.

    A job uses only its own submitter's secrets. The job's owner is the account
    that owns its directory `<jobs dir>/<job name>`; its `.sciencebench/` and
    `job.json` must be that account's too (none of the three a symlink), and
    `job.json` is read from the descriptor whose owner was checked. The secrets
    stage then reads the env file and the `--agent-env` file only when they are
    that same account's (`worker.secrets`): knowing another user's env file's
    path and SHA-256 is not enough to run with it.

    - `UnfitError`: this host cannot serve the job (the trial's request exceeds
      its whole capacity, or its jobs directory, selection or env file is
      outside what it serves or not visible here). Another host may; the trial
      is handed back.
    - `RefusedError`: the job asks for what no worker does (a task directory
      outside its selection, an agent that is not importable here, a secrets file
      elsewhere, a gateway this worker's operator does not allow). The trial gets
      a refused record and nothing runs.
    """
    capacity = settings.capacity
    if not fits(NOTHING, spec.request, capacity):
        raise UnfitError(f"it asks {spec.request}, more than this host's capacity ({capacity})")
    jobs_dir = spec.jobs_dir
    if not jobs_dir.is_absolute() or not under(jobs_dir, settings.jobs_roots):
        raise UnfitError(
            f"jobs dir {jobs_dir} is outside the jobs roots this host serves "
            f"({_roots_text(settings.jobs_roots)})"
        )
    paths = JobPaths(jobs_dir, spec.job_name)
    if not under(paths.job_dir, settings.jobs_roots):
        raise RefusedError(f"job dir {paths.job_dir} resolves outside the jobs roots")
    _confined_layout(paths)
    try:
        job, owner_uid = load_owned_job(paths)
    except WorkspaceError as exc:
        raise UnfitError(str(exc)) from None
    except ValueError:
        raise RefusedError(f"{paths.job_spec}: not a job spec sciencebench wrote") from None
    if job.job_id != spec.job_id or job.job_name != spec.job_name:
        raise UnfitError(f"{paths.job_spec} on this host belongs to another submit than the trial's")
    if job.jobs_dir != jobs_dir:
        raise RefusedError(f"{paths.job_spec} names another jobs dir than the one it lies in")
    _admit_selection(spec, job, settings)
    _admit_secrets(job, settings)
    allowed = {*job.image_refs, *(baked.image for baked in job.agent_images.values())}
    if strays := sorted(set(spec.image_refs) - allowed):
        raise RefusedError(f"image {strays[0]} is not one of the job's images")
    if problem := agent_kwargs_problem(job.agent.agent_kwargs):
        raise RefusedError(problem)
    if job.agent.agent_import_path:
        _admit_agent(job.agent.agent_import_path)
    _admit_gateways(job, settings)
    return Admitted(job=job, paths=paths, owner_uid=owner_uid)


# job.json's identity (device, inode, size, change time, owner) -> the JobSpec parsed from it; the
# change time moves with every write or chmod, and no user can set it.
_owned_jobs: dict[tuple[int, int, int, int, int], JobSpec] = {}
_OWNED_JOBS_KEPT = 256
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def load_owned_job(paths: JobPaths) -> tuple[JobSpec, int]:
    """The job's JobSpec and the uid owning its directory, `.sciencebench/` and `job.json`.

    Each is opened without following a symlink, relative to the one before,
    and `job.json` is parsed from the descriptor whose owner was compared.
    Raises RefusedError when an owner differs or an entry is a link,
    WorkspaceError when the job is unreadable here, ValueError when
    `job.json` is not a JobSpec.
    """
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(paths.job_dir, _DIR_FLAGS))
            owner = os.fstat(fds[0]).st_uid
            fds.append(os.open(paths.meta_dir.name, _DIR_FLAGS, dir_fd=fds[0]))
            _same_owner(fds[-1], owner, paths.meta_dir)
            fds.append(os.open(paths.job_spec.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                               | os.O_CLOEXEC, dir_fd=fds[1]))  # fmt: skip
            info = _same_owner(fds[-1], owner, paths.job_spec)
            if not stat.S_ISREG(info.st_mode):
                raise RefusedError(f"{paths.job_spec} is not a regular file")
            key = (info.st_dev, info.st_ino, info.st_size, info.st_ctime_ns, info.st_uid)
            if (cached := _owned_jobs.get(key)) is not None:
                return cached, owner
            with os.fdopen(fds.pop(), "rb") as handle:
                data = handle.read()
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise RefusedError(
                    f"{paths.job_dir}: the job directory, .sciencebench/ or job.json is a symbolic link "
                    "or not what submit made"
                ) from None
            raise WorkspaceError(
                f"{paths.job_spec}: unreadable on this worker ({exc.strerror}); "
                "is the jobs directory on the shared filesystem?"
            ) from None
    finally:
        for fd in fds:
            os.close(fd)
    job = JobSpec.model_validate_json(data)
    if len(_owned_jobs) >= _OWNED_JOBS_KEPT:
        _owned_jobs.clear()
    _owned_jobs[key] = job
    return job, owner


def _same_owner(fd: int, owner: int, path: Path) -> os.stat_result:
    info = os.fstat(fd)
    if info.st_uid != owner:
        raise RefusedError(
            f"{path.relative_to(path.parents[1])} belongs to another account (uid {info.st_uid}) "
            f"than its job directory (uid {owner}); a job uses only its submitter's files"
        )
    return info


def verified_paths(spec: TrialSpec, settings: Settings) -> JobPaths | None:
    """The trial's job paths when this host serves them and they hold the trial's own job, else None."""
    return verified_paths_of(spec.jobs_dir, spec.job_name, spec.job_id, settings)


def verified_paths_of(
    jobs_dir: Path, job_name: str, job_id: uuid.UUID, settings: Settings
) -> JobPaths | None:
    """`JobPaths` of a job when this host serves its directory and its job.json is job `job_id`'s."""
    try:
        paths = JobPaths(jobs_dir, check_job_name(job_name))
        if not jobs_dir.is_absolute() or not under(paths.job_dir, settings.jobs_roots):
            return None
        _confined_layout(paths)
        return paths if load_job(paths).job_id == job_id else None
    except (WorkspaceError, RefusedError, ValueError, OSError):
        return None


def _confined_layout(paths: JobPaths) -> None:
    """What the worker reads and writes inside the job directory stays there (no symlinks out)."""
    job_dir = paths.job_dir.resolve()
    for part in (paths.meta_dir, paths.job_spec, paths.trials_dir, paths.superseded_dir):
        if part.is_symlink() or (os.path.lexists(part) and not part.resolve().is_relative_to(job_dir)):
            raise RefusedError(f"{part} is a symbolic link; the job directory's layout is sciencebench's")


def _admit_selection(spec: TrialSpec, job: JobSpec, settings: Settings) -> None:
    selection = job.selection_path
    if not selection.is_absolute() or not under(selection, settings.selection_roots):
        raise UnfitError(
            f"selection {selection} is outside the selection roots this host serves "
            f"({_roots_text(settings.selection_roots)})"
        )
    if not selection.is_dir():
        raise UnfitError(f"selection {selection} is not visible on this host (is it shared?)")
    if spec.task_id not in job.task_ids:
        raise RefusedError(f"task {spec.task_id} is not in the job's selection")
    expected = SelectionPaths(selection).task_dir(spec.task_id)
    if spec.task_dir != expected:
        raise RefusedError(f"task dir {spec.task_dir} is not {expected.name} of the job's selection")
    if not expected.resolve().is_relative_to(selection.resolve()):
        raise RefusedError(f"{expected} resolves outside its selection")


def _admit_secrets(job: JobSpec, settings: Settings) -> None:
    if job.env_file is not None:
        env_file = job.env_file.path
        if not env_file.is_absolute() or not under(env_file, settings.env_file_roots):
            raise UnfitError(
                f"env file {env_file} is outside the env-file roots this host serves "
                f"({_roots_text(settings.env_file_roots)})"
            )
        if not os.access(env_file, os.R_OK):
            raise UnfitError(
                f"env file {env_file} is not readable on this host (does it exist only on the login node?)"
            )
    if job.agent_env_file is not None:
        secrets_dir = SelectionPaths(job.selection_path).secrets_dir
        path = job.agent_env_file.path
        if (
            path.parent != secrets_dir
            or path.name != agent_env_file_name(job)
            or not under(path, [secrets_dir])
        ):
            raise RefusedError(f"--agent-env file {job.agent_env_file.path} is not in {secrets_dir}")


def _admit_gateways(job: JobSpec, settings: Settings) -> None:
    """Refuse a gateway the operator does not allow (`core.gateways.allowed_by`): job.json is untrusted."""
    listed = [gateway.origin for gateway in settings.gateways]
    for gateway in job.agent.gateways:
        if not allowed_by(gateway, settings.gateways):
            why = refusal_reason(gateway, listed)
            raise RefusedError(
                f"gateway {gateway.url}: {why}; this worker reaches it only when its operator allows it "
                f"(sciencebench worker --gateway {gateway.origin}, or SCIENCEBENCH_GATEWAYS)"
            )


def importable(module: str, search_path: Sequence[str]) -> bool:
    """Whether `module` (dotted) would be found on `search_path`, without running any of its code."""
    path: list[str] | None = list(search_path)
    parts = module.split(".")
    for index, part in enumerate(parts):
        if not part.isidentifier() or path is None:
            return False
        found = PathFinder.find_spec(part, path)
        if found is None:
            return False
        locations = found.submodule_search_locations
        path = list(locations) if locations is not None else None
        if path is None and index < len(parts) - 1:
            return False
    return True


def _admit_agent(import_path: str) -> None:
    module, sep, attribute = import_path.partition(":")
    if not sep or not all(part.isidentifier() for part in attribute.split(".")):
        raise RefusedError(f"agent import path {import_path!r} is not module:Class")
    if not importable(module, [entry for entry in sys.path if os.path.isabs(entry)]):
        raise RefusedError(
            f"agent import path {import_path!r}: module {module} is not installed on this worker"
        )
