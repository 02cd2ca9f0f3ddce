"""The Docker side of baking agent-ready images: facts about a base image, install, push, probe.

An install runs as a root shell script in a container of the task image
with `network_mode=none` and the host-fetched artifacts mounted read-only
(see `sciencebench.bake.recipes`); the container is then committed. A
baked image is pushed to a registry and named by digest, like every task
image; it is looked up there by tag first, so baking the same inputs twice
builds nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import docker
import docker.errors
import docker.types

from sciencebench.bake.recipes import MOUNT_DIR, Recipe, bake_spec, image_tag, render
from sciencebench.core.agentimages import BakedImage
from sciencebench.core.errors import SciencebenchError
from sciencebench.core.images import image_digest, image_repository
from sciencebench.worker.docker.engine import ENGINE_ERRORS, connect, one_line

Action = Literal["built", "found in registry", "up to date"]

BUILD_TIMEOUT_SEC = 1800


class BakeError(SciencebenchError, RuntimeError):
    """A bake step failed on the engine or the registry (one line why)."""


def ensure_image(client: docker.DockerClient, ref: str) -> None:
    """Make the digest-pinned `ref` present locally (pull it by digest when missing)."""
    try:
        client.images.get(ref)
        return
    except docker.errors.ImageNotFound:
        pass
    except ENGINE_ERRORS as exc:
        raise BakeError(f"inspecting {ref}: {one_line(str(exc))}") from None
    try:
        client.images.pull(image_repository(ref), tag=image_digest(ref))
    except ENGINE_ERRORS as exc:
        raise BakeError(f"pulling {ref}: {one_line(str(exc))}") from None


def run_offline(
    client: docker.DockerClient, image: str, command: list[str], timeout_sec: int = 120
) -> tuple[int, str]:
    """Run `command` in a network-less, throw-away container of `image`; `(exit code, output)`."""
    try:
        container = client.containers.run(image, command, detach=True, network_mode="none", user="root")
    except ENGINE_ERRORS as exc:
        raise BakeError(f"running {image}: {one_line(str(exc))}") from None
    try:
        status = container.wait(timeout=timeout_sec)
        output = container.logs().decode(errors="replace")
        return int(status.get("StatusCode", 1)), output
    except ENGINE_ERRORS as exc:
        raise BakeError(f"running {image}: {one_line(str(exc))}") from None
    finally:
        with contextlib.suppress(*ENGINE_ERRORS):
            container.remove(force=True)


def image_python(client: docker.DockerClient, ref: str) -> str | None:
    """`X.Y` of the image's `python3` (3.10 or newer), None without one."""
    code, output = run_offline(
        client, ref, ["sh", "-c", "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'"]
    )
    version = output.strip().splitlines()[-1] if output.strip() else ""
    if code != 0 or version.count(".") != 1:
        return None
    major, minor = (int(part) for part in version.split("."))
    return version if (major, minor) >= (3, 10) else None


def registry_digest(client: docker.DockerClient, repository: str, tag: str) -> str | None:
    """The digest the registry holds for `repository:tag`, None when it holds none."""
    try:
        data = client.images.get_registry_data(f"{repository}:{tag}")
    except docker.errors.NotFound:
        return None
    except docker.errors.APIError as exc:
        if exc.status_code in (401, 403, 404) or "manifest unknown" in str(exc):
            return None
        raise BakeError(f"asking the registry for {repository}:{tag}: {one_line(str(exc))}") from None
    except ENGINE_ERRORS as exc:
        raise BakeError(f"asking the registry for {repository}:{tag}: {one_line(str(exc))}") from None
    return str(data.id)


def build(client: docker.DockerClient, recipe: Recipe, base: str, repository: str, tag: str) -> None:
    """Run `recipe` on `base` with no network and its artifacts mounted read-only; commit as `repository:tag`.

    The committed image keeps the base image's configuration (entrypoint,
    command, user, working directory, environment) plus the recipe's
    environment and labels. Raises BakeError with the script's last output.
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
            network_mode="none", mounts=mounts,
        )  # fmt: skip
    except ENGINE_ERRORS as exc:
        raise BakeError(f"starting the install on {base}: {one_line(str(exc))}") from None
    try:
        container.start()
        status = container.wait(timeout=BUILD_TIMEOUT_SEC)
        if status.get("StatusCode") != 0:
            output = container.logs().decode(errors="replace")
            raise BakeError(
                f"installing {recipe.agent} {recipe.version} on {base} failed "
                f"(exit {status.get('StatusCode')}): {one_line(output[-600:])}"
            )
        changes = [f"LABEL {key}={json.dumps(value)}" for key, value in recipe.labels.items()]
        changes += [f"ENV {key}={json.dumps(value)}" for key, value in recipe.env.items()]
        changes += [f"ENTRYPOINT {json.dumps(entrypoint)}"] if entrypoint else []
        changes += [f"CMD {json.dumps(config.get('Cmd') or [])}", f"USER {config.get('User') or 'root'}"]
        container.commit(repository=repository, tag=tag, changes=changes)
    except ENGINE_ERRORS as exc:
        raise BakeError(f"installing {recipe.agent} on {base}: {one_line(str(exc))}") from None
    finally:
        with contextlib.suppress(*ENGINE_ERRORS):
            container.remove(force=True)


def push(client: docker.DockerClient, repository: str, tag: str) -> str:
    """Push `repository:tag`; return it pinned as `repository:tag@sha256:...`."""
    try:
        for line in client.images.push(repository, tag=tag, stream=True, decode=True):
            if "error" in line:
                raise BakeError(f"pushing {repository}:{tag}: {one_line(str(line['error']))}")
        digests = client.images.get(f"{repository}:{tag}").attrs.get("RepoDigests") or []
    except ENGINE_ERRORS as exc:
        raise BakeError(f"pushing {repository}:{tag}: {one_line(str(exc))}") from None
    found = [d for d in digests if d.startswith(f"{repository}@")]
    if not found:
        raise BakeError(f"pushing {repository}:{tag}: the engine recorded no digest")
    return f"{repository}:{tag}@{found[0].split('@', 1)[1]}"


def codex_wire_apis(client: docker.DockerClient, image: str) -> list[str]:
    """The wire APIs the image's Codex accepts, asked of the binary itself (no network).

    A provider with `wire_api = "chat"` is configured on the command line;
    current releases refuse it while loading the configuration, before any
    request ("`wire_api = "chat"` is no longer supported").
    """
    provider = 'model_providers.probe={name="probe", base_url="http://127.0.0.1:9/v1", wire_api="chat"}'
    script = (
        'export CODEX_HOME="$(mktemp -d)" OPENAI_API_KEY=probe; cd "$CODEX_HOME"; '
        f"timeout 30 codex -c model_provider=probe -c '{provider}' exec --skip-git-repo-check "
        "-- probe </dev/null 2>&1"
    )
    _, output = run_offline(client, image, ["sh", "-c", script])
    if "no longer supported" in output and "wire_api" in output:
        return ["responses"]
    return ["responses", "chat"]


class Baker:
    """One engine connection baking images: `with Baker(...) as baker: baker.bake(...)`."""

    def __init__(self, *, artifacts: Path, extra_ca: Path | None, log: Callable[[str], None]) -> None:
        self.artifacts = artifacts
        self.extra_ca = extra_ca
        self.log = log
        self.client = connect(timeout_sec=BUILD_TIMEOUT_SEC)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.client.close()

    def bake(
        self, base: str, agent: str, version: str, repository: str, recorded: list[BakedImage]
    ) -> tuple[BakedImage, Action]:
        """`base` with `agent` `version` preinstalled, as `repository:<tag>@<digest>`.

        Builds and pushes only when the registry lacks the tag of these exact
        inputs; an entry of `recorded` with the same inputs and digest is
        returned as it is ("up to date"). Raises RecipeError (missing
        artifacts, unsuitable image) and BakeError (engine or registry).
        """
        client = self.client
        spec = bake_spec(agent, version)
        ensure_image(client, base)
        python = image_python(client, base) if spec.wheels else None
        recipe = render(agent, version, base, self.artifacts, python=python, extra_ca=self.extra_ca)
        tag = image_tag(agent, version, base, recipe.inputs_sha256)
        digest = registry_digest(client, repository, tag)
        same = [i for i in recorded if i.inputs_sha256 == recipe.inputs_sha256]
        if digest is not None and same and image_digest(same[0].image) == digest:
            return same[0], "up to date"
        action: Action
        if digest is not None:
            pinned, action = f"{repository}:{tag}@{digest}", "found in registry"
            if spec.wire_api_probe:
                ensure_image(client, pinned)  # probed below
        else:
            self.log(f"{agent} {version} on {base}: building {repository}:{tag} (no network)")
            build(client, recipe, base, repository, tag)
            self.log(f"{agent} {version}: pushing {repository}:{tag}")
            pinned, action = push(client, repository, tag), "built"
        wire_apis = codex_wire_apis(client, pinned) if spec.wire_api_probe else None
        baked = BakedImage(
            base_image=base, agent=agent, version=version, image=pinned,
            inputs_sha256=recipe.inputs_sha256, wire_apis=wire_apis,
        )  # fmt: skip
        return baked, action
