"""Worker side of the secrets path: read env files by path, check their hashes and keys.

Messages carry only a path and a SHA-256. A file that changed since submit
is refused as a trial error rather than silently running with other keys;
a key that would steer the harness is refused again here (the login node
refused it at submit; a job.json may have been written by someone else).
"""

from __future__ import annotations

import hashlib
import json

from sciencebench.core.envfile import EnvFile, harness_key_problem, parse_env_text
from sciencebench.core.errors import ProfileError, RefusedError, SecretsMismatchError
from sciencebench.core.models import JobSpec


def _read_checked(identity: EnvFile) -> str:
    try:
        data = identity.path.read_bytes()
    except OSError as exc:
        raise SecretsMismatchError(f"{identity.path}: unreadable on this worker ({exc.strerror})") from None
    if hashlib.sha256(data).hexdigest() != identity.sha256:
        raise SecretsMismatchError(f"{identity.path}: changed since submit (SHA-256 differs)")
    return data.decode("utf-8")


def load_secrets(job: JobSpec) -> dict[str, str]:
    """Values for Pier's process environment: env file, then --agent-env."""
    values: dict[str, str] = {}
    if job.env_file is not None:
        try:
            values.update(parse_env_text(_read_checked(job.env_file), str(job.env_file.path)))
        except ProfileError as exc:
            raise SecretsMismatchError(str(exc)) from None
    if job.agent_env_file is not None:
        try:
            agent_env = json.loads(_read_checked(job.agent_env_file))
        except ValueError:
            raise SecretsMismatchError(f"{job.agent_env_file.path}: not the JSON submit wrote") from None
        if not isinstance(agent_env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and "\x00" not in v for k, v in agent_env.items()
        ):
            raise SecretsMismatchError(f"{job.agent_env_file.path}: not a JSON object of strings")
        values.update(agent_env)
    problems = [problem for key in values if (problem := harness_key_problem(key))]
    if problems:
        raise RefusedError(f"refused: {problems[0]}")
    return values
