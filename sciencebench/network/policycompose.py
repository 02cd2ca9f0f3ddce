"""Every `docker compose` a trial runs, under the policy: the task's files, the rendered model, its env.

Before anything starts, the task's files as written are checked
(`core.taskreview.review_task_dir`). Each compose command that could
build, create or start anything is preceded by its own `docker compose
config` over Pier's exact file list and environment, and the rendered model
is checked against the same allowlist. Every `docker compose` runs with an
allowlisted environment (`network.composeenv`), never Pier's whole one with
the task's env on top, and with `--env-file /dev/null`, so a `.env` file in
the task is never read.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pier.environments.base import ExecResult

from sciencebench.core.compose_policy import compose_problems
from sciencebench.core.envfile import harness_key_problem
from sciencebench.core.errors import PolicyRefused
from sciencebench.core.interpolation import interpolation
from sciencebench.core.taskreview import review_task, review_task_dir
from sciencebench.network.agentinstall import AgentInstallEnvironment
from sciencebench.network.compose import build_network_problems
from sciencebench.network.composeenv import compose_environment, exec_names, explicit_exec_values, from_worker

# Compose commands that build, create or run nothing: they need no rendered-model check first.
_INERT_COMMANDS = frozenset({"config", "down", "stop", "ps"})
# Compose commands that build, create, pull or start something: each is preceded by its own check.
_STARTING_COMMANDS = frozenset({"build", "up", "create", "start", "run", "restart", "pull"})


class PolicyComposeEnvironment(AgentInstallEnvironment):
    """Pier's compose runner with the task's files and each rendered model checked first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._policy_compose_path: Path | None = None
        self._interpolated: dict[tuple[Path, ...], frozenset[str]] = {}
        # The last rendered verdict: the file list it was for, and its refusal (None: it passed).
        self._rendered: tuple[tuple[Path, ...], str | None] | None = None
        super().__init__(*args, **kwargs)

    @property
    def _docker_compose_paths(self) -> list[Path]:
        paths: list[Path] = list(super()._docker_compose_paths)
        # Last, so its scalars (network_mode, stop_signal, ...) win.
        if self._policy_compose_path is not None and self._policy_compose_path not in paths:
            paths.append(self._policy_compose_path)
        return paths

    @property
    def _task_dir(self) -> Path:
        """The task directory this environment's files come from (the nearest one holding task.toml).

        Found lexically from the directory Pier names (`<task>/environment`,
        `<task>/tests`, `<task>/steps/<name>/tests`), never through a symlink's
        target: `_check_task_files` refuses a symlink on the way.
        """
        start = Path(os.path.normpath(Path(self.environment_dir).absolute()))
        return next((d for d in start.parents if (d / "task.toml").is_file()), start.parent)

    @property
    def _mount_roots(self) -> list[Path]:
        """Where bind mounts may come from: the trial directory (Pier's logs) and the task directory."""
        return [Path(self.trial_paths.trial_dir).resolve(), self._task_dir.resolve()]

    def _check_task_files(self) -> None:
        """Refuse a task whose files the policy refuses (`review_task_dir`), before anything starts.

        On a worker the task directory is the try's snapshot (`worker.snapshot`,
        Pier's `--path`): what is checked here is what Pier builds, mounts and copies.
        """
        task_dir = self._task_dir
        here = Path(os.path.normpath(Path(self.environment_dir).absolute()))
        while here != task_dir and task_dir in here.parents:
            if here.is_symlink():
                raise PolicyRefused(f"{here.name} is a symlink; a task's files must be inside it")
            here = here.parent
        if task_dir.is_symlink():  # `_task_dir` and `_mount_roots` would follow it
            raise PolicyRefused(f"the task directory {task_dir.name} is a symlink; refused")
        try:
            # Pier needs a task.toml; without one (the class used directly) there are no env tables.
            has_toml = os.path.lexists(task_dir / "task.toml")
            review = review_task_dir(task_dir) if has_toml else review_task(task_dir, {})
        except (OSError, ValueError) as exc:
            raise PolicyRefused(f"the task's files are unreadable ({exc.__class__.__name__})") from None
        if review.problems:
            raise PolicyRefused(f"the task asks for what the policy refuses: {'; '.join(review.problems)}")

    def _interpolated_names(self, paths: tuple[Path, ...]) -> frozenset[str]:
        """Every variable the compose files interpolate (unreadable files add none: compose fails on them)."""
        if paths not in self._interpolated:
            names: set[str] = set()
            for path in paths:
                try:
                    names |= interpolation(path.read_text(encoding="utf-8"))[0]
                except (OSError, UnicodeDecodeError):
                    continue
            self._interpolated[paths] = frozenset(names)
        return self._interpolated[paths]

    def _compose_env(self, command: list[str]) -> tuple[list[str], dict[str, str]]:
        """The command and environment of one `docker compose` (`network.composeenv`)."""
        values = self._compose_process_env()  # what Pier would have given: the source of named values
        pier_variables = self._env_vars.to_env_dict(include_os_env=False)
        if self._windows_container_name:
            pier_variables["PIER_CONTAINER_NAME"] = self._windows_container_name
        names = self._interpolated_names(tuple(self._docker_compose_paths)) | set(exec_names(command))
        env = compose_environment(os.environ, pier_variables, values, names)
        return explicit_exec_values(command, env, values), env

    async def _run_docker_compose_command(
        self, command: list[str], check: bool = True, timeout_sec: int | None = None
    ) -> ExecResult:
        """Pier's compose runner with an allowlisted environment, after the rendered-model check.

        Raises PolicyRefused, before running `command`, when the model
        `docker compose config` renders for a task compose file is refused.
        A command that builds, creates or starts anything is checked on its
        own rendering, never on an earlier command's verdict.
        """
        if command[:1] and command[0] not in _INERT_COMMANDS:
            await self._check_rendered(fresh=command[0] in _STARTING_COMMANDS)
        return await self._compose(command, check=check, timeout_sec=timeout_sec)

    async def _compose(
        self, command: list[str], check: bool = True, timeout_sec: int | None = None, stderr: bool = False
    ) -> ExecResult:
        # Pier's `_run_docker_compose_command`, except for the environment and the `.env` file;
        # `stderr`: keep it apart (compose's warnings would corrupt `config`'s JSON).
        command, env = self._compose_env(command)
        full_command = [
            "docker", "compose", "--env-file", os.devnull,
            "--project-name", self.compose_project,
            "--project-directory", str(Path(self.environment_dir).resolve().absolute()),
        ]  # fmt: skip
        for path in self._docker_compose_paths:
            full_command += ["-f", str(path.resolve().absolute())]
        full_command += command
        process = await asyncio.create_subprocess_exec(
            *full_command,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE if stderr else asyncio.subprocess.STDOUT,
        )
        try:
            output = await asyncio.wait_for(process.communicate(), timeout=timeout_sec or None)
        except TimeoutError:
            process.terminate()
            try:
                await asyncio.wait_for(process.communicate(), timeout=5)
            except TimeoutError:
                process.kill()
                await process.communicate()
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
        stdout_bytes, stderr_bytes = output
        result = ExecResult(
            stdout=stdout_bytes.decode(errors="replace") if stdout_bytes else None,
            stderr=stderr_bytes.decode(errors="replace") if stderr_bytes else None,
            return_code=process.returncode or 0,
        )
        if check and result.return_code != 0:
            raise RuntimeError(
                f"Docker compose command failed for environment {self.environment_name}. "
                f"Command: {' '.join(full_command)}. Return code: {result.return_code}. "
                f"Stdout: {result.stdout}. "
            )
        return result

    async def _check_rendered(self, fresh: bool = True) -> None:
        """Check the model compose will run, rendered from Pier's exact files and environment.

        Only a task's own compose file can put anything of the task into the
        model: without one every file is Pier's or the policy's, and the
        environment holds only Pier's variables. `fresh`: render it now (for
        a command that builds, creates or starts anything: what the files
        name may have changed since an earlier command); otherwise the last
        verdict for the same file list stands (`exec`, `cp`). Raises PolicyRefused.
        """
        paths = tuple(self._docker_compose_paths)
        if not self._uses_compose and not self._builds:
            return
        if fresh or self._rendered is None or self._rendered[0] != paths:
            self._rendered = (paths, await self._rendered_refusal())
        if self._rendered[1] is not None:
            raise PolicyRefused(self._rendered[1])

    async def _rendered_refusal(self) -> str | None:
        """Why the model `docker compose config` renders is refused, or None when it may run."""
        rendered = await self._compose(["config", "--format", "json"], check=False, stderr=True)
        secrets = self._job_values()
        if rendered.return_code != 0:
            tail = (rendered.stderr or "").strip().splitlines()[-1:] or ["no output"]
            return f"docker compose config refused the task's compose file: {_masked(tail[0][:300], secrets)}"
        try:
            model = json.loads(rendered.stdout or "")
        except json.JSONDecodeError:
            return "docker compose config printed no JSON model"
        # No bind mount may be written: Pier's log mounts are gone (logs are copied), the task's read-only.
        problems = build_network_problems(model)
        if self._uses_compose:
            problems += compose_problems(
                model,
                Path(self.environment_dir),
                self._mount_roots,
                rendered=True,
                project=self.compose_project,
            )
        if problems := list(dict.fromkeys(problems)):
            return "the rendered compose model asks for what the policy refuses: " + _masked(
                "; ".join(problems), secrets
            )
        return None

    def _job_values(self) -> list[str]:
        """Values of Pier's environment a job may have set (env file, `--agent-env`): masked in messages.

        A job can set no name that steers the harness: those, like the names compose
        takes from the worker (user, locale), are the worker's own.
        """
        return [v for k, v in os.environ.items() if harness_key_problem(k) is None and not from_worker(k)]


def _masked(text: str, secrets: Sequence[str]) -> str:
    """`text` with every secret of 4 characters or more replaced by `<redacted>`."""
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "<redacted>")
    return text
