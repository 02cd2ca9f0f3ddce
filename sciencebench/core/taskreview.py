"""A whole task against the policy (pure): its files, its task.toml, and the compose files in it.

Compose files are checked by the allowlist (`core.compose_policy`); around
them a compose project directory may not hold a `.env` file, and nothing in
a task may be a symlink or a special file. No artifact path may hold `..`,
a step name must be one plain name, and every user a task.toml names must
be one plain user name or a `uid[:gid]` (Pier writes the agent's into its
online agent-install Dockerfile as `USER <user>`, the one build that keeps
the network). Env table keys that would steer the harness are refused, and
the variables the task needs from the job are listed (`review_task`).
"""

from __future__ import annotations

import errno
import os
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from sciencebench.core.compose_policy import compose_problems, one_line
from sciencebench.core.envfile import PIER_COMPOSE_VARIABLES, harness_key_problem
from sciencebench.core.interpolation import interpolation, strings
from sciencebench.core.taskdir import TaskScan, compose_paths, read_regular


class _ComposeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error.

    PyYAML keeps the last value where compose refuses the file; merged keys
    (`<<`) may still be overridden once.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key_node.value[:40]!r} given twice", key_node.start_mark
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


@dataclass(frozen=True)
class TaskReview:
    """What checking a task's files found: refusals (first one first) and the variables it needs.

    `template_variables`: `${VAR}` templates of its env tables; `compose_variables`:
    variables its compose files take beyond Pier's and the task's own env. Both
    must come from the job's env file or `--agent-env`.
    """

    problems: tuple[str, ...]
    template_variables: frozenset[str] = frozenset()
    compose_variables: frozenset[str] = frozenset()


# Pier's env templates: the whole value is `${VAR}` or `${VAR:-default}`.
_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")


def _env_tables(raw: Any, where: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every `env` table of a task.toml (`[environment].env`, `[verifier].env`, steps, ...)."""
    if isinstance(raw, str | int | float):
        return  # most values: answered before the slower Mapping check
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            here = f"{where}.{key}" if where else str(key)
            if key == "env" and isinstance(value, Mapping):
                yield here, value
            else:
                yield from _env_tables(value, here)
    elif isinstance(raw, list):
        for position, item in enumerate(raw):
            yield from _env_tables(item, f"{where}[{position}]")


def template_variables(raw: Any) -> set[str]:
    """`VAR` of every `${VAR}` / `${VAR:-default}` value of an `env` table anywhere in a task.toml."""
    return _template_names(_env_tables(raw))


def _template_names(tables: Iterable[tuple[str, Mapping[str, Any]]]) -> set[str]:
    return {
        match.group(1)
        for _, table in tables
        for value in table.values()
        if isinstance(value, str) and (match := _TEMPLATE.fullmatch(value))
    }


def _env_key_problems(tables: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Env table keys that would steer the harness (their values are never named)."""
    return [
        f"task.toml {where}: refused: {problem}"
        for where, table in tables
        for key in table
        if (problem := harness_key_problem(str(key)))
    ]


def _tree_problems(task_dir: Path) -> Iterator[str]:
    """Every entry of the task, at any depth, that is not a plain file or directory of its own.

    Pier copies `environment/` into an agent build context with symlinks
    followed (`shutil.copytree`) and hands `tests/` and `solution/` to the
    container, all as the worker's user: a symlink anywhere (to a worker's
    file, or to `/etc`), a FIFO or a device would bring the worker's files or
    a hang into the trial. Hard links are left alone: the kernel's
    protected_hardlinks lets a submitter link only files they own, whose
    bytes they could copy into the task anyway.
    Directories are walked without following symlinks.
    """
    root = os.fspath(task_dir)
    pending = [root]
    while pending:
        with os.scandir(pending.pop()) as entries:
            found = sorted(entries, key=lambda entry: entry.name)
        # The listing's entry types answer without a stat of each entry (one where the file system
        # does not report types); the relative name is made only for a problem.
        for entry in found:
            if entry.is_symlink():
                yield f"{entry.path[len(root) + 1 :]} is a symlink; a task's files must be inside it"
            elif entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            elif not entry.is_file(follow_symlinks=False):
                yield f"{entry.path[len(root) + 1 :]} is not a regular file or directory"


def _task_and_steps(raw: Any) -> list[tuple[str, Any]]:
    """The task.toml table and each of its steps, with the prefix that names them in a message."""
    if not isinstance(raw, Mapping):
        return []
    steps = raw.get("steps")
    numbered = enumerate(steps if isinstance(steps, list) else [])
    return [("", raw), *((f"steps[{i}].", step) for i, step in numbered)]


def _artifact_problems(raw: Any) -> list[str]:
    """Artifacts Pier would write outside the trial's artifacts directory on the worker.

    Pier downloads each one to `<trial>/artifacts/<destination>`, the
    destination defaulting to the source's last name, with `..` kept; so
    neither may hold a `..` part. Applies to the task's and each step's list.
    """
    problems: list[str] = []
    for prefix, owner in _task_and_steps(raw):
        artifacts = owner.get("artifacts") if isinstance(owner, Mapping) else None
        for position, artifact in enumerate(artifacts if isinstance(artifacts, list) else []):
            entry = artifact if isinstance(artifact, Mapping) else {"source": artifact}
            paths = [entry.get("source"), *([entry["destination"]] if "destination" in entry else [])]
            if not all(isinstance(path, str) and ".." not in PurePosixPath(path).parts for path in paths):
                problems.append(f"task.toml {prefix}artifacts[{position}]: a path with '..' or not a string")
    return problems


_STEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _step_problems(raw: Any) -> list[str]:
    """Step names that are not one plain name.

    Pier joins a step's name onto the task's `steps/` (the tests, solution
    and instruction it reads and uploads) and onto the trial's `steps/`
    (where it moves what the containers wrote), unchecked: `../x` or `/x`
    would reach another job's directories.
    """
    steps = raw.get("steps") if isinstance(raw, Mapping) else None
    return [
        f"task.toml steps[{position}].name: not one plain name (letters, digits, '.', '_', '-')"
        for position, step in enumerate(steps if isinstance(steps, list) else [])
        if not (
            isinstance(step, Mapping)
            and isinstance(name := step.get("name"), str)
            and _STEP_NAME.fullmatch(name)
            and ".." not in name
        )
    ]


# A plain user name (as useradd accepts by default) or a numeric uid, optionally with a gid.
TASK_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}|[0-9]{1,10}(:[0-9]{1,10})?")


def task_user_problem(where: str, user: object) -> str | None:
    """Why `user` (a task.toml user field, at `where`) is refused, or None for a plain name, uid or absent.

    Pier puts the agent's user into a Dockerfile line (`USER <user>`) and onto
    `docker exec --user`: anything but a plain name or `uid[:gid]` (a newline,
    a space, a `$`) could add an instruction or an option.
    """
    if user is None:
        return None
    if isinstance(user, int) and not isinstance(user, bool) and 0 <= user < 2**32:
        return None
    if isinstance(user, str) and TASK_USER.fullmatch(user):
        return None
    return f"task.toml {where}: not a plain user name or uid[:gid]"


def _user_problems(raw: Any) -> list[str]:
    """The user fields of task.toml (the task's and each step's agent and verifier) that are refused."""
    problems: list[str] = []
    for prefix, owner in _task_and_steps(raw):
        for section in ("agent", "verifier"):
            table = owner.get(section) if isinstance(owner, Mapping) else None
            if isinstance(table, Mapping) and (
                problem := task_user_problem(f"{prefix}{section}.user", table.get("user"))
            ):
                problems.append(problem)
    return problems


def _entry_problems(task_dir: Path) -> list[str]:
    """Symlinks and special files anywhere in a task, and `.env` files compose would read."""
    problems = list(_tree_problems(task_dir))
    # The compose project directories Pier uses (a step's tests directory is one too).
    project_dirs = [task_dir / "environment", task_dir / "tests", *sorted(task_dir.glob("steps/*/tests"))]
    for directory in project_dirs:
        relative = directory.relative_to(task_dir)
        if directory.is_symlink() or directory.parent.is_symlink():
            problems.append(f"{relative} is (inside) a symlink; a task's files must be inside it")
        elif os.path.lexists(directory / ".env"):
            problems.append(f"{relative / '.env'}: compose would read it for interpolation; refused")
    return [one_line(problem) for problem in problems]


def _scanned_entry_problems(task_dir: Path, scan: TaskScan) -> list[str]:
    """`_entry_problems` of a scanned task.

    The scan exists only when no entry it looked at is a symlink or special:
    what is left are the deeper entries and the `.env` files it found.
    """
    problems = list(_tree_problems(task_dir))
    problems += [f"{where}/.env: compose would read it for interpolation; refused" for where in scan.dotenv]
    return [one_line(problem) for problem in problems]


def _read_compose(path: Path) -> bytes | OSError:
    """A compose file's bytes, or why it is refused (a symlink, not a regular file); other OSErrors raise."""
    try:
        return read_regular(path)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EINVAL):
            raise
        return exc


def _own_env(raw: Any) -> set[str]:
    """The env keys every environment of the task sets itself (its compose processes get them from there).

    The agent's `[environment]`, and each `[verifier.environment]` and
    `[steps.verifier.environment]` a separate verifier runs in instead: a
    name only one of them sets comes, in the others, from Pier's own
    environment, so it must be declared like any other.
    """
    if not isinstance(raw, Mapping):
        return set()

    def env_of(table: Any) -> set[str]:
        env = table.get("env") if isinstance(table, Mapping) else None
        return {str(key) for key in env} if isinstance(env, Mapping) else set()

    def verifier_environment(owner: Any) -> Any:
        verifier = owner.get("verifier") if isinstance(owner, Mapping) else None
        return verifier.get("environment") if isinstance(verifier, Mapping) else None

    steps = raw.get("steps")
    owners = [raw, *(steps if isinstance(steps, list) else [])]
    tables = [raw.get("environment"), *(t for t in map(verifier_environment, owners) if t is not None)]
    return set.intersection(*(env_of(table) for table in tables))


def review_task(task_dir: Path, raw: Mapping[str, Any], scan: TaskScan | None = None) -> TaskReview:
    """Check a task directory and its parsed task.toml `raw` against the policy.

    The task directory is the one given (never derived from a symlink's
    target); bind mounts may come only from inside it. `scan`: the task
    directory as `core.taskdir.scan_task_dir` found it, used instead of
    looking at each path again. Raises OSError when a file cannot be read.
    """
    entries = _entry_problems(task_dir) if scan is None else _scanned_entry_problems(task_dir, scan)
    tables = list(_env_tables(raw))
    problems = entries + _env_key_problems(tables) + _artifact_problems(raw) + _step_problems(raw)
    problems += _user_problems(raw)
    own_env = _own_env(raw)
    if scan is None:
        files = [(path, _read_compose(path)) for path in compose_paths(task_dir)]
    else:
        files = [(task_dir / relative, data) for relative, data in scan.compose]
    needed: set[str] = set()
    for path, data in files:
        relative = path.relative_to(task_dir)
        if isinstance(data, OSError):
            problems.append(f"{relative}: {data.strerror}")
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"{relative}: not UTF-8 text")
            continue
        try:
            compose = yaml.load(text, Loader=_ComposeLoader) or {}  # noqa: S506 (a SafeLoader)
        except (yaml.YAMLError, RecursionError):
            problems.append(f"{relative}: not valid YAML")
            continue
        found = compose_problems(compose, path.parent, [task_dir])
        problems += [f"{relative}: refused by the network policy: {problem}" for problem in found]
        if not found:
            # The policy environment gives compose every name the file's text interpolates,
            # comments and mapping keys included (a bare `environment: [NAME]` copies it).
            names = set().union(interpolation(text)[0], *(interpolation(s)[0] for s in strings(compose)))
            needed |= names - PIER_COMPOSE_VARIABLES - own_env
    return TaskReview(
        problems=tuple(problems),
        template_variables=frozenset(_template_names(tables)),
        compose_variables=frozenset(needed),
    )


def review_task_dir(task_dir: Path) -> TaskReview:
    """`review_task` of a task directory, reading its task.toml.

    Raises OSError when a file cannot be read (a symlinked or special
    task.toml included), ValueError when task.toml is not TOML.
    """
    raw = tomllib.loads(read_regular(task_dir / "task.toml").decode("utf-8"))
    return review_task(task_dir, raw)
