"""The agent part of a trial's Pier run in a private config file; credential-looking keywords out of records.

`pier run --config FILE` starts from a JobConfig file and applies the
command line over it. The worker writes the agents there, readable by its
owner only, in the try's private scratch: no keyword value is on Pier's
command line. Credential-looking keywords' values come from the private
file submit wrote beside the selection, read as env files are
(`worker.secrets.read_owned`); once Pier ran, they are redacted again in
the files Pier wrote (`config.json`, `result.json`), so they never reach
the job directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from sciencebench.core.agent_kwargs import REDACTED, is_sensitive_name
from sciencebench.core.errors import RefusedError, SecretsMismatchError
from sciencebench.core.models import JobSpec, TrialSpec, agent_kwargs_file_name
from sciencebench.core.paths import SelectionPaths, write_atomic
from sciencebench.core.pier_argv import render_agent_config
from sciencebench.worker.secrets import read_owned

CONFIG_NAME = "pier-agents.json"


def load_secret_kwargs(job: JobSpec, owner_uid: int) -> dict[str, str]:
    """The credential-looking keyword values of the job, from its private file (checked), or {}.

    `owner_uid` owns the job's directory; the file must be that account's,
    and is not read through a symlink. Raises RefusedError when the job spec
    names a file where submit does not write them, or one that is a link or
    another account's; SecretsMismatchError when it is unreadable, changed or
    not what submit wrote, or lacks a keyword the spec holds redacted.
    """
    wanted = {
        key for key, value in job.agent.agent_kwargs.items() if is_sensitive_name(key) and value == REDACTED
    }
    identity = job.agent_kwargs_file
    if identity is None:
        if wanted:
            raise SecretsMismatchError(
                f"--agent-kwarg {sorted(wanted)[0]}: the job has no file with its value"
            )
        return {}
    secrets_dir = SelectionPaths(job.selection_path).secrets_dir
    if identity.path.parent != secrets_dir or identity.path.name != agent_kwargs_file_name(job):
        raise RefusedError(f"--agent-kwarg file {identity.path} is not in {secrets_dir}")
    data = read_owned(identity, owner_uid, "--agent-kwarg file")
    if hashlib.sha256(data).hexdigest() != identity.sha256:
        raise SecretsMismatchError(f"{identity.path}: changed since submit (SHA-256 differs)")
    try:
        values = json.loads(data)
    except ValueError:
        values = None
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise SecretsMismatchError(f"{identity.path}: not the JSON object of strings submit wrote")
    if missing := sorted(wanted - set(values)):
        raise SecretsMismatchError(f"{identity.path}: has no value for --agent-kwarg {missing[0]}")
    return {key: values[key] for key in sorted(wanted)}


def write_agent_config(trial: TrialSpec, job: JobSpec, scratch: Path, owner_uid: int) -> Path:
    """Write the try's `pier run --config` file (mode 0600, created exclusively); its path.

    The try's scratch directory becomes its owner's only (0700): while Pier
    runs, its own job and trial `config.json` there hold the keyword values.
    `owner_uid` owns the job's directory (`load_secret_kwargs`).
    """
    os.chmod(scratch, 0o700)
    path = scratch / CONFIG_NAME
    text = render_agent_config(trial, job, load_secret_kwargs(job, owner_uid))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


def _redact_kwargs(agent: Any) -> bool:
    """Redact credential-looking values in one serialized AgentConfig; whether anything changed."""
    kwargs = agent.get("kwargs") if isinstance(agent, dict) else None
    if not isinstance(kwargs, dict):
        return False
    keys = [key for key in kwargs if is_sensitive_name(key) and kwargs[key] != REDACTED]
    for key in keys:
        kwargs[key] = REDACTED
    return bool(keys)


def _agents_in(name: str, data: dict[str, Any]) -> list[Any]:
    """The serialized AgentConfigs of one of Pier's files (job config, trial config, trial result)."""
    if name == "result.json":
        config = data.get("config")
        return [config.get("agent")] if isinstance(config, dict) else []
    agents = data.get("agents")
    return agents if isinstance(agents, list) else [data.get("agent")]


def redact_pier_files(pier_job_dir: Path, trial_dirs: list[Path]) -> None:
    """Redact credential-looking keyword values where Pier recorded them: job and trial config, result.

    Pier writes a trial's agent keywords verbatim into its `config.json` and
    `result.json`; the job directory, summaries and `pier view` then show the
    redacted form, as the original runner's record does.
    """
    files = [pier_job_dir / "config.json"]
    for trial_dir in trial_dirs:
        files += [trial_dir / "config.json", trial_dir / "result.json"]
    for path in files:
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        changed = [_redact_kwargs(agent) for agent in _agents_in(path.name, data)]
        if any(changed):
            write_atomic(path, json.dumps(data, indent=4))
