"""Fixtures shared by every tier: real redis-server, the fixture base image."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.services import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def base_image() -> str:
    """A digest-pinned Debian image in the loopback registry (scripts/fixture-images.sh)."""
    ref = os.environ.get("SB_BASE_IMAGE")
    if not ref:
        raise RuntimeError("SB_BASE_IMAGE is unset: run the tests through scripts/test.sh")
    return ref


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Host-local state (pull locks, pull log) private to this test session."""
    return tmp_path_factory.mktemp("host-state")
