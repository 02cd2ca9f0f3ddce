"""Fixtures shared by every tier: real redis-server, the fixture base image."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.services import RedisServer

# Submits of codex, claude-code or mini-swe-agent need baked agent images
# (sciencebench.login.agentimages). Most tests exercise provider translation,
# argv and records with no baked image, so they let Pier install, as a worker
# with internet would; tests/unit/test_agent_images.py and
# tests/docker/test_real_agents.py set the default ("baked") back.
os.environ.setdefault("SCIENCEBENCH_AGENT_INSTALL", "pier")


TIERS = ("unit", "integration", "docker")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test carries exactly one tier marker, so `-m <tier>` selects each test exactly once."""
    wrong = []
    for item in items:
        tiers = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if len(tiers) != 1:
            wrong.append(f"{item.nodeid}: {', '.join(tiers) or 'no tier marker'}")
    if wrong:
        raise pytest.UsageError(
            f"every test needs exactly one of the tier markers {', '.join(TIERS)}:\n  " + "\n  ".join(wrong)
        )


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
