"""Env files: python-dotenv's grammar without interpolation, and a file's identity.

An env file holds credentials. Messages and job specs carry only its
identity (`EnvFile`: path and SHA-256); each side parses the file itself.
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


def parse_env_text(text: str, source: str) -> dict[str, str]:
    """Parse env-file text with python-dotenv's grammar, without interpolation.

    Accepts `KEY=value`, `export KEY=value`, comments, blank lines and quoted
    values. Raises ProfileError naming `source` and the line number of the
    first malformed line; the line's content is never echoed.
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
        values[binding.key] = binding.value
    return values
