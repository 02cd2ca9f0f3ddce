"""What a task may ask of Docker through its compose files and env tables (pure): an allowlist.

A task's compose files (`core.taskdir.COMPOSE_FILES`) are merged by Pier
into the trial's `docker compose` project, and its env tables reach the
environment of Pier's `docker compose`; Docker runs them with the worker
host's privileges. So everything is checked against an allowlist
(`compose_problems`, which lists what passes): statically at submit and on
the worker (`core.taskreview`), and on the model `docker compose config`
renders before each command that builds, creates or starts anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sciencebench.core.images import check_image_ref
from sciencebench.core.interpolation import interpolation, strings

AGENT_SERVICE = "main"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

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
# How the Engine keeps every trial container's output (PID 1's stdout and stderr, which any process of
# the container may write): a file on the host's disk, no part of the writable layer, unbounded by
# default. The policy's override sets it (`network.compose`); a task may not, and a rendered model
# must have exactly this.
POLICY_LOGGING: dict[str, Any] = {"driver": "json-file", "options": {"max-size": "10m", "max-file": "2"}}


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
        elif key == "logging" and ctx.rendered:
            if value != POLICY_LOGGING:
                problems.append(f"{where}: logging {value!r} (the policy's is {POLICY_LOGGING!r})")
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

    Where it runs: statically at submit (`core.taskreview.review_task`, exit
    2) and again on the worker before Pier starts (`review_task_dir`), on the
    YAML as written; by the network policy environment, on the model `docker
    compose config` renders from Pier's exact file list and environment
    (`rendered=True`).

    What passes: one service, `main` (the inspection after start accepts no
    other container), with the allowed keys; top-level `services`, `volumes`
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
    refused everywhere.
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
    return [one_line(problem) for problem in problems]


def one_line(text: str) -> str:
    """`text` with control characters escaped: a problem is printed as one line."""
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


def _literal_only(key: Any) -> bool:
    """Whether the value of `key` must be literal (`x-*` extensions are never used as they are)."""
    return key not in _MAY_INTERPOLATE and not str(key).startswith("x-")


def _interpolation_problems(compose: Mapping[str, Any]) -> list[str]:
    """Malformed or refused expressions anywhere; any expression outside `_MAY_INTERPOLATE`."""
    problems: list[str] = []
    try:
        for text in strings(compose):
            problems += interpolation(text)[1]
        services = compose.get("services")
        for name, service in services.items() if isinstance(services, Mapping) else ():
            for key, value in service.items() if isinstance(service, Mapping) else ():
                if _literal_only(key) and any(interpolation(t)[0] for t in strings(value)):
                    problems.append(f"service {name}: {key} may not use compose variables")
        for key, value in compose.items():
            if key != "services" and _literal_only(key) and any(interpolation(t)[0] for t in strings(value)):
                problems.append(f"top-level {key} may not use compose variables")
    except ValueError as exc:
        return [str(exc)]
    return list(dict.fromkeys(problems))
