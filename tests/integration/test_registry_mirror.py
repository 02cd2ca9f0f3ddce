"""Each image leaves the upstream registry once per cluster: four hosts pull through one real mirror.

The upstream is the loopback registry behind the counting proxy
(`tests/fixtures/throttled_registry.py`: it logs every manifest request);
the mirror is Debian's Distribution registry in proxy mode in front of it
(`tests/fixtures/mirror.py`). Four worker hosts, each on a Docker Engine of
its own, with `--registry-mirror UPSTREAM=MIRROR`, all pull every image of
the job (`--prepull` without placement: every host pulls what it lacks, at
once) and run its trials (the fake Pier): the upstream serves each image's
manifest once. The same job on the same hosts without the mirror makes a
manifest GET per host and image. A mirror that serves another manifest
under the pinned digest is refused by the Engine: the digest pins the content.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sciencebench.coordination.placement import pinned
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.coordination.redis.placement import RedisPlacementStore
from sciencebench.core.errors import PullError
from sciencebench.core.images import image_digest
from sciencebench.core.mirrors import parse_mirrors, through_mirror
from sciencebench.core.settings import Settings
from sciencebench.worker.docker.images import read_pull_log
from sciencebench.worker.runtime import DockerRuntime
from tests.fixtures.engines import EngineFactory, loopback_registry
from tests.fixtures.mirror import pull_through
from tests.fixtures.registry import Published
from tests.fixtures.services import stop_workers
from tests.fixtures.throttled_registry import Throttle, serve, through
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

MIB = 1 << 20
HOSTS = ("mh0", "mh1", "mh2", "mh3")


def _records(cluster: Cluster, job: str) -> list[dict[str, Any]]:
    trials = cluster.jobs_dir / job / ".sciencebench" / "trials"
    return [json.loads(path.read_text()) for path in sorted(trials.glob("*.json"))]


def _manifest_gets(throttle: Throttle, since: int = 0) -> Counter[str]:
    """Manifest GETs the upstream answered (200), per digest, from the `since`th log entry on."""
    return Counter(
        entry["path"].rsplit("/", 1)[1]
        for entry in throttle.log[since:]
        if entry["method"] == "GET" and entry["status"] == 200
    )


def test_through_the_mirror_each_image_leaves_the_upstream_once_for_four_hosts(
    cluster: Cluster, engines: EngineFactory, kit_image: str, published: Published, tmp_path: Path
) -> None:
    uid = uuid.uuid4().hex[:8]
    originals = [published.unique(f"mirror-{n}-{uid}", size=MIB) for n in range(3)]
    throttle = Throttle(upstream=loopback_registry())
    with serve(throttle) as upstream, pull_through(upstream, tmp_path / "mirror") as mirror:
        refs = [through(ref, upstream) for ref in originals]
        digests = {image_digest(ref) for ref in refs}
        mirrors = parse_mirrors([f"{upstream}={mirror}"])
        hosts = engines(*HOSTS, proxy_image=kit_image)
        workers = cluster.start_workers(
            len(hosts), on=hosts, extra=["--registry-mirror", f"{upstream}={mirror}"]
        )
        # Task i runs image i as its agent's and its separate verifier's image.
        by_task = {f"{n:03d}": ref for n, ref in enumerate(refs, start=1)}
        path = cluster.selection({task: {} for task in by_task}, root=tmp_path / "sel", agent_image=by_task,
                                 verifier_image=by_task)  # fmt: skip
        done = cluster.submit(path, "mirrored", "--prepull", "--n-concurrent", "4")
        assert done.returncode == 0, done.stdout + done.stderr
        records = _records(cluster, "mirrored")
        assert len(records) == 3 and all(r["rewards"] == {"reward": 1.0} for r in records), records
        for host in hosts:  # every host pulled every image, through the mirror, by the mirror's name
            assert all(host.holds(through_mirror(ref, mirrors)) and not host.holds(ref) for ref in refs)
            pulled = read_pull_log(host.state_dir)
            assert {record.digest for record in pulled} == digests
            assert all(record.ref.startswith(f"{mirror}/") for record in pulled)
        # What the hosts report for placement names the images as the trials do: the upstream's names.
        reported = RedisPlacementStore(RedisCoordinator(cluster.redis.url)).holdings()
        assert len(reported) == len(hosts), reported
        wanted = set(pinned(refs))
        assert all(wanted <= set(held.images) for held in reported.values()), reported
        with_mirror = _manifest_gets(throttle)
        assert with_mirror == dict.fromkeys(digests, 1), throttle.log  # once per image for the cluster

        # The comparison, same hosts: without the mirror every host asks the upstream itself.
        stop_workers(workers)
        for host in hosts:
            host.docker("rmi", *(through_mirror(ref, mirrors) for ref in refs))
        since = len(throttle.log)
        cluster.start_workers(len(hosts), on=hosts)
        again = cluster.submit(path, "direct", "--prepull", "--n-concurrent", "4")
        assert again.returncode == 0, again.stdout + again.stderr
        assert all(r["rewards"] == {"reward": 1.0} for r in _records(cluster, "direct"))
        direct = _manifest_gets(throttle, since)
        assert direct == dict.fromkeys(digests, len(hosts)), throttle.log[since:]


def test_a_mirror_cannot_hand_over_another_manifest_under_the_pinned_digest(
    engines: EngineFactory, published: Published, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uid = uuid.uuid4().hex[:8]
    wanted, other = (published.unique(f"forged-{name}-{uid}", size=4096) for name in ("wanted", "other"))
    registry = loopback_registry()
    # A lying mirror: asked for the pinned manifest, it answers with another image's.
    wanted_path = f"/v2/{wanted.split('/', 1)[1].replace('@', '/manifests/')}"
    other_path = f"/v2/{other.split('/', 1)[1].replace('@', '/manifests/')}"
    throttle = Throttle(upstream=registry, rewrite={wanted_path: other_path})
    (host,) = engines("forge0")
    with serve(throttle) as liar:
        for name, value in host.env().items():
            monkeypatch.setenv(name, value)
        settings = Settings.from_env({"SCIENCEBENCH_STATE_DIR": str(host.state_dir),
                                      "SCIENCEBENCH_REGISTRY_MIRROR": f"{registry}={liar}"})  # fmt: skip
        runtime = DockerRuntime(settings)
        (local,) = runtime.local_refs([wanted])
        assert local.startswith(f"{liar}/") and image_digest(local) == image_digest(wanted)
        with pytest.raises(PullError, match=r"pull of .* failed"):
            runtime.ensure_images([wanted], "linux/amd64", skip_pull=False)
        assert any(e["path"] == wanted_path for e in throttle.log)  # the forged answer was served
        held = [d for image in host.image_list() for d in image.get("RepoDigests") or []]
        assert not [d for d in held if d.endswith((image_digest(wanted), image_digest(other)))], held
        assert read_pull_log(host.state_dir) == []
