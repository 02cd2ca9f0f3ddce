"""Private Docker Engines (`tests/fixtures/engines.py`): one image store per simulated host."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sciencebench.core.images import repo_digests_contain
from tests.fixtures.engines import Engine, EngineFactory, loopback_registry, private_engine
from tests.fixtures.registry import Published

pytestmark = pytest.mark.integration


@pytest.fixture
def published() -> Iterator[Published]:
    pushed = Published(loopback_registry())
    yield pushed
    pushed.cleanup()


def holds(engine: Engine, ref: str) -> bool:
    return any(repo_digests_contain(image.get("RepoDigests") or [], ref) for image in engine.image_list())


def test_each_engine_has_its_own_image_store(engines: EngineFactory, published: Published) -> None:
    ref = published.unique(f"engines-{uuid.uuid4().hex[:6]}", size=64 << 10)
    h0, h1 = engines("h0", "h1")
    assert h0.docker_host != h1.docker_host and h0.data_root != h1.data_root
    assert h0.env()["SCIENCEBENCH_STATE_DIR"] != h1.env()["SCIENCEBENCH_STATE_DIR"]
    h0.pull(ref)
    assert holds(h0, ref) and not holds(h1, ref)
    with contextlib.closing(docker.from_env()) as session:  # the session's Engine never saw it
        assert not any(
            repo_digests_contain(i.attrs.get("RepoDigests") or [], ref) for i in session.images.list()
        )
    h1.pull(ref)
    h0.docker("rmi", ref)
    assert not holds(h0, ref) and holds(h1, ref)
    # A process given the Engine's env talks to that Engine: the docker CLI lists the image there.
    listed = h1.docker("images", "--digests", "--format", "{{.Repository}}@{{.Digest}}")
    assert ref.split("@")[1] in listed


def test_leaving_an_engine_stops_its_daemon_and_removes_its_data(tmp_path: Path) -> None:
    with private_engine("gone", tmp_path / "gone", loopback_registry()) as engine:
        assert (engine.data_root / "image").is_dir()  # the daemon's own store
        sock = Path(engine.docker_host.removeprefix("unix://"))
        pid = int((sock.parent / "docker.pid").read_text())
        assert engine.data_root.is_dir()
    assert not engine.data_root.exists() and not sock.parent.exists() and not engine.state_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        assert str(engine.data_root) not in mounts.read()
