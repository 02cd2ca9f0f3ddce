"""Agent keyword arguments a job may hand to Pier: checked at submit and again on the worker.

Pier's agents read some keywords as paths on the host that runs Pier
(`config_toml_file`, ...): on a worker that is any file the worker can
read, so a job passes the content itself instead (`config_toml`). An
agent's `version` must be a plain version (`agent_kwarg_problem` says
why). Any other keyword travels; one whose name looks like a credential is
redacted in every record and reaches Pier only in the trial's private
config file (`split_secret_kwargs`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# Keyword names Pier's agents treat as host paths end like these.
HOST_PATH_SUFFIXES = ("_file", "_path", "_dir")
# A name containing one of these looks like it holds a credential (the original runner's rule).
SENSITIVE_WORDS = ("key", "token", "secret", "password", "authorization")
# What a record shows, and a job spec holds, in place of a credential-looking value.
REDACTED = "<redacted>"
# What an agent `version` may be: Pier's install scripts put it, unquoted, into a shell command.
AGENT_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")


def agent_kwarg_problem(key: str, value: str) -> str | None:
    """Why the agent keyword `key` (with `value`) may not travel in a job, or None when it may.

    Path keywords (`config_toml_file`, `config_file`, `prompt_template_path`,
    ...) would ship any file the worker can read into the agent's container.
    An agent's `version` must be a plain version (`AGENT_VERSION`, or
    `latest`): Pier's installed agents put it unquoted into their install
    script (`npm install -g @openai/codex@<version>` in a `bash -c`), run by
    the online agent-install build, which keeps the network.
    """
    if key.endswith(HOST_PATH_SUFFIXES):
        return (
            f"--agent-kwarg {key}: names a file on the worker hosts, which a job may not read; "
            "pass the content itself (e.g. config_toml)"
        )
    if key == "version" and not (isinstance(value, str) and AGENT_VERSION.fullmatch(value)):
        return (
            "--agent-kwarg version (CODEX_VERSION): not a plain version "
            "(letters, digits, '.', '+', '_', '-', at most 64; or 'latest')"
        )
    return None


def agent_kwargs_problem(kwargs: Mapping[str, str]) -> str | None:
    """The first of `agent_kwarg_problem` over the keywords of a job, in name order, or None."""
    for key in sorted(kwargs):
        if problem := agent_kwarg_problem(key, kwargs[key]):
            return problem
    return None


def is_sensitive_name(key: str) -> bool:
    """Whether a variable or keyword name looks like it holds a credential."""
    lowered = key.lower()
    return any(word in lowered for word in SENSITIVE_WORDS)


def split_secret_kwargs(kwargs: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """`(kwargs with credential-looking values replaced by REDACTED, those values by key)`.

    A credential-looking name (`max_thinking_tokens`, `api_key`, ...) is
    redacted as the original runner redacts it: its value rides in a private
    file beside the selection (never in `job.json` or a broker message) and
    reaches Pier in the trial's private config file, never on a command line.
    """
    secret = {key: value for key, value in kwargs.items() if is_sensitive_name(key)}
    public = {key: REDACTED if key in secret else value for key, value in kwargs.items()}
    return public, secret


def pier_kwarg_value(value: str) -> Any:
    """An `--ak key=value` value as Pier's CLI parses it (`pier.cli.utils.parse_kwargs`).

    JSON first, then `True`/`False`/`None`, else the string itself.
    """
    value = value.strip()
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return {"True": True, "False": False, "None": None}.get(value, value)
