"""Installing into an image with no network: a container of the image, artifacts mounted read-only, committed.

Shared by `images bake` (`bake.builder`, then pushed) and a worker's online
agent install (`network.offlineinstall`, kept local): the image's own shell,
environment and binaries run here, and only here, and always with
`network_mode=none`. Needs Docker, never the worker side (the network
policy environment imports it).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping

import docker
import docker.errors
import docker.types

from sciencebench.bake.recipes import MOUNT_DIR, Recipe
from sciencebench.core.compose_policy import POLICY_LOGGING
from sciencebench.core.errors import SciencebenchError
from sciencebench.core.images import image_digest, image_repository
from sciencebench.core.settings import DEFAULT_PIDS_LIMIT

BUILD_TIMEOUT_SEC = 1800
# The task image's own code runs in these containers: bounded as a trial's are, in processes (a fork
# bomb would take every pid of the host) and memory (a hog would take a neighbour trial's), swap none.
INSTALL_PIDS_LIMIT = DEFAULT_PIDS_LIMIT
INSTALL_MEMORY = 4 * 2**30


def _bounded_logs() -> docker.types.LogConfig:
    """The trials' bounded output (`POLICY_LOGGING`): what the Engine keeps of PID 1's on the host's disk."""
    return docker.types.LogConfig(type=POLICY_LOGGING["driver"], config=dict(POLICY_LOGGING["options"]))


# What a call to the engine may raise: the SDK's errors, and the connection errors (OSError) beneath them.
ENGINE_ERRORS = (docker.errors.DockerException, OSError)


class BakeError(SciencebenchError, RuntimeError):
    """A bake step failed on the engine or the registry (one line why)."""


def flat(text: str, limit: int = 400) -> str:
    """`text` on one line, cut to `limit` characters (engine messages can be long)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def ensure_image(client: docker.DockerClient, ref: str) -> None:
    """Make `ref` present locally (pulled when missing: by digest when it is pinned)."""
    try:
        client.images.get(ref)
        return
    except docker.errors.ImageNotFound:
        pass
    except ENGINE_ERRORS as exc:
        raise BakeError(f"inspecting {ref}: {flat(str(exc))}") from None
    try:
        if "@sha256:" in ref:
            client.images.pull(image_repository(ref), tag=image_digest(ref))
        else:
            client.images.pull(ref)
    except ENGINE_ERRORS as exc:
        raise BakeError(f"pulling {ref}: {flat(str(exc))}") from None


def run_offline(
    client: docker.DockerClient,
    image: str,
    command: list[str],
    timeout_sec: int = 120,
    labels: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    """Run `command` in a network-less, throw-away container of `image`; `(exit code, output)`.

    `labels`: the container's (a trial's install carries its trial's, so that
    the trial's disk watch measures it and its cleanup removes it).
    """
    try:
        container = client.containers.run(
            image, command, detach=True, network_mode="none", user="root",
            pids_limit=INSTALL_PIDS_LIMIT, mem_limit=INSTALL_MEMORY, memswap_limit=INSTALL_MEMORY,
            log_config=_bounded_logs(), labels=dict(labels or {}),
        )  # fmt: skip
    except ENGINE_ERRORS as exc:
        raise BakeError(f"running {image}: {flat(str(exc))}") from None
    try:
        status = container.wait(timeout=timeout_sec)
        output = container.logs().decode(errors="replace")
        return int(status.get("StatusCode", 1)), output
    except ENGINE_ERRORS as exc:
        raise BakeError(f"running {image}: {flat(str(exc))}") from None
    finally:
        with contextlib.suppress(*ENGINE_ERRORS):
            container.remove(force=True)


def image_python(
    client: docker.DockerClient, ref: str, labels: Mapping[str, str] | None = None
) -> str | None:
    """`X.Y` of the image's `python3` (3.10 or newer), None without one (`labels`: `run_offline`'s)."""
    code, output = run_offline(
        client,
        ref,
        ["sh", "-c", "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'"],
        labels=labels,
    )
    version = output.strip().splitlines()[-1] if output.strip() else ""
    if code != 0 or version.count(".") != 1:
        return None
    major, minor = (int(part) for part in version.split("."))
    return version if (major, minor) >= (3, 10) else None


def build(
    client: docker.DockerClient,
    recipe: Recipe,
    base: str,
    repository: str,
    tag: str,
    labels: Mapping[str, str] | None = None,
) -> None:
    """Run `recipe` on `base` with no network and its artifacts mounted read-only; commit as `repository:tag`.

    The committed image keeps the base image's configuration (entrypoint,
    command, user, working directory, environment) plus the recipe's
    environment and labels. `labels` are the container's only (`run_offline`):
    the commit blanks them, so no container of the image passes for the
    trial that built it. Raises BakeError with the script's last output.
    """
    try:
        config = client.images.get(base).attrs.get("Config") or {}
        # Bind mounts, not `volumes=`: the SDK would also declare them as image
        # volumes, and the commit would keep those declarations.
        mounts = [
            docker.types.Mount(str(MOUNT_DIR / name), str(path.resolve()), type="bind", read_only=True)
            for name, path in recipe.mounts.items()
        ]
        # A commit keeps the container's entrypoint unless told another, and cannot
        # be told "none": override the entrypoint only when the base image has one.
        entrypoint = config.get("Entrypoint") or []
        command = [recipe.script] if entrypoint else ["/bin/sh", "-c", recipe.script]
        container = client.containers.create(
            base, command=command, entrypoint=["/bin/sh", "-c"] if entrypoint else None, user="root",
            network_mode="none", mounts=mounts, log_config=_bounded_logs(), labels=dict(labels or {}),
            pids_limit=INSTALL_PIDS_LIMIT, mem_limit=INSTALL_MEMORY, memswap_limit=INSTALL_MEMORY,
        )  # fmt: skip
    except ENGINE_ERRORS as exc:
        raise BakeError(f"starting the install on {base}: {flat(str(exc))}") from None
    try:
        container.start()
        status = container.wait(timeout=BUILD_TIMEOUT_SEC)
        if status.get("StatusCode") != 0:
            output = container.logs().decode(errors="replace")
            raise BakeError(
                f"installing {recipe.agent} {recipe.version} on {base} failed "
                f"(exit {status.get('StatusCode')}): {flat(output[-600:])}"
            )
        # A commit keeps the container's labels: an empty value is the nearest to none it can say.
        kept = {key: "" for key in labels or {}} | dict(recipe.labels)
        changes = [f"LABEL {key}={json.dumps(value)}" for key, value in kept.items()]
        changes += [f"ENV {key}={json.dumps(value)}" for key, value in recipe.env.items()]
        changes += [f"ENTRYPOINT {json.dumps(entrypoint)}"] if entrypoint else []
        changes += [f"CMD {json.dumps(config.get('Cmd') or [])}", f"USER {config.get('User') or 'root'}"]
        container.commit(repository=repository, tag=tag, changes=changes)
    except ENGINE_ERRORS as exc:
        raise BakeError(f"installing {recipe.agent} on {base}: {flat(str(exc))}") from None
    finally:
        with contextlib.suppress(*ENGINE_ERRORS):
            container.remove(force=True)
