"""task.toml -> a validated task specification.

Only what sciencebench needs is modelled; unknown keys are ignored, as Pier
0.3.0 ignores them (real tasks carry `network_mode`, `os`, ...). The agent and
verifier images must be pinned by digest so every worker host runs the same
bytes. The task's files, env tables and compose files must also pass the
policy of `core.taskreview.review_task` (no symlinks, no env key that
steers the harness, compose files within the allowlist); the worker checks
the same again before Pier starts.
"""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sciencebench.core.capacity import DEFAULT_CPUS, DEFAULT_MEMORY_MB, Request, trial_request
from sciencebench.core.errors import TaskSpecError
from sciencebench.core.images import ImageRef
from sciencebench.core.taskdir import (
    DEFINING_FILES,
    TaskScan,
    scan_task_dir,
    scanned_sha256,
    task_toml_sha256,
)
from sciencebench.core.taskreview import review_task


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class EnvironmentSection(_Section):
    """`[environment]` (and `[verifier.environment]`)."""

    docker_image: ImageRef
    env: dict[str, str] = Field(default_factory=dict)
    build_timeout_sec: float = Field(default=600.0, gt=0)
    cpus: int | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    storage_mb: int | None = Field(default=None, gt=0)
    allow_internet: bool = True
    workdir: str | None = None


class AgentSection(_Section):
    """`[agent]`."""

    timeout_sec: float | None = Field(default=None, gt=0)


class VerifierSection(_Section):
    """`[verifier]`."""

    timeout_sec: float = Field(default=600.0, gt=0)
    environment_mode: Literal["shared", "separate"] | None = None
    environment: EnvironmentSection | None = None


class TaskToml(_Section):
    """The parts of Pier's TaskConfig that sciencebench relies on."""

    environment: EnvironmentSection
    agent: AgentSection = AgentSection()
    verifier: VerifierSection = VerifierSection()


# Pier's default agent timeout when a task.toml names none.
DEFAULT_AGENT_TIMEOUT_SEC = 3600.0


class TaskSpec(BaseModel):
    """One validated task of a selection."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    directory: Path
    agent_image: ImageRef
    verifier_image: ImageRef | None
    verifier_mode: Literal["shared", "separate"]
    agent_timeout_sec: float
    verifier_timeout_sec: float
    build_timeout_sec: float
    cpus: int | None
    memory_mb: int | None
    # What a trial of it holds of a host while it runs (agent and separate verifier: `core.capacity`).
    request: Request = Request(cpus=DEFAULT_CPUS, memory_mb=DEFAULT_MEMORY_MB)
    allow_internet: bool
    # Variables the task's files take from the worker's environment: `${VAR}`
    # templates of its env tables, and compose variables beyond Pier's own.
    template_variables: frozenset[str] = frozenset()
    compose_variables: frozenset[str] = frozenset()
    task_hash: str = ""

    @property
    def name(self) -> str:
        """The task directory name, e.g. `task_002`."""
        return self.directory.name

    @property
    def image_refs(self) -> list[str]:
        """The agent image, then the verifier image when there is one."""
        return [self.agent_image] + ([self.verifier_image] if self.verifier_image else [])


def _required_files(task_dir: Path, scan: TaskScan | None) -> list[str]:
    """What Pier needs to accept a task directory, plus the patch hook we need.

    Each must be a regular file: a pipe or a device would hang or mislead the reader.
    """
    if scan is None:

        def is_file(relative: str) -> bool:
            return (task_dir / relative).is_file()
    else:  # a scan exists only when the defining files are regular

        def is_file(relative: str) -> bool:
            return relative in DEFINING_FILES or relative in scan.files

    missing = []
    if not is_file("instruction.md"):
        missing.append("instruction.md")
    if not (is_file("environment/Dockerfile") or is_file("environment/docker-compose.yaml")):
        missing.append("environment/Dockerfile (or environment/docker-compose.yaml)")
    if not is_file("tests/test.sh"):
        missing.append("tests/test.sh")
    if not is_file("pre_artifacts.sh"):
        missing.append("pre_artifacts.sh (rerun materialize.py with the current tools to regenerate it)")
    return missing


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"])
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _read_regular(path: Path, scanned: bytes | None = None) -> str:
    """A regular file's text; TaskSpecError for anything else (pipes hang readers) or unreadable.

    `scanned`: the file's bytes as `scan_task_dir` read them (it reads regular files only).
    """
    try:
        if scanned is not None:
            # As `read_text` decodes: strict UTF-8, universal newlines.
            text = scanned.decode("utf-8")
            return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text
        if not stat.S_ISREG(path.stat().st_mode):
            raise TaskSpecError(f"{path}: not a regular file")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskSpecError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc.__class__.__name__
        raise TaskSpecError(f"{path}: unreadable ({reason})") from None


def load_task(task_dir: Path, task_id: str, resolved: Path | None = None) -> TaskSpec:
    """Read and validate `<task_dir>/task.toml` and the files around it.

    `resolved`: `task_dir.resolve()` when the caller knows it. An ordinary
    task directory is read in one pass (`core.taskdir.scan_task_dir`): each
    file once, its hash from the same bytes; an unusual one path by path.
    Both make the same checks, in the same order, with the same results.
    Raises TaskSpecError naming the file and the first problem found.
    """
    scan = scan_task_dir(task_dir)
    scanned = dict(zip(DEFINING_FILES, scan.defining, strict=True)) if scan else {}
    toml_path = task_dir / "task.toml"
    text = _read_regular(toml_path, scanned.get("task.toml"))
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TaskSpecError(f"{toml_path}: malformed TOML ({exc})") from None
    except RecursionError:  # tomllib recurses once per nesting level of arrays and inline tables
        raise TaskSpecError(f"{toml_path}: malformed TOML (nested too deeply)") from None
    try:
        parsed = TaskToml.model_validate(raw)
    except ValidationError as exc:
        raise TaskSpecError(f"{toml_path}: {_first_error(exc)}") from None

    try:
        review = review_task(task_dir, raw, scan)
    except OSError as exc:
        raise TaskSpecError(f"task {task_id} ({task_dir}): unreadable ({exc.strerror})") from None
    if review.problems:
        raise TaskSpecError(f"task {task_id} ({task_dir}): {review.problems[0]}")
    missing = _required_files(task_dir, scan)
    if missing:
        raise TaskSpecError(f"task {task_id} ({task_dir}): missing {missing[0]}")
    for name in DEFINING_FILES[1:]:
        _read_regular(task_dir / name, scanned.get(name))  # readable, before anything hashes it
    try:
        # The worker recomputes `task_toml_sha256` from the files; a scan hashes the same bytes.
        task_hash = task_toml_sha256(task_dir) if scan is None else scanned_sha256(scan)
    except OSError as exc:
        raise TaskSpecError(f"task {task_id} ({task_dir}): unreadable ({exc.strerror})") from None

    verifier_env = parsed.verifier.environment
    if parsed.verifier.environment_mode == "shared" and verifier_env is not None:
        raise TaskSpecError(
            f"{toml_path}: verifier.environment_mode 'shared' conflicts with [verifier.environment]"
        )
    mode = parsed.verifier.environment_mode or ("separate" if verifier_env else "shared")
    allow_internet = parsed.environment.allow_internet or bool(verifier_env and verifier_env.allow_internet)
    if allow_internet:
        raise TaskSpecError(
            f"{toml_path}: allow_internet = true is refused; the offline network policy "
            "requires allow_internet = false for the agent and verifier environments"
        )
    return TaskSpec(
        task_id=task_id,
        directory=resolved or task_dir.resolve(),
        agent_image=parsed.environment.docker_image,
        verifier_image=verifier_env.docker_image if verifier_env else None,
        verifier_mode=mode,
        agent_timeout_sec=parsed.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT_SEC,
        verifier_timeout_sec=parsed.verifier.timeout_sec,
        build_timeout_sec=parsed.environment.build_timeout_sec,
        cpus=parsed.environment.cpus,
        memory_mb=parsed.environment.memory_mb,
        request=trial_request(
            (parsed.environment.cpus, parsed.environment.memory_mb),
            (verifier_env.cpus, verifier_env.memory_mb) if verifier_env and mode == "separate" else None,
        ),
        allow_internet=allow_internet,
        template_variables=review.template_variables,
        compose_variables=review.compose_variables,
        task_hash=task_hash,
    )
