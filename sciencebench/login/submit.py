"""Login-node side of a submit: options -> validated JobSpec and trials.

Everything here either succeeds completely or raises an InputError before
anything is written or enqueued.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from sciencebench.core.agent_kwargs import split_secret_kwargs
from sciencebench.core.envfile import EnvFile, agent_key_problem
from sciencebench.core.errors import InputError, JobConflictError, ProfileError, TaskSpecError
from sciencebench.core.images import parse_platform
from sciencebench.core.models import (
    JobSpec,
    RunOptions,
    TrialSpec,
    agent_env_file_name,
    agent_kwargs_file_name,
    check_job_name,
)
from sciencebench.core.paths import JobPaths, SelectionPaths, write_atomic
from sciencebench.core.settings import required_visibility_timeout
from sciencebench.login.agentimages import resolve_agent_images
from sciencebench.login.cluster import MODEL_FREE_AGENTS, Cluster, Needs, check_cluster
from sciencebench.login.options import SubmitOptions, describe
from sciencebench.login.plan import expand
from sciencebench.login.profiles import (
    is_sensitive_key,
    parse_assignments,
    plan_agent,
    proxy_variable_problem,
    read_env_file,
)
from sciencebench.login.resume import unfinished_trials
from sciencebench.login.runrecord import RunRecord, write_run_record
from sciencebench.login.selection import Selection, load_selection

DEFAULT_PIER_BIN = SubmitOptions.model_fields["pier_bin"].default
# job.json names the env file's and the --agent-env file's SHA-256: readable by the submitting
# account and its group (workers run as one or the other, docs/deployment.md), not by others.
JOB_SPEC_MODE = 0o640


@dataclass(frozen=True)
class Prepared:
    """A validated submit, ready to record and dispatch."""

    selection: Selection
    job: JobSpec
    trials: list[TrialSpec]
    # The job's first trial, run now or kept: the run record renders its Pier command.
    first_trial: TrialSpec
    secret_values: list[str]
    agent_env_values: dict[str, str]
    # The values of credential-looking --agent-kwarg keys (the job spec holds them redacted).
    agent_kwarg_values: dict[str, str] = field(default_factory=dict)
    # What a dry run could not check here (no broker; this host's proxy image), for the line saying so.
    unchecked: tuple[str, ...] = ()
    # The job existed with the same inputs: this submit continues it, and `trials` are those still to run.
    resumed: bool = False


def _check_options(opts: SubmitOptions, local: bool) -> None:
    # Numbers are checked by SubmitOptions' own constraints.
    if opts.env != "docker":
        raise InputError("--env: only 'docker' is supported (the offline network policy needs it)")
    if opts.job_name is not None:
        try:
            check_job_name(opts.job_name)
        except ValueError as exc:
            raise InputError(f"--job-name: {exc}") from None
    if parse_platform(opts.platform) is None:
        raise InputError(f"--platform {opts.platform!r}: expected os/arch[/variant], e.g. linux/amd64")
    if not local and opts.pier_bin != DEFAULT_PIER_BIN:
        raise InputError(
            "--pier-bin: with a broker every worker runs its own Pier (sciencebench worker --pier-bin, "
            "or SCIENCEBENCH_PIER_BIN on the worker hosts); --pier-bin applies to --local only"
        )
    if not local and opts.gateways:
        raise InputError(
            "--gateway: with a broker the workers' operators allow gateways (sciencebench worker "
            "--gateway, or SCIENCEBENCH_GATEWAYS on the worker hosts); --gateway applies to --local only"
        )
    if opts.agent_import_path is not None:
        module, sep, attribute = opts.agent_import_path.partition(":")
        if not sep or not all(p.isidentifier() for p in [*module.split("."), *attribute.split(".")]):
            raise InputError(f"--agent-import-path {opts.agent_import_path!r}: expected module:Class")


def _check_declared(selection: Selection, declared: set[str]) -> None:
    """Refuse a task whose templates or compose variables name a variable the submit did not declare.

    Pier resolves those from its process environment; only what the env file
    and --agent-env provide may reach a container.
    """
    for task_id in selection.task_ids:
        task = selection.tasks[task_id]
        for kind, names in (("an env template", task.template_variables),
                            ("its compose file", task.compose_variables)):  # fmt: skip
            undeclared = sorted(names - declared)
            if undeclared:
                raise TaskSpecError(
                    f"task_{task_id}: {kind} asks for ${{{undeclared[0]}}}, which neither --env-file "
                    "nor --agent-env provides"
                )


def default_job_name(agent: str) -> str:
    """`<agent>-<UTC timestamp>`, the name of a job submitted without --job-name (a valid job name)."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", agent).lstrip("._-")[:100] or "job"
    return f"{stem}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def prepare(
    opts: SubmitOptions,
    visibility_timeout_sec: int | None = None,
    *,
    local: bool = False,
    hosts: Callable[[], Cluster],
) -> Prepared:
    """Validate everything a submit needs; write nothing. Raises InputError.

    `local`: the trials run in this process (`--local`), not on workers.
    `hosts`: the hosts that would run them (`login.cluster`: this host, or
    the live workers in the store), asked last, once the input is known
    good. A dry run is validated the same way; only a missing credential is
    allowed in one, as the original runner allows it ("required for a real run"),
    and it starts no proxy, so `--local --dry-run` needs no proxy image. What a
    dry run could not check (hosts unknown: `Cluster.unknown`) is `Prepared.unchecked`.
    """
    _check_options(opts, local)
    selection = load_selection(opts.path, opts.task_id)

    env_file: EnvFile | None = None
    env_values: dict[str, str] = {}
    if opts.env_file is not None:
        env_file, env_values = read_env_file(opts.env_file)
    agent_env = parse_assignments(opts.agent_env, "--agent-env")
    for option, keys in (("--env-file", env_values), ("--agent-env", agent_env)):
        if proxy := next((p for key in keys if (p := proxy_variable_problem(key, option))), None):
            raise ProfileError(proxy)
        problem = next((p for key in keys if (p := agent_key_problem(key))), None)
        if problem:
            raise ProfileError(f"{option}: refused: {problem}")
    _check_declared(selection, set(env_values) | set(agent_env))
    agent_kwargs = parse_assignments(opts.agent_kwargs, "--agent-kwarg")
    agent_plan = plan_agent(
        agent=opts.agent,
        env_values=env_values,
        models=opts.models,
        agent_kwargs=agent_kwargs,
        agent_env=agent_env,
        agent_import_path=opts.agent_import_path,
        auto_provider=opts.auto_provider,
        auto_agent_adapter=opts.auto_agent_adapter,
        dry_run=opts.dry_run,
    )
    baked = resolve_agent_images(selection, agent_plan)
    agent_plan, agent_images = baked.plan, baked.images
    # Credential-looking keyword values leave the job spec: they travel in a private file.
    public_kwargs, secret_kwargs = split_secret_kwargs(agent_plan.agent_kwargs)
    agent_plan = agent_plan.model_copy(update={"agent_kwargs": public_kwargs})
    jobs_dir = opts.jobs_dir.resolve()
    hashes = {task_id: selection.tasks[task_id].task_hash for task_id in selection.task_ids}
    try:
        job = JobSpec(
            job_name=opts.job_name or default_job_name(opts.agent),
            jobs_dir=jobs_dir,
            selection_path=selection.path,
            selection_sha256=selection.sha256,
            task_ids=selection.task_ids,
            allow_restricted_licenses=selection.allow_restricted_licenses,
            image_refs=selection.image_refs,
            task_hashes=hashes,
            agent=agent_plan,
            env_file=env_file,
            agent_images=agent_images,
            user=submitting_user(),
            local=local,
            # The options every trial runs with, as the table defines them.
            **{name: getattr(opts, name) for name in RunOptions.model_fields},
        )
    except ValidationError as exc:  # e.g. a --job-name the options let through
        raise InputError(describe(exc)) from None
    previous = previous_job(job, agent_env, secret_kwargs)
    job = previous or job
    secrets = [v for k, v in env_values.items() if is_sensitive_key(k)] + list(agent_env.values())
    every = expand(selection, job, hashes)
    # The same command again: the trials with no final record yet.
    trials = every if previous is None else unfinished_trials(job, every)
    if visibility_timeout_sec is not None:
        check_visibility_timeout(trials, visibility_timeout_sec)
    model_agent = opts.agent not in MODEL_FREE_AGENTS
    needs = Needs(
        proxy=model_agent and not (local and opts.dry_run),
        online_install=agent_plan.harness if baked.missing else None,
        paths=_served_paths(opts, selection, env_file),
        gateways=tuple(agent_plan.gateways),
        requests=tuple({trial.task_id: trial.request for trial in trials}.items()),
    )
    cluster = hosts()
    check_cluster(cluster, needs, baked.missing_line)
    unchecked: list[str] = []
    if not cluster.known:
        unchecked.append("the live worker hosts' roots, gateways, proxy image, agent install and "
                         f"pre-warm pulls ({cluster.where})")  # fmt: skip
    elif model_agent and not needs.proxy and not any(kit.proxy_image for kit in cluster.kits.values()):
        unchecked.append(
            "this host's inference proxy image (SCIENCEBENCH_PROXY_IMAGE, needed by the real run)"
        )
    return Prepared(
        selection=selection,
        job=job,
        trials=trials,
        secret_values=[s for s in secrets if s],
        agent_env_values=agent_env,
        agent_kwarg_values=secret_kwargs,
        first_trial=every[0],
        unchecked=tuple(unchecked),
        resumed=previous is not None,
    )


def submitting_user() -> str:
    """The account that submits: its login name, else its uid (fair share's user)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return f"uid{os.getuid()}"


def _served_paths(
    opts: SubmitOptions, selection: Selection, env_file: EnvFile | None
) -> tuple[tuple[str, Path, str], ...]:
    """The paths a worker must serve for this job, with the kit field of roots that would serve each."""
    paths = [("--jobs-dir", opts.jobs_dir, "jobs_roots"), ("--path", selection.path, "selection_roots")]
    if env_file is not None:
        paths.append(("--env-file", env_file.path, "env_file_roots"))
    return tuple(paths)


# What every submit makes anew: a submit of an existing job name may differ in these and still continue it.
_NEW_PER_SUBMIT = frozenset({"job_id", "created_at", "agent_env_file", "agent_kwargs_file"})
# How a job runs, not what it measures: a submit that continues a job may change these (from then on).
_HOW_IT_RUNS = ("n_concurrent", "skip_pull", "weight", "placement")
# Inputs whose values a refusal names but never prints: they may hold what the submitter keeps private.
_PRIVATE = "--agent-env or secret --agent-kwarg values"
_UNPRINTED = ("env_file", _PRIVATE, "agent.env", "agent.agent_kwargs")
# The inputs a refusal names by their flag, where it is not the field's name.
_OPTIONS = {"max_cost_usd": "--max-cost", "local": "--local"}


def previous_job(job: JobSpec, agent_env: dict[str, str], secret_kwargs: dict[str, str]) -> JobSpec | None:
    """The job already submitted under `job`'s name, which this submit continues; None when the name is free.

    The same command again continues a job (a crash, Ctrl-C or a reboot in
    between): the selection's hash and every option must be those of the job,
    the --agent-env and secret --agent-kwarg values the same by hash. Raises
    JobConflictError naming the first input that differs.
    """
    existing = JobPaths(job.jobs_dir, job.job_name).job_spec
    if not existing.is_file():
        return None
    try:
        previous = JobSpec.model_validate_json(existing.read_bytes())
    except (OSError, ValueError):
        raise JobConflictError(f"--job-name {job.job_name}: {existing} exists but is unreadable") from None
    was = previous.model_dump(mode="json", exclude={*_NEW_PER_SUBMIT, *_HOW_IT_RUNS})
    now = job.model_dump(mode="json", exclude={*_NEW_PER_SUBMIT, *_HOW_IT_RUNS})
    kept = (previous.agent_env_file, previous.agent_kwargs_file)
    was[_PRIVATE] = [f.sha256 if f else None for f in kept]
    now[_PRIVATE] = [_private_sha256(v) if v else None for v in (agent_env, secret_kwargs)]
    if differs := _first_difference(was, now):
        raise JobConflictError(
            f"--job-name {job.job_name}: already used in {job.jobs_dir}, with {differs}; the same command "
            "continues that job, another job needs another name"
        )
    return previous.model_copy(update={name: getattr(job, name) for name in _HOW_IT_RUNS})


def _first_difference(was: object, now: object, path: str = "") -> str | None:
    """The first input that differs between two job specs as JSON, for one line: its path, and its values."""
    if isinstance(was, dict) and isinstance(now, dict):
        for key in sorted(set(was) | set(now), key=str):
            inner = f"{path}.{key}" if path else str(key)
            if found := _first_difference(was.get(key), now.get(key), inner):
                return found
        return None
    if was == now:
        return None
    name = (
        _OPTIONS.get(path, f"--{path.replace('_', '-')}")
        if path in {*RunOptions.model_fields, *_OPTIONS}
        else path
    )
    scalars = all(isinstance(v, str | int | float | bool | None) for v in (was, now))
    if not scalars or path.startswith(_UNPRINTED):
        return f"{name} different"
    return f"{name} {_short(was)} in the job, {_short(now)} here"


def _short(value: object) -> str:
    text = "none" if value is None else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_visibility_timeout(trials: list[TrialSpec], configured_sec: int) -> None:
    """Refuse a job whose longest trial could outlive the broker's visibility timeout.

    An unacknowledged message older than the timeout is delivered again, so
    a trial that runs longer would start a second time.
    """
    if not trials:
        return
    needed = required_visibility_timeout(max(trial.expected_sec for trial in trials))
    if needed > configured_sec:
        raise InputError(
            f"the longest trial may run {needed // 3600}h+; set SCIENCEBENCH_VISIBILITY_TIMEOUT="
            f"{needed} (seconds) on the login node and every worker"
        )


def persist(prepared: Prepared, record: RunRecord) -> Prepared:
    """Write what workers read (the job directory, job.json, the --agent-env file) and the run record.

    The job directory is created exclusively: of two submits of one name at
    once, exactly one gets it and the other exits 2. On any failure what was
    written is removed again (exit 2 writes nothing, secrets included).
    """
    with persisted(prepared, record) as done:
        return done


@contextmanager
def persisted(prepared: Prepared, record: RunRecord) -> Iterator[Prepared]:
    """`persist`, undone again if the block raises (e.g. the broker fails while trials are sent).

    Undoing removes the job directory, the --agent-env file and every
    directory created for them, and puts the previous run record back: the
    selection is as it was.
    """
    undo: list[Callable[[], None]] = []
    try:
        yield _write_job(prepared, record, undo)
    except BaseException:
        for step in reversed(undo):
            with suppress(OSError):
                step()
        raise


def _write_job(prepared: Prepared, record: RunRecord, undo: list[Callable[[], None]]) -> Prepared:
    if prepared.resumed:
        return _write_resumed(prepared, record, undo)
    job = prepared.job
    paths = JobPaths(job.jobs_dir, job.job_name)
    try:
        _make_dirs(job.jobs_dir, undo)
    except OSError as exc:
        raise InputError(f"--jobs-dir {job.jobs_dir}: cannot be created ({exc.strerror})") from None
    try:
        paths.job_dir.mkdir()
    except FileExistsError:
        raise JobConflictError(
            f"--job-name {job.job_name}: {paths.job_dir} exists (another submit took the name); "
            "choose another name"
        ) from None
    except OSError as exc:
        raise InputError(f"--jobs-dir {job.jobs_dir}: not writable ({exc.strerror})") from None
    undo.append(lambda: shutil.rmtree(paths.job_dir))
    run_record = SelectionPaths(prepared.selection.path).run_record
    step = "the --agent-env file"
    try:
        prepared = _write_agent_env_file(prepared, undo)
        step = str(paths.job_spec)
        write_atomic(paths.job_spec, prepared.job.model_dump_json(indent=2), mode=JOB_SPEC_MODE)
        step = str(run_record)
        undo.append(_restorer(run_record))
        write_run_record(prepared.selection.path, record, prepared.secret_values)
    except OSError as exc:
        raise InputError(f"cannot write {step} ({exc.strerror})") from None
    return prepared


def _write_resumed(prepared: Prepared, record: RunRecord, undo: list[Callable[[], None]]) -> Prepared:
    """A continued job: its job.json with how it runs updated, its private files back if they were deleted."""
    job = prepared.job
    paths = JobPaths(job.jobs_dir, job.job_name)
    step = "the --agent-env file"
    try:
        for kept, values in (
            (job.agent_env_file, prepared.agent_env_values),
            (job.agent_kwargs_file, prepared.agent_kwarg_values),
        ):
            if kept is not None and not kept.path.is_file():
                _write_private_json(prepared.selection.path, kept.path.name, values, undo)
        step = str(paths.job_spec)
        undo.append(_restorer(paths.job_spec))
        write_atomic(paths.job_spec, job.model_dump_json(indent=2), mode=JOB_SPEC_MODE)
        step = str(SelectionPaths(prepared.selection.path).run_record)
        undo.append(_restorer(SelectionPaths(prepared.selection.path).run_record))
        write_run_record(prepared.selection.path, record, prepared.secret_values)
    except OSError as exc:
        raise InputError(f"cannot write {step} ({exc.strerror})") from None
    return prepared


def _make_dirs(path: Path, undo: list[Callable[[], None]]) -> None:
    """`mkdir -p path`, the topmost directory it created removed on undo."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    if missing:
        top = missing[-1]
        undo.append(lambda: shutil.rmtree(top))


def _restorer(path: Path) -> Callable[[], None]:
    """Undo for overwriting `path`: its old bytes back, or no file if it had none."""
    old = path.read_bytes() if path.is_file() else None
    if old is None:
        return lambda: path.unlink(missing_ok=True)
    mode = path.stat().st_mode & 0o777
    return lambda: write_atomic(path, old, mode=mode)


def _write_agent_env_file(prepared: Prepared, undo: list[Callable[[], None]]) -> Prepared:
    """Store --agent-env values, and credential-looking --agent-kwarg values, for workers in private files.

    Values never ride in broker messages or job.json: the job spec names each
    file and its hash, as it does for --env-file. The files sit beside the
    selection, are named after the job's id, created exclusively and readable
    by their owner only.
    """
    job = prepared.job
    update: dict[str, EnvFile] = {}
    for attribute, name, values in (
        ("agent_env_file", agent_env_file_name(job), prepared.agent_env_values),
        ("agent_kwargs_file", agent_kwargs_file_name(job), prepared.agent_kwarg_values),
    ):
        if values:
            update[attribute] = _write_private_json(prepared.selection.path, name, values, undo)
    if not update:
        return prepared
    return replace(prepared, job=job.model_copy(update=update))


def _write_private_json(
    selection: Path, name: str, values: dict[str, str], undo: list[Callable[[], None]]
) -> EnvFile:
    """Write `values` as JSON to `<selection>/.sciencebench/secrets/<name>` (0600, exclusive).

    Returns the file's identity (path and SHA-256).
    """
    secrets_dir = SelectionPaths(selection).secrets_dir
    _make_dirs(secrets_dir, undo)
    os.chmod(secrets_dir, 0o700)
    path = secrets_dir / name
    text = _private_text(values)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    undo.append(lambda: path.unlink(missing_ok=True))
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return EnvFile(path=path, sha256=_private_sha256(values))


def _private_text(values: dict[str, str]) -> str:
    return json.dumps(values, sort_keys=True)


def _private_sha256(values: dict[str, str]) -> str:
    """The hash a job spec keeps of a private file's values (`EnvFile.sha256`)."""
    return hashlib.sha256(_private_text(values).encode()).hexdigest()


def write_job_spec(job: JobSpec) -> None:
    """Persist the JobSpec where workers, status, retry and summarize find it."""
    paths = JobPaths(job.jobs_dir, job.job_name)
    try:
        write_atomic(paths.job_spec, job.model_dump_json(indent=2), mode=JOB_SPEC_MODE)
    except OSError as exc:
        raise ProfileError(f"--jobs-dir {job.jobs_dir}: not writable ({exc.strerror})") from None
