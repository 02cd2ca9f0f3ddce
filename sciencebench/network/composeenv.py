"""The environment of each `docker compose` the policy environment runs (pure): an allowlist.

Pier gives `docker compose` its whole process environment, then the task's
env table and its persistent env on top: a task setting `PATH`,
`LD_PRELOAD`, `DOCKER_HOST`, `DOCKER_CONFIG` or one of Pier's own compose
variables would choose what runs as root on the worker or where Pier's
bind mounts point. So the compose process gets only what
`compose_environment` lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sciencebench.core.envfile import harness_key_problem

# What docker compose needs of the worker's own environment.
WORKER_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR"})
WORKER_PREFIXES = ("LC_", "DOCKER_")
# The options of Pier's `docker compose exec` that take one argument (before the service name).
_EXEC_OPTIONS = frozenset({"-e", "-w", "-u"})


def compose_environment(
    worker: Mapping[str, str],
    pier_variables: Mapping[str, str],
    values: Mapping[str, str],
    names: Iterable[str],
) -> dict[str, str]:
    """The environment of one `docker compose` process.

    `worker` is the Pier process's own environment, `pier_variables` Pier's
    compose variables (`DockerEnvironmentEnvVars`), `values` everything Pier
    would have merged (its environment, the task's env, the persistent env),
    `names` the variables to take from `values` (interpolated, or passed to
    an exec by name). A name that steers the harness is never taken from
    `values`: it is the worker's or absent.

    - from the worker's own environment (the Pier process's, which a job cannot
      extend with such names: `core.envfile.harness_key_problem`): `PATH`,
      `HOME`, the user and locale, `TMPDIR`, and the Docker client's `DOCKER_*`;
    - Pier's compose variables as Pier computed them (they win over anything);
    - the variables the compose files interpolate, and those an `exec` passes by
      name (`-e NAME`), from what Pier would have given; never a name that
      steers the harness.
    """
    env = {key: value for key, value in worker.items() if from_worker(key)}
    for name in names:
        if name in values and name not in env and harness_key_problem(name) is None:
            env[name] = values[name]
    env.update(pier_variables)
    return env


def from_worker(name: str) -> bool:
    """Whether the compose process takes `name` from the worker's own environment."""
    return name in WORKER_NAMES or name.startswith(WORKER_PREFIXES)


def exec_names(command: Sequence[str]) -> list[str]:
    """The names an `exec` command passes as bare `-e NAME` (compose resolves them from its environment)."""
    if not command or command[0] != "exec":
        return []
    names: list[str] = []
    i = 1
    while i + 1 < len(command) and command[i] in _EXEC_OPTIONS:
        if command[i] == "-e" and "=" not in command[i + 1]:
            names.append(command[i + 1])
        i += 2
    return names


def explicit_exec_values(
    command: Sequence[str], env: Mapping[str, str], values: Mapping[str, str]
) -> list[str]:
    """`command` with each bare `-e NAME` that `env` does not resolve as `values` does made `NAME=value`.

    Such a name steers the harness (the compose process may not hold it), so
    its value goes on the command line, as Pier itself would have put it.
    """
    result = list(command)
    i = 1
    while command and command[0] == "exec" and i + 1 < len(result) and result[i] in _EXEC_OPTIONS:
        name = result[i + 1]
        if result[i] == "-e" and "=" not in name and name in values and env.get(name) != values[name]:
            result[i + 1] = f"{name}={values[name]}"
        i += 2
    return result
