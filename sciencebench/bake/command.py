"""`sciencebench images bake`: agent-ready images for a selection, built once and recorded.

For each distinct agent image of the selection's tasks (once per task image
digest, agent and version): render the recipe (`sciencebench.bake.recipes`),
look the resulting tag up in the registry, build and push it only when the
registry lacks it, and record the digest-pinned result in the selection
(`sciencebench.core.agentimages`). Runs on a build host, neither the login
node nor a worker: Docker, the registry and the artifact directory
(`scripts/agent-artifacts.sh`) must be there. No network is used inside any
build or container.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sciencebench.bake.builder import Action, Baker
from sciencebench.bake.offline import BakeError
from sciencebench.bake.recipes import RecipeError
from sciencebench.core.agentimages import (
    AgentImages,
    BakedImage,
    load_agent_images,
)
from sciencebench.core.errors import InputError, SciencebenchError
from sciencebench.core.harnesses import bake_of, bakeable
from sciencebench.core.paths import SelectionPaths, write_atomic
from sciencebench.core.settings import DEFAULT_AGENT_ARTIFACTS, raw_setting
from sciencebench.login.selection import load_selection

REPOSITORY = "sciencebench-agents"


class BakeFailed(SciencebenchError):
    """Building, pushing or probing a baked image failed (exit 1)."""


@dataclass(frozen=True)
class Baked:
    """What one bake did for one task image."""

    image: BakedImage
    action: Action
    seconds: float


def default_artifacts() -> Path:
    """The artifact directory: SCIENCEBENCH_AGENT_ARTIFACTS, else /var/tmp/sciencebench-agents."""
    return Path(raw_setting("agent_artifacts") or DEFAULT_AGENT_ARTIFACTS)


def _write(path: Path, images: AgentImages) -> None:
    write_atomic(path, images.model_dump_json(indent=2) + "\n")


def bake_selection(
    path: Path,
    agent: str,
    version: str | None = None,
    *,
    registry: str,
    artifacts: Path | None = None,
    extra_ca: Path | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> list[Baked]:
    """Bake `agent` (`version`, default its pin) into every agent image of the selection at `path`.

    Raises InputError (exit 2) for a bad selection, agent, version, missing
    artifacts or an unusable record; BakeFailed (exit 1) when the engine or
    the registry fails.
    """
    selection = load_selection(path, None)
    if agent not in bakeable():
        raise InputError(f"--agent {agent}: only {', '.join(bakeable())} can be baked")
    version = version or bake_of(agent).version
    artifacts = artifacts or default_artifacts()
    record_path = SelectionPaths(selection.path).agent_images
    bases = list(dict.fromkeys(selection.tasks[task_id].agent_image for task_id in selection.task_ids))
    if not registry.strip() or "/" in registry:
        raise InputError(f"--registry {registry!r}: expected HOST[:PORT] of a registry the workers pull from")
    results: list[Baked] = []
    record_path.parent.mkdir(parents=True, exist_ok=True)
    # One bake of a selection at a time: the record is read, extended and replaced.
    with open(SelectionPaths(selection.path).agent_images_lock, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            images = load_agent_images(record_path)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        try:
            with Baker(artifacts=artifacts, extra_ca=extra_ca, log=log) as baker:
                for base in bases:
                    started = time.monotonic()
                    repository = f"{registry}/{REPOSITORY}/{agent}"
                    baked, action = baker.bake(
                        base, agent, version, repository, images.find(base, agent, version)
                    )
                    images = images.replace(baked)
                    _write(record_path, images)
                    results.append(Baked(baked, action, time.monotonic() - started))
                    log(f"{agent} {version} on {base}: {action} -> {baked.image}")
        except RecipeError as exc:
            raise InputError(str(exc)) from None
        except BakeError as exc:
            raise BakeFailed(str(exc)) from None
    return results
