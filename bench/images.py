"""The images of item 4: pushed fresh to the loopback registry, removed from the engine afterwards."""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from typing import Any

BENCH_REPO = "sciencebench-bench"  # registry namespace of the images this benchmark pushes


def push_bench_images(base_image: str, registry: str, pushed: list[str]) -> list[str]:
    """Two fresh images (a label on the base image) pushed to bench-specific repos, by digest.

    Each ref is appended to `pushed` as soon as it exists (so it is removed even
    if a later step fails); both are then removed locally, so workers must pull.
    """
    import docker

    client = docker.from_env(timeout=300)
    nonce = datetime.now(UTC).strftime("%Y%m%d%H%M%S") + f"-{os.getpid()}"
    refs = []
    try:
        for role in ("agent", "verifier"):
            repository = f"{registry}/{BENCH_REPO}/pull-{role}"
            container = client.containers.create(base_image, ["true"], network_disabled=True)
            try:
                container.commit(
                    repository=repository, tag=nonce, changes=[f"LABEL sciencebench.bench={role}-{nonce}"]
                )
            finally:
                container.remove(force=True)
            for line in client.images.push(repository, tag=nonce, stream=True, decode=True):
                if "error" in line:
                    raise RuntimeError(f"push of {repository} failed: {line['error']}")
            digests = client.images.get(f"{repository}:{nonce}").attrs["RepoDigests"]
            digest = next(d for d in digests if d.startswith(f"{repository}@")).split("@", 1)[1]
            ref = f"{repository}:{nonce}@{digest}"
            refs.append(ref)
            pushed.append(ref)
        remove_images(pushed, client)  # the workers must pull them
    finally:
        client.close()
    return refs


def remove_images(refs: list[str], client: Any = None) -> None:
    """Remove these bench images (`repo:tag@digest`) from the local engine (never anything else)."""
    if not refs:
        return
    import docker

    own = client is None
    client = client or docker.from_env(timeout=300)
    try:
        for ref in refs:
            name_tag, _, digest = ref.partition("@")
            repository, _, tag = name_tag.rpartition(":")
            for target in (f"{repository}:{tag}", f"{repository}@{digest}"):
                with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
                    client.images.remove(target, noprune=False)
    finally:
        if own:
            client.close()


def absent_locally(refs: list[str]) -> list[str]:
    """The refs whose image (by digest) the local engine does not have."""
    import docker

    client = docker.from_env(timeout=60)
    absent = []
    for ref in refs:
        name_tag, _, digest = ref.partition("@")
        try:
            client.images.get(f"{name_tag.rpartition(':')[0]}@{digest}")
        except docker.errors.ImageNotFound:
            absent.append(ref)
    client.close()
    return absent
