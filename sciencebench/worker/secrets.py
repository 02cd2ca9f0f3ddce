"""Worker side of the secrets path: read env files by path, check their hashes.

Messages carry only a path and a SHA-256. A file that changed since submit
is refused as a trial error rather than silently running with other keys.
"""

from __future__ import annotations

import hashlib
import json

from sciencebench.core.envfile import EnvFile, parse_env_text
from sciencebench.core.errors import ProfileError, SecretsMismatchError
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
        values.update(json.loads(_read_checked(job.agent_env_file)))
    return values
