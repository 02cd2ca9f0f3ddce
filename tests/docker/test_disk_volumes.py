"""A disk fill through a volume is bounded as one through the writable layer.

An image's `VOLUME` (or a task's volume) is mounted beside the container's
writable layer, so what the agent writes there is no part of `SizeRw`. A
real container of a task image with `VOLUME /data` writes past the limit into
it, and the worker's watch (`worker.docker.diskwatch`) must find and kill it.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator

import docker
import pytest

from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL
from sciencebench.dockerhost.naming import compose_project_name
from sciencebench.worker.docker.diskwatch import DiskWatch

pytestmark = pytest.mark.docker

TRIAL = "review34vol__Zq8mX2k"
LIMIT = 32 * 2**20


@pytest.fixture
def volume_container(docker_client: docker.DockerClient, base_image: str) -> Iterator[str]:
    dockerfile = io.BytesIO(f"FROM {base_image}\nVOLUME /data\n".encode())
    image, _ = docker_client.images.build(
        fileobj=dockerfile, tag="review34-volume-task", network_mode="none", rm=True
    )
    container = docker_client.containers.run(
        image.id,
        ["sh", "-c", "dd if=/dev/zero of=/data/fill bs=1M count=64 && sync && sleep 120"],
        name="review34-volume-fill",
        labels={COMPOSE_PROJECT_LABEL: compose_project_name(TRIAL)},
        network_mode="none",
        detach=True,
    )
    try:
        yield container.id
    finally:
        container.remove(force=True, v=True)
        docker_client.images.remove("review34-volume-task", force=True)


def test_a_fill_of_an_image_volume_is_past_the_disk_limit(
    docker_client: docker.DockerClient, volume_container: str
) -> None:
    watch = DiskWatch(LIMIT, lambda: [TRIAL])
    try:
        deadline = time.monotonic() + 60
        while not watch.check() and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        watch.stop()
    assert watch.exceeded is not None, "64 MiB written to an image's VOLUME passed a 32 MiB disk limit"
    assert "writable layer and volumes" in watch.exceeded
    state = docker_client.api.inspect_container(volume_container)["State"]
    assert not state["Running"]
