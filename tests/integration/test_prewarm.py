"""A dry run with live workers pre-pulls the selection's images, each image onto one host."""

from __future__ import annotations

import json
import os
import time
import uuid

import docker
import pytest

from tests.fixtures.hosts import EVERYTHING, register_ready_host
from tests.integration.conftest import LEASE_SECONDS, Cluster

pytestmark = pytest.mark.integration


def _push_fresh_copy(client: docker.DockerClient, base_image: str, name: str) -> str:
    """The base image under a new repository in the loopback registry, absent locally."""
    registry = os.environ["SCIENCEBENCH_TEST_REGISTRY"]
    repository = f"{registry}/sciencebench-test/{name}-{uuid.uuid4().hex[:8]}"
    image = client.images.get(base_image)
    image.tag(repository, tag="t")
    for line in client.images.push(repository, tag="t", stream=True, decode=True):
        assert "error" not in line, line
    digest = next(d for d in client.images.get(f"{repository}:t").attrs["RepoDigests"]
                  if d.startswith(repository)).split("@")[1]  # fmt: skip
    client.images.remove(f"{repository}:t")
    return f"{repository}:t@{digest}"


def test_dry_run_spreads_the_images_over_the_worker_hosts_and_runs_nothing(cluster: Cluster) -> None:
    client = docker.from_env()
    agent = _push_fresh_copy(client, cluster.base_image, "agent")
    verifier = _push_fresh_copy(client, cluster.base_image, "verifier")
    cluster.start_workers(2, concurrency=1)
    path = cluster.selection({"001": {}, "002": {}}, agent_image=agent, verifier_image=verifier)
    done = cluster.submit(path, "warm", "--dry-run", "--placement", wait=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(": ready, 1 image(s)") == 2, done.stderr  # one image each
    for ref in (agent, verifier):
        assert client.images.get(ref.split(":t@")[0] + "@" + ref.split("@")[1])
    pulls = [json.loads(line) for line in (cluster.state_dir / "pulls.jsonl").read_text().splitlines()]
    mine = [p for p in pulls if p["ref"] in (agent, verifier)]
    assert sorted(p["ref"] for p in mine) == sorted([agent, verifier])  # one pull each, one host
    assert cluster.pier_runs() == []
    assert not (cluster.jobs_dir / "warm").exists()
    client.close()


def test_a_pre_pull_does_not_wait_for_a_host_that_stopped_beating(cluster: Cluster) -> None:
    """A host that beat a moment ago and then died (no worker consumes its queue): the dry run ends."""
    client = docker.from_env()
    agent = _push_fresh_copy(client, cluster.base_image, "agent")
    client.close()
    register_ready_host(cluster.redis.url, "w9@gone", EVERYTHING.model_copy(update={"slots": 1}))  # no worker
    path = cluster.selection({"001": {}}, agent_image=agent, verifier_image=agent)
    started = time.monotonic()
    done = cluster.submit(path, "warm-gone", "--dry-run", wait=False)
    assert done.returncode == 0, done.stderr
    assert "pre-pull: w9@gone: stopped beating" in done.stderr, done.stderr
    assert time.monotonic() - started < 6 * LEASE_SECONDS + 20, done.stderr
