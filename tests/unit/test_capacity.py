"""A host's capacity and a trial's request (`core.capacity`): parsing, defaults, the fit rule, DRF order."""

from __future__ import annotations

from pathlib import Path

import pytest

from sciencebench.coordination.placement import HostView, Placement, pinned
from sciencebench.coordination.protocol import HostKit
from sciencebench.coordination.shares import Load, Share, choose
from sciencebench.core.capacity import (
    MEMORY_RESERVE_MB,
    Request,
    detect_cpus,
    detect_memory_mb,
    dominant_share,
    fits,
    host_capacity,
    trial_request,
)
from sciencebench.core.errors import ProfileError, SettingsError
from sciencebench.core.settings import Settings
from sciencebench.login.cluster import Cluster, Needs, check_cluster
from sciencebench.login.taskspec import load_task
from tests.fixtures.selection import REAL_TASKS, make_task

pytestmark = pytest.mark.unit

GIB = 1024


def test_a_trial_requests_the_larger_of_its_agent_and_separate_verifier_per_resource(tmp_path: Path) -> None:
    assert trial_request((2, 8192), (2, 8192)) == Request(2, 8192)
    assert trial_request((1, 16384), (4, 2048)) == Request(4, 16384)  # never both up at once: max each
    assert trial_request((None, None), None) == Request(1, 2048)  # a task that names none
    released = (REAL_TASKS / "task_002" / "task.toml").read_text()
    real = load_task(make_task(tmp_path, "002", toml_text=released), "002")
    assert real.request == Request(2, 8192)  # every released task
    shared = load_task(make_task(tmp_path, "003", cpus=3, memory_mb=4096), "003")
    assert shared.verifier_mode == "shared" and shared.request == Request(3, 4096)


def test_the_fit_rule_binds_cpus_and_memory_alike() -> None:
    host = Request(cpus=2, memory_mb=8 * GIB)
    assert fits(Request(1, 2048), Request(1, 2048), host)
    assert not fits(Request(1, 2048), Request(2, 2048), host)
    assert not fits(Request(0, 6 * GIB), Request(0.5, 3 * GIB), host)
    assert fits(Request(0.1, 0), Request(1.9, 8 * GIB), host)  # fractions that add up exactly
    assert dominant_share(Request(2, 2048), Request(8, 32 * GIB)) == 0.25
    assert dominant_share(Request(1, 16 * GIB), Request(8, 32 * GIB)) == 0.5


def test_capacity_comes_from_the_options_else_the_host_less_its_reserve(tmp_path: Path) -> None:
    assert Settings.from_env({"SCIENCEBENCH_CPUS": "32", "SCIENCEBENCH_MEMORY": "128G"}).capacity == Request(
        32, 128 * GIB
    )
    detected = Settings.from_env({}).capacity
    assert detected == Request(detect_cpus(), detect_memory_mb() - MEMORY_RESERVE_MB)
    assert host_capacity(0.5, 0).cpus == 0.5 and host_capacity(0, 1 << 30).memory_mb == GIB
    with pytest.raises(SettingsError, match="SCIENCEBENCH_MEMORY"):
        Settings.from_env({"SCIENCEBENCH_MEMORY": "lots"})
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cpu.max").write_text("150000 100000\n")
    (cgroup / "memory.max").write_text(str(3 << 30))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree: 1 kB\n")
    assert detect_cpus.__wrapped__(cgroup) == min(1.5, detect_cpus())
    assert detect_memory_mb.__wrapped__(meminfo, cgroup) == 3 * GIB
    (cgroup / "memory.max").write_text("max\n")
    assert detect_memory_mb.__wrapped__(meminfo, cgroup) == 16000


def test_submit_refuses_a_task_no_live_host_could_ever_hold_naming_the_largest() -> None:
    kits = {"w1@a": HostKit(cpus=4, memory_mb=16 * GIB), "w2@b": HostKit(cpus=8, memory_mb=8 * GIB),
            "w3@c": HostKit()}  # fmt: skip
    live = Cluster(kits=kits, where="live worker hosts")
    asks = (("001", Request(2, 8192)), ("002", Request(6, 9000)))
    needs = Needs(proxy=False, online_install=None, requests=asks)
    check_cluster(live, Needs(proxy=False, online_install=None, requests=(("001", Request(8, 8192)),)), str)
    with pytest.raises(ProfileError) as refused:
        check_cluster(live, needs, str)
    assert str(refused.value) == (
        "task 002 asks 6 cpu(s), 8.79 GiB per trial; the largest live host, w2@b, has 8 cpu(s), 8 GiB "
        "(worker --cpus, --memory)"
    )
    local = Cluster(kits={"this host": HostKit(cpus=1, memory_mb=4096)}, where="this host", local=True)
    with pytest.raises(ProfileError, match=r"task 001 asks 2 cpu.*this host's capacity 1 cpu"):
        check_cluster(local, needs, str)


def test_fair_share_counts_requests_not_trials() -> None:
    total = Request(cpus=8, memory_mb=64 * GIB)
    shares = {"small": Share(user="alice", cap=8, at=1.0, cpus=1, memory_mb=2048),
              "big": Share(user="bob", cap=8, at=2.0, cpus=2, memory_mb=2048)}  # fmt: skip
    waiting = {"small": Load(running=2, waiting=5), "big": Load(running=1, waiting=5)}
    # By trials bob is below (1 < 2); by dominant share they tie (2 of 8 CPUs each) and a next
    # 2-CPU trial would take bob to 4/8 against alice's 3/8.
    assert choose(shares, {}, waiting, capacity=16) == "big"
    assert choose(shares, {}, waiting, capacity=16, total=total) == "small"
    # Nothing that does not fit what the cluster has free is chosen.
    full = {"small": Load(running=2, waiting=5), "big": Load(running=3, waiting=5)}
    assert choose(shares, {}, full, capacity=16, total=total) is None
    assert choose(shares, {}, {**full, "big": Load(running=3, waiting=5, used=Request(5, 6144))}, capacity=16,
                  total=total) == "small"  # fmt: skip


def test_placement_takes_a_host_where_the_trial_fits_over_one_that_holds_its_images() -> None:
    image = f"127.0.0.1:5000/t/a:v@sha256:{'a' * 64}"
    (held,) = pinned([image])
    full = HostView("h1", slots=4, images={held: 1 << 30}, capacity=Request(2, 8192), used=Request(1, 2048))
    roomy = HostView("h2", slots=4, capacity=Request(8, 32768))
    placed = Placement(hosts={"h1": full, "h2": roomy}, sizes={}, bytes_per_sec=100e6, now=0.0)
    choice = placed.choose([image], request=Request(1, 2048))
    assert choice is not None and choice.host == "h1"  # it fits beside the running trial: no pull
    placed.take(choice)
    assert placed.hosts["h1"].used == Request(2, 4096)
    choice = placed.choose([image], request=Request(1, 2048))
    # h1 has free slots but no room: busy, a holder worth waiting for (as one with no free slot)
    assert choice is not None and (choice.host, choice.until > 0) == ("h1", True)
    placed.hosts["h1"].images = {}
    choice = placed.choose([image], request=Request(1, 2048))
    assert choice is not None and (choice.host, choice.pulls) == ("h2", (held,))
    too_big = placed.choose([image], request=Request(16, 2048))
    assert too_big is None  # no host could hold it: nothing is placed
