"""How Pier 0.3.0 names trials and their compose projects (pure).

Read from `pier/environments/docker/docker.py` and `pier/trial/trial.py`,
checked against Pier's real functions by `tests/docker/test_dockerhost.py`
(the rules: `trial_project_names`). Everything of one trial is found by
the compose project label value `P` for `P` in
`trial_project_names(trial_name)`, or by `projects_of_trial(trial_name)`,
which also matches verifier projects of any step. Before Pier has picked
the name, `pier_trial_prefix(task dir name)` is known.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable

# Pier's `_MAX_VERIFIER_ENV_SESSION_ID_LEN`.
_MAX_VERIFIER_SESSION_ID_LEN = 63
_VERIFIER_MARK = "__verifier__"
# A compose project of a Pier trial: `<trial name>` or `<trial name>__verifier__<key>`.
_PIER_PROJECT = re.compile(r"^(?P<trial>[a-z0-9][a-z0-9_-]*__[a-z0-9]{7})(?:__verifier__.+)?$")


def compose_project_name(session_id: str) -> str:
    """Pier's `_sanitize_docker_compose_project_name`: the compose project of a session id."""
    name = session_id.lower()
    if not re.match(r"^[a-z0-9]", name):
        name = "0" + name
    return re.sub(r"[^a-z0-9_-]", "-", name)


def verifier_session_id(trial_name: str, key: str = "trial") -> str:
    """Pier's `Trial._separate_verifier_session_id`: session id of a separate verifier env."""
    raw = f"{trial_name}{_VERIFIER_MARK}{key}"
    safe = "".join(char if char.isalnum() or char in "-._" else "_" for char in raw)
    if len(safe) <= _MAX_VERIFIER_SESSION_ID_LEN:
        return safe
    digest = hashlib.sha1(safe.encode()).hexdigest()[:8]  # noqa: S324 - Pier's naming, not security
    suffix = f"__{digest}"
    prefix = safe[: _MAX_VERIFIER_SESSION_ID_LEN - len(suffix)].rstrip("-._")
    return f"{prefix}{suffix}"


def trial_project_names(trial_name: str, verifier_keys: Iterable[str] = ("trial",)) -> list[str]:
    """Compose projects Pier may create for the trial named `trial_name`.

    `trial_name` is the trial directory name. The first entry is the agent
    environment; one verifier project follows per key (`trial` for an
    ordinary task in separate verifier mode, the step names otherwise).

    * A trial is named `<task dir name[:32] stripped of trailing '_-'>__<7 random
      alphanumerics>`; the trial directory carries exactly that name.
    * The agent environment's session id is the trial name. Its compose project is
      `compose_project_name(trial_name)`: lowercased, a `0` prepended when it does
      not start with `[a-z0-9]`, every character outside `[a-z0-9_-]` replaced by
      `-` (so `task_002__AbC1xyz` -> `task_002__abc1xyz`).
    * A separate verifier environment's session id is
      `<trial name>__verifier__<key>` (key `trial`, or the step name of a
      multi-step task), every character outside alphanumerics and `-._` replaced
      by `_`, cut to 63 characters with an 8-hex sha1 suffix when longer; its
      project is `compose_project_name` of that id.
    """
    names = [compose_project_name(trial_name)]
    names += [compose_project_name(verifier_session_id(trial_name, key)) for key in verifier_keys]
    return names


def project_trial_key(project: str) -> str:
    """The agent-environment project a project belongs to (itself, or before `__verifier__`)."""
    return project.split(_VERIFIER_MARK, 1)[0]


def projects_of_trial(trial_name: str) -> Callable[[str], bool]:
    """A predicate matching every compose project of one trial, verifier steps included."""
    key = compose_project_name(trial_name)
    return lambda project: project_trial_key(project) == key


def is_pier_project(project: str) -> bool:
    """Whether a compose project name has the shape of a Pier trial's project."""
    return _PIER_PROJECT.match(project) is not None


def pier_trial_prefix(task_dir_name: str) -> str:
    """The compose-project prefix of every trial Pier starts for a task directory.

    Pier names a trial `<task dir name[:32] stripped of '_-'>__<7 random>`, so
    before Pier has picked the name, `<...>__` (compose-normalized) is known.
    """
    return compose_project_name(f"{task_dir_name[:32].rstrip('_-')}__")
