"""What a task's own compose file may ask for (pure): no host namespaces, no host paths.

A task directory may hold `environment/docker-compose.yaml` (extra services
or overrides of the agent environment) and `tests/docker-compose.yaml` (the
separate verifier's). Docker runs them with the worker host's privileges, so
each is checked twice: statically at submit (exit 2) and by the network policy
environment before anything starts.

Refused in any service: `privileged`, host `pid`/`ipc`/`uts`/`userns`/
`cgroup` namespaces, `network_mode` other than none, devices, added
capabilities, unconfined seccomp or AppArmor, SELinux labels off, and bind
mounts whose source is not inside the task directory; top-level volumes that
bind a host device or path. Compose variables (`$VAR`, `${VAR}`) and the
`${VAR}` templates of a task.toml's env tables may name only what Pier
provides, the task's own environment keys and what the submit declared (env
file, `--agent-env`): they are resolved from Pier's process environment.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

# The variables Pier sets for compose (its DockerEnvironmentEnvVars, upper-cased).
PIER_COMPOSE_VARIABLES = frozenset({
    "MAIN_IMAGE_NAME", "CONTEXT_DIR", "HOST_VERIFIER_LOGS_PATH", "HOST_AGENT_LOGS_PATH",
    "HOST_ARTIFACTS_PATH", "ENV_VERIFIER_LOGS_PATH", "ENV_AGENT_LOGS_PATH", "ENV_ARTIFACTS_PATH",
    "PREBUILT_IMAGE_NAME",
})  # fmt: skip
# Relative paths of the compose files Pier reads from a task directory.
COMPOSE_FILES = ("environment/docker-compose.yaml", "tests/docker-compose.yaml")

_VARIABLE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)[^}]*\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")
_HOST_NAMESPACES = ("pid", "ipc", "uts", "userns_mode", "cgroup", "cgroupns_mode")


def compose_variables(text: str) -> set[str]:
    """Names of the variables compose would substitute in `text` (`$$` is a literal `$`)."""
    return {
        match.group("braced") or match.group("bare") for match in _VARIABLE.finditer(text.replace("$$", ""))
    }


def _bind_source(volume: Any) -> str | None:
    """The host path a service volume binds, or None for a named volume, tmpfs or anything else."""
    if isinstance(volume, str):
        source, sep, _ = volume.partition(":")
        if not sep:
            return None  # an anonymous volume
        return source if source.startswith(("/", ".", "~", "$")) or "/" in source else None
    if isinstance(volume, Mapping) and volume.get("type", "volume") == "bind":
        return str(volume.get("source", ""))
    return None


# Bind sources may start with these: Pier points them into the trial or the task directory.
_PIER_PATH_VARIABLES = (
    "HOST_VERIFIER_LOGS_PATH",
    "HOST_AGENT_LOGS_PATH",
    "HOST_ARTIFACTS_PATH",
    "CONTEXT_DIR",
)
_PIER_PATH = re.compile(r"^\$\{?(" + "|".join(_PIER_PATH_VARIABLES) + r")\}?(?:/|$)")


def _inside(source: str, base_dir: Path, roots: Iterable[Path]) -> bool:
    if _PIER_PATH.match(source) and ".." not in PurePosixPath(source).parts:
        return True
    if "$" in source or source.startswith("~"):
        return False  # resolved from an environment only the host knows
    path = PurePosixPath(source)
    candidate = Path(path if path.is_absolute() else base_dir / path).resolve()
    return any(candidate.is_relative_to(root.resolve()) for root in roots)


def _service_hazards(name: str, service: Mapping[str, Any], base_dir: Path, roots: list[Path]) -> list[str]:
    problems: list[str] = []
    if service.get("privileged"):
        problems.append(f"service {name}: privileged")
    for key in _HOST_NAMESPACES:
        if str(service.get(key, "")).lower() == "host":
            problems.append(f"service {name}: {key}: host")
    network_mode = service.get("network_mode")
    if network_mode is not None and str(network_mode) != "none":
        problems.append(f"service {name}: network_mode {network_mode!r} (the network policy decides)")
    if service.get("devices") or service.get("device_cgroup_rules"):
        problems.append(f"service {name}: host devices")
    if service.get("cap_add"):
        problems.append(f"service {name}: cap_add {list(service['cap_add'])}")
    for option in service.get("security_opt") or []:
        text = str(option).lower().replace("=", ":")
        if "unconfined" in text or text.startswith("label:disable"):
            problems.append(f"service {name}: security_opt {option!r}")
    for volume in service.get("volumes") or []:
        source = _bind_source(volume)
        if source is not None and not _inside(source, base_dir, roots):
            problems.append(f"service {name}: bind mount of {source!r} outside the task directory")
    return problems


def compose_hazards(compose: Any, base_dir: Path, allowed_roots: Iterable[Path]) -> list[str]:
    """Every refused request of one parsed compose file; empty when it may run.

    `base_dir` is the directory relative bind sources are resolved against
    (the compose file's own); a bind source must lie under `allowed_roots`.
    """
    if not isinstance(compose, Mapping):
        return ["not a compose file (expected a mapping)"]
    roots = list(allowed_roots)
    problems: list[str] = []
    services = compose.get("services") or {}
    if not isinstance(services, Mapping):
        return ["services: expected a mapping"]
    for name, service in services.items():
        if isinstance(service, Mapping):
            problems += _service_hazards(str(name), service, base_dir, roots)
    for name, volume in (compose.get("volumes") or {}).items():
        options = (volume or {}).get("driver_opts") if isinstance(volume, Mapping) else None
        if isinstance(options, Mapping) and ("device" in options or "o" in options):
            problems.append(f"volume {name}: driver_opts bind a host path or device")
    return problems


def compose_needs(text: str, own_env: Iterable[str]) -> set[str]:
    """The variables a task compose file takes from the worker beyond Pier's and the task's own env."""
    return compose_variables(text) - PIER_COMPOSE_VARIABLES - set(own_env)


# Pier's env templates: the whole value is `${VAR}` or `${VAR:-default}`.
_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")


def template_variables(raw: Any) -> set[str]:
    """`VAR` of every `${VAR}` / `${VAR:-default}` value of an `env` table anywhere in a task.toml."""
    found: set[str] = set()
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            if key == "env" and isinstance(value, Mapping):
                values = [v for v in value.values() if isinstance(v, str)]
                found |= {m.group(1) for v in values if (m := _TEMPLATE.fullmatch(v))}
            else:
                found |= template_variables(value)
    elif isinstance(raw, list):
        for item in raw:
            found |= template_variables(item)
    return found


def task_variables(task_dir: Path) -> set[str]:
    """Every variable a task's files take from the worker's environment (templates, compose).

    Raises OSError or ValueError when a file cannot be read or parsed.
    """
    raw = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
    own_env = (raw.get("environment") or {}).get("env") or {}
    needed = template_variables(raw)
    for relative in COMPOSE_FILES:
        path = task_dir / relative
        if path.is_file():
            needed |= compose_needs(path.read_text(encoding="utf-8"), own_env)
    return needed
