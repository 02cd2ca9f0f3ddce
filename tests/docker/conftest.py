"""Docker tier: real Docker Engine 28, real loopback registry, real Pier 0.3.0."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sciencebench.demo import build_demo_selection


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    client = docker.from_env(timeout=300)
    yield client
    client.close()


@pytest.fixture(scope="session")
def registry() -> str:
    value = os.environ.get("SCIENCEBENCH_TEST_REGISTRY")
    if not value:
        raise RuntimeError("SCIENCEBENCH_TEST_REGISTRY is unset: run the tests through scripts/test.sh")
    return value


@pytest.fixture(scope="session")
def demo_selection(tmp_path_factory: pytest.TempPathFactory, base_image: str, registry: str) -> Path:
    """The demo's two tasks with freshly built, pushed, digest-pinned images."""
    return build_demo_selection(tmp_path_factory.mktemp("demo") / "selection", base_image, registry)
