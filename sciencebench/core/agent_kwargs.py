"""Agent keyword arguments a job may hand to Pier: checked at submit and again on the worker.

Pier's agents read some keywords as paths on the host that runs Pier
(`config_toml_file`, `config_file`, `prompt_template_path`, ...): on a
worker host that is any file the worker can read, shipped into the agent's
container. A job passes the content itself instead (`config_toml`).
"""

from __future__ import annotations

# Keyword names Pier's agents treat as host paths end like these.
HOST_PATH_SUFFIXES = ("_file", "_path", "_dir")


def agent_kwarg_problem(key: str) -> str | None:
    """Why the agent keyword `key` may not travel in a job, or None when it may."""
    if key.endswith(HOST_PATH_SUFFIXES):
        return (
            f"--agent-kwarg {key}: names a file on the worker hosts, which a job may not read; "
            "pass the content itself (e.g. config_toml)"
        )
    return None
