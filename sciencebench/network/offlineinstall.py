"""The online agent install: the harness's pinned artifacts found or fetched on this host, installed offline.

Not Pier's derived build, whose `RUN` steps would run the task image's own
bash, environment and binaries with a network: this host's artifact cache
holds the artifacts, or `bake.fetch` fetches them (npm tarballs checked
against their integrity), and they are installed as `images bake` does
(`bake.offline.build`: a container of the task image, `network_mode=none`,
committed) into a local image `sciencebench-online/<agent>:<version>-<image
id>-<inputs>`, which the trial runs as a baked one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import docker
import docker.errors

from sciencebench.bake import offline
from sciencebench.bake.fetch import NPM_BINARIES, fetch_npm, has_artifacts
from sciencebench.bake.offline import ENGINE_ERRORS, BakeError
from sciencebench.bake.recipes import RecipeError, artifact_dir, bake_spec, render

ONLINE_REPOSITORY = "sciencebench-online"


def _artifacts_for(
    agent: str, version: str, artifacts: Path, python: str | None, registry: str | None
) -> None:
    """Make `agent` `version`'s artifacts present in the cache (fetched when an npm harness's are missing)."""
    directory = artifact_dir(artifacts, agent, version)
    if has_artifacts(directory / f"py{python}" if python else directory):
        return
    if agent in NPM_BINARIES:
        fetch_npm(agent, version, artifacts, registry)
    # Otherwise `render` names what is missing and how to fetch it.


def install_offline(
    image: str,
    agent: str,
    version: str,
    artifacts: Path,
    npm_registry: str | None,
    labels: Mapping[str, str] | None = None,
) -> str:
    """`image` with `agent` `version` installed with no network, as a local image; its reference.

    Built once per task image, harness and inputs (an existing tag is
    reused). `labels` go on every container that runs the task image's code
    here (the trial's compose project and sciencebench's labels: the trial's
    disk watch measures them, its cleanup removes them). Raises RecipeError
    (the harness cannot be installed so: no recipe, missing or bad
    artifacts, no suitable Python) and BakeError (the engine, or the install
    script, failed).
    """
    spec = bake_spec(agent, version)
    try:
        client = docker.from_env(timeout=offline.BUILD_TIMEOUT_SEC)
    except ENGINE_ERRORS as exc:
        raise BakeError(f"the Docker Engine: {exc.__class__.__name__}") from None
    try:
        offline.ensure_image(client, image)
        python = offline.image_python(client, image, labels) if spec.wheels else None
        if spec.wheels and python is None:
            raise RecipeError(f"{agent} needs python3 (3.10 or newer) in the task image")
        _artifacts_for(agent, version, artifacts, python, npm_registry)
        recipe = render(agent, version, image, artifacts, python=python)
        try:
            image_id = str(client.images.get(image).id).removeprefix("sha256:")
        except ENGINE_ERRORS as exc:
            raise BakeError(f"inspecting {image}: {exc.__class__.__name__}") from None
        repository = f"{ONLINE_REPOSITORY}/{agent}"
        tag = f"{version}-{image_id[:12]}-{recipe.inputs_sha256[:12]}"
        try:
            client.images.get(f"{repository}:{tag}")
        except docker.errors.ImageNotFound:
            offline.build(client, recipe, image, repository, tag, labels)
        except ENGINE_ERRORS as exc:
            raise BakeError(f"inspecting {repository}:{tag}: {exc.__class__.__name__}") from None
        return f"{repository}:{tag}"
    finally:
        client.close()
