"""What a task may ask of Docker through its compose files and env tables (pure): an allowlist.

A task directory may hold compose files (`core.taskdir.COMPOSE_FILES`: the
agent environment's, the separate verifier's, a step's) that Pier merges
into the trial's `docker compose` project, and env tables whose keys reach
the environment of Pier's `docker compose`. Docker runs them with the worker
host's privileges, so everything is checked against an allowlist:

- statically at submit (`review_task`, exit 2) and again on the worker
  before Pier starts (`review_task_dir`), on the YAML as written;
- by the network policy environment, on the model `docker compose config`
  renders from Pier's exact file list and environment, before each
  command that builds, creates or starts anything (`compose_problems(rendered=True)`).

What passes: one service, `main` (the inspection after start accepts no
other container), with the keys below; top-level `services`, `volumes`
(plain named volumes) and `x-*` extensions. Everything else is refused:
`extends`, `include`, `env_file`, `volumes_from`, `secrets`, `configs`,
networks, devices, capabilities, namespaces other than `private`,
`cgroup_parent`, `gpus`, build secrets/ssh/network or a context outside the
compose file's directory (rendered, a build's network must be `none`: the
policy's override sets it), bind mounts outside the task (and, rendered, the
trial) directory, a writable bind mount of the task's (`read_only: true` or
`:ro` is required), unpinned images. Compose interpolation (`$VAR`, `${VAR}`,
`${VAR:-default}`, `${VAR:?error}`) may appear only in `command`,
`entrypoint`, `environment`, `working_dir` and `healthcheck`; nested
defaults and the alternative-value forms (`${VAR:+x}`, `${VAR+x}`) are
refused everywhere. A compose project directory may not hold a `.env` file
(compose would read it for interpolation), and nothing in a task may be a
symlink or a special file, at any depth.
No task.toml artifact path may hold `..`, and a step name must be one plain name
(Pier joins both onto paths on the worker). Every user a task.toml names (`[agent]`,
`[verifier]`, a step's `agent` and `verifier`) must be one plain user name or a
`uid[:gid]`: Pier writes the agent's into its online agent-install Dockerfile as
`USER <user>`, the one build that keeps the network.
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

from sciencebench.core.envfile import PIER_COMPOSE_VARIABLES, harness_key_problem
from sciencebench.core.images import check_image_ref
from sciencebench.core.taskdir import TaskScan, compose_paths, read_regular

AGENT_SERVICE = "main"
# Bounds on what a compose file may make the checker walk (YAML aliases can multiply it).
_MAX_NODES = 50_000
_MAX_DEPTH = 64

# --- interpolation ---------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BRACED_OPERATORS = (":-", "-", ":?", "?")


def interpolation(text: str) -> tuple[set[str], list[str]]:
    """The variables compose would substitute in `text`, and what about it is refused.

    `$$` is a literal `$`. Accepted forms: `$VAR`, `${VAR}`, `${VAR:-default}`,
    `${VAR-default}`, `${VAR:?error}`, `${VAR?error}`, with no `$` or `{` in
    the default or error text. Refused: nested expressions (`${A:-${B}}`),
    the alternative-value forms (`${A:+x}`, `${A+x}`), anything malformed.
    """
    names: set[str] = set()
    problems: list[str] = []
    i = text.find("$")
    while i != -1:
        after = text[i + 1 : i + 2]
        if after == "$":
            i = text.find("$", i + 2)
            continue
        if after == "{":
            end = text.find("}", i + 2)
            if end == -1:
                problems.append("an unterminated '${'")
                break
            body = text[i + 2 : end]
            match = _NAME.match(body)
            rest = body[match.end() :] if match else body
            if match is None:
                problems.append(f"'${{{body[:40]}}}' does not name a variable")
            elif "$" in rest or "{" in rest:
                problems.append(f"a nested expression in '${{{match.group()}...}}'")
            elif rest.startswith((":+", "+")):
                form = ":+" if rest.startswith(":+") else "+"
                problems.append(f"the alternative-value form '${{{match.group()}{form}...}}'")
            elif rest and not rest.startswith(_BRACED_OPERATORS):
                problems.append(f"'${{{body[:40]}}}' is not a compose expression")
            else:
                names.add(match.group())
            i = text.find("$", end + 1)
            continue
        match = _NAME.match(text, i + 1)
        if match is None:
            problems.append("a lone '$' (write '$$' for a literal dollar sign)")
            i = text.find("$", i + 1)
        else:
            names.add(match.group())
            i = text.find("$", match.end())
    return names, problems


def _strings(node: Any) -> Iterator[str]:
    """Every string value under `node` (mapping keys are not interpolated), within the bounds."""
    stack: list[tuple[Any, int]] = [(node, 0)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > _MAX_NODES or depth > _MAX_DEPTH:
            raise ValueError("the compose file is too large or nested too deeply")
        if isinstance(value, str):
            yield value
        elif isinstance(value, Mapping):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)


# --- the allowlist ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    """Where a compose model comes from, and what its paths may point at."""

    project_dir: Path  # the compose file's directory (Pier's --project-directory)
    roots: tuple[Path, ...]  # where bind mount sources may lie
    writable: tuple[Path, ...]  # where they may be mounted read-write (rendered: the trial's directory)
    rendered: bool  # the output of `docker compose config`, not a file as written
    project: str | None  # the compose project name (rendered only)


# Keys whose values may interpolate variables; everything else must be literal.
_MAY_INTERPOLATE = frozenset({"command", "entrypoint", "environment", "working_dir", "healthcheck"})
# Keys whose value is not checked beyond interpolation: they shape the container's own process.
_FREE_KEYS = frozenset({
    "command", "entrypoint", "environment", "working_dir", "healthcheck", "user", "hostname",
    "stop_signal", "stop_grace_period", "init", "tty", "stdin_open", "read_only", "shm_size",
    "mem_limit", "mem_reservation", "memswap_limit", "cpus", "cpu_shares", "pids_limit", "platform",
    "expose", "restart", "tmpfs", "cap_drop",
})  # fmt: skip
_NAMESPACE_KEYS = frozenset({"pid", "ipc", "uts", "userns_mode", "cgroup"})
_PULL_POLICIES = frozenset({"build", "missing", "never", "if_not_present"})
_BUILD_KEYS = frozenset({"context", "dockerfile", "args", "target", "labels"})
# Contexts compose treats as remote without a scheme (compose-go `isRemoteContext`); `:` covers the rest.
_REMOTE_CONTEXT_PREFIXES = ("github.com/", "git@")
_VOLUME_KEYS = frozenset({"type", "source", "target", "read_only", "bind", "volume", "tmpfs", "consistency"})
_VOLUME_OPTIONS = {"bind": frozenset({"create_host_path"}), "volume": frozenset({"nocopy", "subpath"}),
                   "tmpfs": frozenset({"size", "mode"})}  # fmt: skip
_RESOURCE_KEYS = frozenset({"cpus", "memory", "pids"})
_RESERVED_LABELS = ("com.docker.", "org.sciencebench.")
_VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_NO_NEW_PRIVILEGES = frozenset({"no-new-privileges", "no-new-privileges:true", "no-new-privileges=true"})


def _inside(source: str, ctx: _Context, roots: Iterable[Path] | None = None) -> bool:
    """Whether a bind source lies under one of the roots (symlinks resolved as they are now)."""
    if source.startswith("~") or ".." in PurePosixPath(source).parts or ":" in source or "\\" in source:
        return False  # `~`, `..`, and Windows paths, which compose keeps as written
    path = PurePosixPath(source)
    candidate = Path(path if path.is_absolute() else ctx.project_dir / path).resolve()
    return any(candidate.is_relative_to(root.resolve()) for root in (ctx.roots if roots is None else roots))


def _volume_problems(where: str, volume: Any, ctx: _Context) -> list[str]:
    if isinstance(volume, str):
        source, sep, rest = volume.partition(":")
        if not sep:
            return []  # an anonymous volume at a container path
        _, _, mode = rest.partition(":")
        if mode and mode not in ("ro", "rw"):
            return [f"{where}: volume mode {mode!r} (only ro or rw)"]
        # compose makes a Windows path (`c:...`, a UNC `\\host\...`) a bind too; a volume is a name.
        is_bind = not _VOLUME_NAME.fullmatch(source)
        volume = {"type": "bind" if is_bind else "volume", "source": source, "read_only": mode == "ro"}
    if not isinstance(volume, Mapping):
        return [f"{where}: a volume must be a string or a mapping"]
    problems = [f"{where}: volume key {key!r}" for key in volume if key not in _VOLUME_KEYS]
    kind = volume.get("type", "volume")
    if kind not in _VOLUME_OPTIONS:
        return [*problems, f"{where}: volume type {kind!r} (only bind, volume, tmpfs)"]
    for option_key, allowed in _VOLUME_OPTIONS.items():
        options = volume.get(option_key) or {}
        if not isinstance(options, Mapping) or (option_key != kind and options):
            problems.append(f"{where}: volume {option_key} options")
        elif unknown := sorted(set(options) - allowed):
            problems.append(f"{where}: volume {option_key} option {unknown[0]!r}")
    source = str(volume.get("source") or "")
    if kind == "bind" and not _inside(source, ctx):
        problems.append(f"{where}: bind mount of {source!r} outside the task directory")
    elif kind == "bind" and volume.get("read_only") is not True and not _inside(source, ctx, ctx.writable):
        # A container may not change the task (the selection's, or the worker's copy of it).
        problems.append(
            f"{where}: bind mount of {source!r} is writable; mark it read-only "
            "('read_only: true', or ':ro' in the short syntax)"
        )
    return problems


def _build_problems(where: str, build: Any, ctx: _Context) -> list[str]:
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, Mapping):
        return [f"{where}: build must be a path or a mapping"]
    # Rendered, the policy's override has given the build `network: none` (a task may set no network).
    allowed_keys = _BUILD_KEYS | {"network"} if ctx.rendered else _BUILD_KEYS
    problems = [f"{where}: build key {key!r}" for key in build if key not in allowed_keys]
    if ctx.rendered and (network := build.get("network")) != "none":
        problems.append(
            f"{where}: build network {network or 'default'!r} (every build runs with network none)"
        )
    raw_context = str(build.get("context", "."))
    if ":" in raw_context or raw_context.startswith(_REMOTE_CONTEXT_PREFIXES):
        # Compose passes a URL, a Git reference, `docker-image://` or `service:` on untouched;
        # the Engine's builder would fetch it with the host's network.
        return [*problems, f"{where}: build context {raw_context!r} is not a local directory"]
    context = PurePosixPath(raw_context)
    resolved = Path(context if context.is_absolute() else ctx.project_dir / context).resolve()
    # Rendered, Pier's own agent build context lives in the trial directory.
    allowed = (ctx.project_dir, *ctx.roots) if ctx.rendered else (ctx.project_dir,)
    if ".." in context.parts or not any(resolved.is_relative_to(a.resolve()) for a in allowed):
        problems.append(f"{where}: build context {str(context)!r} outside the compose file's directory")
    dockerfile = PurePosixPath(str(build.get("dockerfile", "Dockerfile")))
    if dockerfile.is_absolute() or ".." in dockerfile.parts:
        problems.append(f"{where}: dockerfile {str(dockerfile)!r} outside the build context")
    return problems


def _deploy_problems(where: str, deploy: Any, ctx: _Context) -> list[str]:
    if not isinstance(deploy, Mapping):
        return [f"{where}: deploy must be a mapping"]
    # Rendered, compose adds an empty placement.
    empty_placement = ctx.rendered and not deploy.get("placement")
    extra = [k for k in deploy if k != "resources" and not (k == "placement" and empty_placement)]
    problems = [f"{where}: deploy key {key!r} (only resources)" for key in extra]
    resources = deploy.get("resources") or {}
    if not isinstance(resources, Mapping):
        return [*problems, f"{where}: deploy.resources must be a mapping"]
    for kind, values in resources.items():
        if kind not in ("limits", "reservations") or not isinstance(values, Mapping):
            problems.append(f"{where}: deploy.resources.{kind}")
            continue
        problems += [f"{where}: deploy.resources.{kind}.{key}" for key in values if key not in _RESOURCE_KEYS]
    return problems


def _labels_problems(where: str, labels: Any, ctx: _Context) -> list[str]:
    if ctx.rendered:
        return []  # the policy's own labels are in the rendered model
    keys = list(labels) if isinstance(labels, Mapping) else [str(item).split("=", 1)[0] for item in labels]
    return [f"{where}: label {key!r} is reserved" for key in keys if str(key).startswith(_RESERVED_LABELS)]


def _image_problems(where: str, image: Any, service: Mapping[str, Any], ctx: _Context) -> list[str]:
    if not ctx.rendered and "build" in service:
        return [f"{where}: image and build together (the image would be rebuilt under another's name)"]
    try:
        check_image_ref(str(image))
    except ValueError as exc:
        return [f"{where}: {exc}"]
    return []


def _service_problems(name: str, service: Any, ctx: _Context) -> list[str]:
    where = f"service {name}"
    if name != AGENT_SERVICE:
        return [f"{where}: only {AGENT_SERVICE!r} may be configured (the policy runs one container)"]
    if service is None:
        return []
    if not isinstance(service, Mapping):
        return [f"{where}: expected a mapping"]
    problems: list[str] = []
    for key, value in service.items():
        key = str(key)
        if key.startswith("x-") or key in _FREE_KEYS:
            continue
        if ctx.rendered and value is None:
            continue  # compose writes `command: null`, `networks: null`, ...
        if key == "image":
            problems += _image_problems(where, value, service, ctx)
        elif key == "build":
            problems += _build_problems(where, value, ctx)
        elif key == "volumes":
            if not isinstance(value, list):
                problems.append(f"{where}: volumes must be a list")
            else:
                problems += [p for v in value for p in _volume_problems(where, v, ctx)]
        elif key == "deploy":
            problems += _deploy_problems(where, value, ctx)
        elif key == "labels":
            problems += _labels_problems(where, value, ctx)
        elif key in _NAMESPACE_KEYS:
            if str(value) != "private":
                problems.append(f"{where}: {key}: {value!r} (only private namespaces)")
        elif key == "network_mode":
            if value != "none":
                problems.append(f"{where}: network_mode {value!r} (the network policy decides)")
        elif key == "networks" and ctx.rendered:
            if value:  # with network_mode none compose still lists the default network
                problems += [f"{where}: network {n!r}" for n in value if n != "default"]
        elif key == "privileged":
            if value is not False:
                problems.append(f"{where}: privileged")
        elif key == "pull_policy":
            if value not in _PULL_POLICIES:
                problems.append(f"{where}: pull_policy {value!r}")
        elif key == "security_opt":
            options = value if isinstance(value, list) else [value]
            problems += [f"{where}: security_opt {o!r}" for o in options if str(o) not in _NO_NEW_PRIVILEGES]
        else:
            problems.append(f"{where}: {key!r} is not allowed")
    return problems


def _top_level_problems(compose: Mapping[str, Any], ctx: _Context) -> list[str]:
    problems: list[str] = []
    for key, value in compose.items():
        key = str(key)
        if key in ("services", "version") or key.startswith("x-"):
            continue
        if key == "name" and ctx.rendered and value == ctx.project:
            continue
        if key == "volumes" and isinstance(value, Mapping):
            for name, volume in value.items():
                expected = {"name": f"{ctx.project}_{name}"} if ctx.rendered else {}
                if not isinstance(volume, Mapping | None):
                    problems.append(f"volume {name!r}: expected a mapping")
                    continue
                options = (volume or {}).items()
                extra = sorted(str(k) for k, v in options if k != "labels" and expected.get(k) != v)
                if extra:
                    problems.append(f"volume {name!r}: {extra[0]!r} is not allowed (plain volumes only)")
            continue
        if key == "networks" and ctx.rendered and isinstance(value, Mapping):
            expected_default = {"name": f"{ctx.project}_default", "ipam": {}}
            if all(n == "default" and (v or {}) == expected_default for n, v in value.items()):
                continue
        problems.append(f"top-level {key!r} is not allowed")
    return problems


def compose_problems(
    compose: Any,
    project_dir: Path,
    roots: Iterable[Path],
    *,
    rendered: bool = False,
    project: str | None = None,
    writable_roots: Iterable[Path] = (),
) -> list[str]:
    """Every refused request of one compose model; empty when it may run.

    `project_dir` is the directory relative paths resolve against (the
    compose file's own, Pier's project directory); bind sources must lie
    under `roots`, and be read-only unless they lie under `writable_roots`
    (rendered: the trial directory, where Pier's log mounts come from; a
    task's own binds are read-only). `rendered`: `compose` is what `docker
    compose config --format json` printed for project `project` (paths
    absolute, variables substituted), not a file as written. Never raises
    on malformed input.
    """
    if not isinstance(compose, Mapping):
        return ["not a compose file (expected a mapping)"]
    ctx = _Context(project_dir.resolve(), tuple(roots), tuple(writable_roots), rendered, project)
    problems: list[str] = []
    if not rendered:
        problems += _interpolation_problems(compose)
    problems += _top_level_problems(compose, ctx)
    services = compose.get("services") or {}
    if not isinstance(services, Mapping):
        return [*problems, "services: expected a mapping"]
    for name, service in services.items():
        problems += _service_problems(str(name), service, ctx)
    return [_one_line(problem) for problem in problems]


def _one_line(text: str) -> str:
    """`text` with control characters escaped: a problem is printed as one line."""
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


def _literal_only(key: Any) -> bool:
    """Whether the value of `key` must be literal (`x-*` extensions are never used as they are)."""
    return key not in _MAY_INTERPOLATE and not str(key).startswith("x-")


def _interpolation_problems(compose: Mapping[str, Any]) -> list[str]:
    """Malformed or refused expressions anywhere; any expression outside `_MAY_INTERPOLATE`."""
    problems: list[str] = []
    try:
        for text in _strings(compose):
            problems += interpolation(text)[1]
        services = compose.get("services")
        for name, service in services.items() if isinstance(services, Mapping) else ():
            for key, value in service.items() if isinstance(service, Mapping) else ():
                if _literal_only(key) and any(interpolation(t)[0] for t in _strings(value)):
                    problems.append(f"service {name}: {key} may not use compose variables")
        for key, value in compose.items():
            if key != "services" and _literal_only(key) and any(interpolation(t)[0] for t in _strings(value)):
                problems.append(f"top-level {key} may not use compose variables")
    except ValueError as exc:
        return [str(exc)]
    return list(dict.fromkeys(problems))


# --- a whole task ----------------------------------------------------------------------


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
    return [_one_line(problem) for problem in problems]


def _scanned_entry_problems(task_dir: Path, scan: TaskScan) -> list[str]:
    """`_entry_problems` of a scanned task.

    The scan exists only when no entry it looked at is a symlink or special:
    what is left are the deeper entries and the `.env` files it found.
    """
    problems = list(_tree_problems(task_dir))
    problems += [f"{where}/.env: compose would read it for interpolation; refused" for where in scan.dotenv]
    return [_one_line(problem) for problem in problems]


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
    """Check a task directory and its parsed task.toml `raw` against the policy (module docstring).

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
            names = set().union(interpolation(text)[0], *(interpolation(s)[0] for s in _strings(compose)))
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
