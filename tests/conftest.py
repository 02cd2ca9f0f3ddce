"""Fixtures shared by every tier: real redis-server, the embedded store, the fixture base image."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sciencebench.coordination import embedded
from sciencebench.coordination.redis import RedisCoordinator
from tests import tiers
from tests.fixtures.services import RedisServer

TIERS = ("unit", "integration", "docker")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test carries exactly one tier marker, so `-m <tier>` selects each test exactly once.

    Tests that must run with nothing beside them get the `alone` marker, and the longest modules
    come first (tests/tiers.py).
    """
    items.sort(key=lambda item: tiers.order(item.nodeid))  # stable: the rest as collected
    wrong = []
    for item in items:
        if tiers.is_alone(item.nodeid):
            item.add_marker(pytest.mark.alone)
        marked = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if len(marked) != 1:
            wrong.append(f"{item.nodeid}: {', '.join(marked) or 'no tier marker'}")
    if wrong:
        raise pytest.UsageError(
            f"every test needs exactly one of the tier markers {', '.join(TIERS)}:\n  " + "\n  ".join(wrong)
        )


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, a module to a worker, but `tiers.TOGETHER`'s modules to one worker."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModulesTogether(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return tiers.group(nodeid)

    return ModulesTogether(config, log)


# Tests that may skip in CI, each with why. Everything else that skips there fails instead: a real tier
# skipped on a machine that followed the README would pass without ever having run. Empty today.
MAY_SKIP_IN_CI: dict[str, str] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """With `CI=true`, a skip that is not on `MAY_SKIP_IN_CI` is reported as a failure."""
    report: pytest.TestReport = yield
    if (
        report.skipped
        and not hasattr(report, "wasxfail")
        and os.environ.get("CI") == "true"
        and item.nodeid not in MAY_SKIP_IN_CI
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, and not on tests/conftest.py's MAY_SKIP_IN_CI: {reason}"
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With SCIENCEBENCH_FAILED_TESTS=<file>, every failed test's id is added to it (scripts/test.sh
    runs them again alone)."""
    target = os.environ.get("SCIENCEBENCH_FAILED_TESTS")
    if target and report.failed:
        with open(target, "a", encoding="utf-8") as failed:
            failed.write(report.nodeid + "\n")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def store_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir whose embedded store (`coordination.embedded`) runs all session (one per xdist worker)."""
    state = tmp_path_factory.mktemp("store")
    embedded.ensure(state)
    return state  # stopped with the other embedded stores of the session (`_embedded_stores_stop`)


@pytest.fixture
def store(store_state: Path) -> Iterator[RedisCoordinator]:
    """A coordinator on the session's embedded store, emptied for the test."""
    coord = embedded.coordinator(store_state)
    coord.client.flushdb()
    yield coord
    coord.close()


@pytest.fixture(scope="session", autouse=True)
def _embedded_stores_stop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """At the session's end, stop every embedded store started under its temp dirs (by `submit --local`s too).

    They run on after the command that started them, by design; a test session leaves none behind.
    """
    yield
    base = tmp_path_factory.getbasetemp()
    for depth in range(4):
        for pidfile in base.glob("/".join(["*"] * depth + [embedded.STORE_DIR, embedded.PIDFILE])):
            embedded.stop(pidfile.parent.parent)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, which it may stop, pause or restart (the session's is shared)."""
    server = RedisServer(tmp_path / "own-redis")
    server.start()
    yield server
    if server.proc and server.proc.poll() is None:
        server.proc.send_signal(signal.SIGCONT)  # a stopped (SIGSTOP) server would ignore the SIGTERM
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


@pytest.fixture
def ready_broker(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The session's broker, with one live worker host that can run any job, as SCIENCEBENCH_BROKER_URL.

    For tests of `submit --dry-run` (and submits that stop before sending): they check the live hosts.
    """
    from tests.fixtures.hosts import register_ready_host

    register_ready_host(redis_server.url)
    monkeypatch.setenv("SCIENCEBENCH_BROKER_URL", redis_server.url)
    return redis_server.url
