"""The Docker side of baking agent-ready images: facts about a base image, install, push, probe.

An install runs as a root shell script in a container of the task image
with `network_mode=none` and the host-fetched artifacts mounted read-only
(`sciencebench.bake.offline`, the recipes of `sciencebench.bake.recipes`);
the container is then committed. A baked image is pushed to a registry and
named by digest, like every task image; it is looked up there by tag first,
so baking the same inputs twice builds nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import docker
import docker.errors

from sciencebench.bake.offline import (
    BUILD_TIMEOUT_SEC,
    ENGINE_ERRORS,
    BakeError,
    build,
    ensure_image,
    image_python,
    run_offline,
)
from sciencebench.bake.recipes import bake_spec, image_tag, render
from sciencebench.core.agentimages import BakedImage
from sciencebench.core.images import image_digest
from sciencebench.worker.docker.engine import connect, one_line

Action = Literal["built", "found in registry", "up to date"]


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
