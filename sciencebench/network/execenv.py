"""Pier's Docker environment, except that exec keeps environment values off command lines.

Pier passes an agent's environment as `docker compose exec -e KEY=VALUE`, so
a provider key would be readable in the host's process list (`ps`, /proc)
for as long as the agent runs. Compose resolves `-e KEY` from its own
environment, and the compose process inherits Pier's, which holds every
env-file value: such a value needs only its name on the command line.
"""

from __future__ import annotations

from collections.abc import Mapping

from pier.environments.base import ExecResult
from pier.environments.docker.docker import DockerEnvironment


def exec_env_args(env: Mapping[str, str], compose_env: Mapping[str, str]) -> list[str]:
    """`-e` options for `env`: `-e KEY` where `compose_env` holds the same value, else `-e KEY=VALUE`."""
    args: list[str] = []
    for key, value in env.items():
        args += ["-e", key if compose_env.get(key) == value else f"{key}={value}"]
    return args


class SecretSafeExecEnvironment(DockerEnvironment):
    """Pier's DockerEnvironment whose `exec` passes inherited values by name only."""

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Pier's exec (same arguments, same result), with `exec_env_args` for the environment."""
        if self._is_windows_container:
            return await super().exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        user = self._resolve_user(user)
        merged = self._merge_env(env)
        exec_command = ["exec"]
        effective_cwd = cwd or self.task_env_config.workdir
        if effective_cwd:
            exec_command += ["-w", effective_cwd]
        if merged:
            exec_command += exec_env_args(merged, self._compose_process_env())
        if user is not None:
            exec_command += ["-u", str(user)]
        exec_command += ["main", *self._platform.exec_shell_args(command)]
        result: ExecResult = await self._run_docker_compose_command(
            exec_command, check=False, timeout_sec=timeout_sec
        )
        return result

    def _compose_process_env(self) -> dict[str, str]:
        # What Pier's _run_docker_compose_command gives the compose process.
        env: dict[str, str] = self._env_vars.to_env_dict(include_os_env=True)
        env.update(self._compose_task_env)
        env.update(self._persistent_env)
        return env
