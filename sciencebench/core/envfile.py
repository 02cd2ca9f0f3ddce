"""Env files: python-dotenv's grammar without interpolation, a file's identity, the key policy.

An env file holds credentials. Messages and job specs carry only its
identity (`EnvFile`: path and SHA-256); each side parses the file itself.

Its values, and `--agent-env` values, become part of Pier's process
environment on a worker host, which holds the Docker socket. So a key that
would change the harness rather than inform the agent (the dynamic loader,
the interpreter, the Docker and compose clients, proxies, sciencebench's
own settings, files to upload) is refused: at submit and again on the worker
(`harness_key_problem`).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from dotenv.parser import parse_stream
from pydantic import BaseModel, ConfigDict

from sciencebench.core.errors import ProfileError

VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LEADING_SPACE = re.compile(r"\s*")
_NEWLINE = re.compile(r"\r\n|\n|\r")  # python-dotenv's own line-break rule


class EnvFile(BaseModel):
    """An env file as a message carries it: where it is and what it hashed to."""

    model_config = ConfigDict(frozen=True)

    path: Path
    sha256: str


# Keys that steer the harness itself (exact names, prefixes, suffixes; case-insensitive).
_HARNESS_KEYS = frozenset({"PATH", "HOME", "SHELL", "ENV", "BASH_ENV", "IFS", "TMPDIR", "CDPATH"})
_HARNESS_PREFIXES = ("LD_", "PYTHON", "DOCKER_", "COMPOSE_", "BUILDKIT_", "SCIENCEBENCH_", "LITELLM_", "SSL_")
_HARNESS_SUFFIXES = ("_AUTH_JSON_PATH", "_PROXY", "_CA_BUNDLE")


def harness_key_problem(key: str) -> str | None:
    """Why `key` may not come from an env file or `--agent-env`, or None when it may.

    The answer names the key's kind, never a value.
    """
    upper = key.upper()
    if upper in _HARNESS_KEYS:
        return f"{key} would change the harness's own environment"
    prefix = next((p for p in _HARNESS_PREFIXES if upper.startswith(p)), None)
    if prefix is not None:
        return f"{key}: {prefix}* variables steer the harness (loader, interpreter, Docker, settings)"
    suffix = next((s for s in _HARNESS_SUFFIXES if upper.endswith(s)), None)
    if suffix is not None:
        return f"{key}: *{suffix} variables steer the harness (uploaded files, proxies, TLS trust)"
    return None


def parse_env_text(text: str, source: str) -> dict[str, str]:
    """Parse env-file text with python-dotenv's grammar, without interpolation.

    Accepts `KEY=value`, `export KEY=value`, comments, blank lines and quoted
    values. Raises ProfileError naming `source` and the line number of the
    first malformed line (or a value with a NUL character, which no process
    environment can hold); the line's content is never echoed.
    """
    values: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text)):
        # A binding's text starts with the blank lines before it; count them
        # so the number names the offending line itself.
        leading = _LEADING_SPACE.match(binding.original.string)
        line = binding.original.line + len(_NEWLINE.findall(leading.group() if leading else ""))
        if binding.error:
            raise ProfileError(f"{source}: line {line}: not a KEY=value line")
        if binding.key is None:
            continue
        if not VARIABLE_NAME.fullmatch(binding.key):
            raise ProfileError(f"{source}: line {line}: invalid variable name")
        if binding.value is None:
            raise ProfileError(f"{source}: line {line}: variable has no '=value'")
        if "\x00" in binding.value:
            raise ProfileError(f"{source}: line {line}: value contains a NUL character")
        values[binding.key] = binding.value
    return values
