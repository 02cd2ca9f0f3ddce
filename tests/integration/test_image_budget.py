"""Worker hosts with an image budget (`worker --image-budget`), each on a Docker Engine of its own.

Real workers, real pulls from the loopback registry, real evictions, the
fake Pier. Three images of 3, 6 and 9 MiB and a budget of 16 MiB (any two
fit, not three) on 2 hosts x 3 slots: every trial completes, a host never
holds more than its budget plus the images its running (or claimed) trials
need, evictions are in each host's pull log and in `status`, no host is
paused for disk, and a trial whose pull cannot fit beside its host's running
trials goes back to the queue. Pier's build leftovers (dangling build images,
build cache) count against the budget and go before any task image.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from sciencebench.core.images import repo_digests_contain
from sciencebench.dockerhost.hostlocks import host_lock
from sciencebench.worker.docker import budget, imageholds, images
from tests.fixtures.engines import Engine, EngineFactory
from tests.fixtures.registry import Published
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

MIB = 1 << 20
BUDGET = 16 * MIB
PLATFORM = "linux/amd64"


# --- what a host holds, sampled while its trials run ---------------------------------


def _flocked_shared() -> set[tuple[int, int, int]]:
    """(major, minor, inode) of every file some process holds a shared flock on (/proc/locks)."""
    held: set[tuple[int, int, int]] = set()
    with open("/proc/locks", encoding="utf-8") as locks:
        for line in locks:
            fields = line.split()
            if len(fields) < 6 or fields[1] != "FLOCK" or fields[3] != "READ":
                continue  # a waiter ("->"), an exclusive lock or a POSIX lock
            major, minor, inode = fields[5].split(":")
            held.add((int(major, 16), int(minor, 16), int(inode)))
    return held


@dataclass(frozen=True)
class Sample:
    host: str
    present: dict[str, int]  # test image -> its size on the host's Engine
    held: frozenset[str]  # test images some trial of the host holds

    @property
    def size(self) -> int:
        return sum(self.present.values())

    @property
    def bound(self) -> int:
        """The budget plus the images the host's running (or claimed) trials need."""
        return BUDGET + sum(size for ref, size in self.present.items() if ref in self.held)


class Sampler(threading.Thread):
    """Every 0.2 s, per host, under its eviction lock: the test images its Engine has, those trials hold.

    Under the lock no eviction round of the host is half done, so a sample
    sees what the budget decided, not a removal in progress.
    """

    def __init__(self, engines: list[Engine], refs: list[str]) -> None:
        super().__init__(daemon=True)
        self.engines, self.refs = engines, refs
        self.samples: list[Sample] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _held(self, engine: Engine) -> set[str]:
        locked, held = _flocked_shared(), set()
        for ref in self.refs:
            path = engine.state_dir / imageholds.IMAGES_DIR / f"{ref.split('@sha256:')[1]}.lock"
            with contextlib.suppress(FileNotFoundError):
                info = path.stat()
                if (os.major(info.st_dev), os.minor(info.st_dev), info.st_ino) in locked:
                    held.add(ref)
        return held

    def sample(self, engine: Engine) -> Sample:
        with host_lock(engine.state_dir / "locks" / budget.EVICTION_LOCK, 60, "sampling"):
            before = self._held(engine)
            listed = engine.image_list()
            held = before | self._held(engine)  # a hold taken meanwhile counts as held
        present = {
            ref: int(image["Size"])
            for image in listed
            for ref in self.refs
            if repo_digests_contain(image.get("RepoDigests") or [], ref)
        }
        return Sample(engine.name, present, frozenset(held))

    def run(self) -> None:
        try:
            while not self.stop.wait(0.2):
                self.samples += [self.sample(engine) for engine in self.engines]
        except BaseException as exc:
            self.error = exc


def test_hosts_with_their_own_engines_keep_within_budget_hand_back_and_never_pause(
    cluster: Cluster, engines: EngineFactory, kit_image: str, published: Published
) -> None:
    uid = uuid.uuid4().hex[:6]
    small, middle, large = (published.unique(f"hosts-{n}m-{uid}", size=n * MIB) for n in (3, 6, 9))
    refs = [small, middle, large]
    hosts = engines("h0", "h1", proxy_image=kit_image)
    workers = cluster.start_workers(2, concurrency=3, on=hosts, extra=["--image-budget", "16M"])
    sampler = Sampler(hosts, refs)
    sampler.start()

    def selection(name: str, pairs: dict[str, tuple[str, str]], sleep: dict[str, float]) -> Path:
        return cluster.selection(
            {task: {"sleep_sec": sleep[task], "reward": 1.0} for task in pairs}, root=cluster.root / name,
            agent_image={t: pair[0] for t, pair in pairs.items()},
            verifier_image={t: pair[1] for t, pair in pairs.items()},
            agent_timeout_sec={t: 1200.0 if sleep[t] > 1 else 300.0 for t in pairs},
        )  # fmt: skip

    # Warm: 6 trials on 6 slots, 3 per host; any 3 of them need all three images, so each host pulls
    # 18 MiB (sizes unknown until pulled: over the budget only while its trials hold them), learns
    # their sizes, and evicts the least recently used once a trial ends.
    warm = selection("warm", {"101": (large, middle), "102": (large, small), "103": (middle, small)},
                     dict.fromkeys(("101", "102", "103"), 3.0))  # fmt: skip
    done = cluster.submit(warm, "warm", "--n-attempts", "2", "--n-concurrent", "6")
    assert done.returncode == 0, done.stdout + done.stderr
    # Which host took which warm trial is the broker's choice: a host that started slower may have
    # taken none, and a host that never pulled an image does not know its size (it would pull over
    # the budget instead of handing back). Each host's own puller pulls what it has not yet pulled,
    # within the budget, as a pre-pull would: both hosts know all three sizes before the main job.
    for host in hosts:
        log_path = images.pull_log_path(host.state_dir)
        unknown = [ref for ref in refs if not budget.expected_sizes([ref], log_path).get(ref)]
        puller = images.ImagePuller(state=host.state_dir, client_factory=host.client, image_budget=BUDGET)
        for ref in unknown:
            with puller.hold([ref]):
                puller.ensure_images([ref], PLATFORM, False)
        assert all(budget.expected_sizes([ref], log_path).get(ref) for ref in refs), host.name

    # Main: the 6 long trials go first, 3 per host; the host that has the small one beside two 9+6 MiB
    # trials cannot fit all three images (18 > 16 MiB, sizes known now): one trial goes back to the
    # queue and runs later. Then short trials of one image each make the hosts evict as they go.
    pairs = {f"20{i}": (large, middle) for i in range(1, 6)} | {"206": (small, small)}
    pairs |= {f"21{i}": (ref, ref) for i, ref in enumerate([small, middle, large] * 2, start=1)}
    main = selection("main", pairs, {t: 5.0 if t < "210" else 0.3 for t in pairs})
    done = cluster.submit(main, "main", "--n-concurrent", "6")
    sampler.stop.set()
    sampler.join(timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sampler.error is None, sampler.error

    # Every trial ran once, on one of the two hosts' Engines (Pier was given its host's DOCKER_HOST).
    runs = cluster.pier_runs()
    assert sorted(Counter(run["task"] for run in runs).items()) == sorted(
        {**{f"task_{t}": 2 for t in ("101", "102", "103")}, **{f"task_{t}": 1 for t in pairs}}.items()
    )
    assert {run["docker_host"] for run in runs} == {host.docker_host for host in hosts}
    with contextlib.closing(docker.from_env()) as session:  # the session's Engine never pulled them
        listed = session.api.images()
        assert not [
            r for r in refs if any(repo_digests_contain(i.get("RepoDigests") or [], r) for i in listed)
        ]

    # A host never held more than its budget plus the images its running trials need.
    over = [sample for sample in sampler.samples if sample.size > sample.bound]
    assert len(sampler.samples) > 20 and not over, over[:5]
    peak = max(sample.size for sample in sampler.samples)
    print(f"\n{len(sampler.samples)} samples; a host held at most {peak / MIB:.1f} MiB (budget 16 MiB)")

    # Evictions: in each host's pull log and in `status`; a hand-back; no host paused; the kit image stays.
    for host in hosts:
        evicted = [
            e for e in budget.read_evictions(images.pull_log_path(host.state_dir)) if e.event == "evicted"
        ]
        assert evicted and {e.ref for e in evicted} <= set(refs), host.name
        assert host.holds(kit_image)
    logs = "".join(worker.log_path.read_text() for worker in workers)
    assert "handed back (no room for its images" in logs
    assert "unhealthy" not in logs and "healthy again" not in logs
    deadline = time.monotonic() + 30
    while True:  # the hosts report their budget line every lease period
        status = cluster.cli("status", "main", "--jobs-dir", str(cluster.jobs_dir))
        assert status.returncode == 0, status.stderr
        lines = [line for line in status.stdout.splitlines() if "task images" in line and "evicted" in line]
        if len(lines) == 2 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(lines) == 2 and all("of a 16.0 MiB budget" in line for line in lines), status.stdout
    assert "paused host" not in status.stdout


# --- build leftovers ----------------------------------------------------------------


def _compose_build(engine: Engine, context: Path, payload_size: int) -> None:
    """What Pier's builds do: `docker compose build` of a task image (BuildKit, on this host's Engine)."""
    context.mkdir(parents=True, exist_ok=True)
    (context / "payload.bin").write_bytes(os.urandom(payload_size))
    (context / "Dockerfile").write_text("FROM scratch\nCOPY payload.bin /payload.bin\n")
    (context / "compose.yaml").write_text(
        "services:\n  main:\n    build: .\n    image: hb__leftover-test:latest\n"
    )
    built = subprocess.run(
        ["docker", "compose", "-f", str(context / "compose.yaml"), "build"],
        env={**os.environ, "DOCKER_HOST": engine.docker_host}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr


def test_build_leftovers_count_against_the_budget_and_go_before_task_images(
    engines: EngineFactory, published: Published, tmp_path: Path
) -> None:
    (host,) = engines("bh")
    uid = uuid.uuid4().hex[:6]
    first, second, third = (published.unique(f"leftover-{n}-{uid}", size=4 * MIB) for n in range(3))
    limit = 23 * MIB // 2  # two 4 MiB task images and some build cache; not three task images
    puller = images.ImagePuller(state=host.state_dir, client_factory=host.client, image_budget=limit)
    client = host.client()
    with contextlib.closing(client):
        with puller.hold([first]):
            puller.ensure([first], PLATFORM, skip_pull=False)
        # Two builds of one tag, as a task rebuilt: the first image is left dangling; the trial's cleanup
        # removes the tagged one. What stays is build cache and a dangling build image, no task's.
        _compose_build(host, tmp_path / "ctx", 3 * MIB)
        _compose_build(host, tmp_path / "ctx", 3 * MIB)
        client.images.remove("hb__leftover-test:latest")
        leftovers = budget.build_leftovers(client)
        assert len(leftovers.images) == 1 and leftovers.cache >= 6 * MIB, leftovers
        assert "build leftovers" in puller.budget.summary(client)

        # 8 MiB of task images + the leftovers exceed 11.5 MiB: the leftovers go, the task images stay.
        with puller.hold([second]):
            puller.ensure([second], PLATFORM, skip_pull=False)
        log = images.pull_log_path(host.state_dir)
        events = budget.read_evictions(log)
        assert [e.event for e in events if e.event == "evicted"] == []
        assert {e.ref for e in events} >= {"build cache", f"build image {leftovers.images[0][0][:19]}"}
        assert host.holds(first) and host.holds(second)
        task_bytes = sum(i.size for i in puller.budget.task_images(client))
        assert task_bytes + budget.build_leftovers(client).size <= limit

        # A third image: whatever leftovers remain go first, then the least recently used task image.
        with puller.hold([third]):
            puller.ensure([third], PLATFORM, skip_pull=False)
        assert [e.ref for e in budget.read_evictions(log) if e.event == "evicted"] == [first]
        assert budget.build_leftovers(client).images == []
        assert host.holds(second) and host.holds(third)
        assert "pruned" in puller.budget.summary(client)
