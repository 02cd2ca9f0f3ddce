"""Worker side of the secrets path: read env files by path, check their owner, hashes and keys.

Messages carry only a path and a SHA-256. A job uses only its own
submitter's secrets: an env file or `--agent-env` file is read only when it
belongs to the account that owns the job's directory (`owner_uid`),
checked on the descriptor the file is then read from (no symlink followed,
no swap between check and read). A file that changed since submit is
refused as a trial error; a key that agents do not read, or that would
steer the harness, is refused again here (a job.json may have been written
by someone else).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat

from sciencebench.core.envfile import EnvFile, agent_key_problem, parse_env_text
from sciencebench.core.errors import ProfileError, RefusedError, SecretsMismatchError
from sciencebench.core.models import JobSpec


def read_owned(identity: EnvFile, owner_uid: int, what: str) -> bytes:
    """The bytes of the regular file `identity` names when account `owner_uid` owns it.

    Opened without following a final symlink and without blocking; the
    owner is compared on that descriptor and the bytes are read from it.
    A refusal names the file by its name only.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(identity.path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RefusedError(f"refused: {what} {identity.path.name} is a symbolic link") from None
        raise SecretsMismatchError(f"{identity.path}: unreadable on this worker ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise RefusedError(f"refused: {what} {identity.path.name} is not a regular file")
        if info.st_uid != owner_uid:
            raise RefusedError(
                f"refused: {what} {identity.path.name} belongs to another account (uid {info.st_uid}) "
                f"than the job's directory (uid {owner_uid}); a job uses only its submitter's secrets"
            )
        return handle.read()


def _read_checked(identity: EnvFile, owner_uid: int, what: str) -> str:
    data = read_owned(identity, owner_uid, what)
    if hashlib.sha256(data).hexdigest() != identity.sha256:
        raise SecretsMismatchError(f"{identity.path}: changed since submit (SHA-256 differs)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretsMismatchError(f"{identity.path}: not UTF-8 text") from None


def load_secrets(job: JobSpec, owner_uid: int) -> dict[str, str]:
    """Values for Pier's process environment: env file, then --agent-env.

    `owner_uid` owns the job's directory; each file must be that account's.
    """
    values: dict[str, str] = {}
    if job.env_file is not None:
        try:
            text = _read_checked(job.env_file, owner_uid, "env file")
            values.update(parse_env_text(text, str(job.env_file.path)))
        except ProfileError as exc:
            raise SecretsMismatchError(str(exc)) from None
    if job.agent_env_file is not None:
        try:
            agent_env = json.loads(_read_checked(job.agent_env_file, owner_uid, "--agent-env file"))
        except ValueError:
            raise SecretsMismatchError(f"{job.agent_env_file.path}: not the JSON submit wrote") from None
        if not isinstance(agent_env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and "\x00" not in v for k, v in agent_env.items()
        ):
            raise SecretsMismatchError(f"{job.agent_env_file.path}: not a JSON object of strings")
        values.update(agent_env)
    problems = [problem for key in values if (problem := agent_key_problem(key))]
    if problems:
        raise RefusedError(f"refused: {problems[0]}")
    return values
