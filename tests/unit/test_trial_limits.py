"""Limits no agent can raise: the worker's options, the policy's pids limit, cpus and memory, the disk watch.

The options and settings, the pids limit the policy override and its
inspection take, the inspection of the task's cpus and memory, and the disk
watch's decision on a container listing (a fake Engine API). The real
Engine's side is tests/docker/test_trial_limits.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import time
from typing import Any

import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.core.capacity import DEFAULT_MEMORY_MB, trial_request
from sciencebench.core.errors import PolicyRefused, ResourceLimitError, SettingsError, Stage, failure_class
from sciencebench.core.failures import recorded_failure
from sciencebench.core.settings import DEFAULT_DISK_LIMIT, DEFAULT_PIDS_LIMIT, Settings
from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL
from sciencebench.network.compose import ProxyFiles, pids_limit_of, policy_compose
from sciencebench.network.inspection import inspect_policy
from sciencebench.worker.docker.diskwatch import DiskWatch, watching
from sciencebench.worker.main import host_kit, limits_line
from sciencebench.worker.runtime import DockerRuntime
from tests.fixtures.hosts import PROXY_IMAGE

pytestmark = pytest.mark.unit


# --- options and settings ---------------------------------------------------------------------


def test_the_limits_default_to_4096_processes_and_20g_and_read_their_variables() -> None:
    settings = Settings.from_env({})
    assert (
        (settings.pids_limit, settings.disk_limit)
        == (DEFAULT_PIDS_LIMIT, 20 << 30)
        == (4096, DEFAULT_DISK_LIMIT)
    )
    settings = Settings.from_env({"SCIENCEBENCH_PIDS_LIMIT": "256", "SCIENCEBENCH_DISK_LIMIT": "512M"})
    assert (settings.pids_limit, settings.disk_limit) == (256, 512 << 20)
    assert Settings.from_env({"SCIENCEBENCH_DISK_LIMIT": "0"}).disk_limit == 0  # not watched


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SCIENCEBENCH_PIDS_LIMIT", "8"),
        ("SCIENCEBENCH_PIDS_LIMIT", "lots"),
        ("SCIENCEBENCH_DISK_LIMIT", "big"),
    ],
)
def test_a_bad_limit_variable_is_a_settings_error_naming_it(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        Settings.from_env({variable: value})


def _worker(monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[Any, list[Settings]]:
    from sciencebench.worker import main as worker_main

    seen: list[Settings] = []
    monkeypatch.setattr(worker_main, "run_worker", lambda **kw: seen.append(kw["settings"]))
    monkeypatch.setenv("SCIENCEBENCH_PROXY_IMAGE", PROXY_IMAGE)
    monkeypatch.setenv("SCIENCEBENCH_PIDS_LIMIT", "300")
    monkeypatch.setenv("SCIENCEBENCH_DISK_LIMIT", "1G")
    args = ["worker", "--jobs-root", "/srv/jobs", "--selection-root", "/srv/sel", *extra]
    return CliRunner().invoke(cli.main, args), seen


def test_worker_limit_options_win_over_the_environment_and_reach_the_host_kit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, seen = _worker(monkeypatch)
    assert result.exit_code == 0, result.output
    assert (seen[0].pids_limit, seen[0].disk_limit) == (300, 1 << 30)  # the environment's
    result, seen = _worker(monkeypatch, "--pids-limit", "64", "--disk-limit", "0")
    assert result.exit_code == 0, result.output
    kit = host_kit(seen[0])
    assert (kit.pids_limit, kit.disk_limit) == (64, 0)  # a 0 given counts: not watched
    assert DockerRuntime(seen[0]).environment_kwargs()["pids_limit"] == "64"
    assert limits_line(seen[0]) == "each trial container: at most 64 processes; writable layer not watched"
    defaults = seen[0].model_copy(update={"pids_limit": 4096, "disk_limit": 20 << 30})
    assert limits_line(defaults).endswith("at most 4096 processes; writable layer 20.0 GiB")


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--pids-limit", "8", "--pids-limit: 8 is not in 16..4194304"),
        ("--pids-limit", "many", "'many' is not a valid integer"),
        ("--disk-limit", "lots", "--disk-limit: 'lots' is not a size"),
    ],
)
def test_a_bad_limit_option_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, option: str, value: str, says: str
) -> None:
    result, seen = _worker(monkeypatch, option, value)
    assert result.exit_code == 2 and says in result.stderr, result.output
    assert "Traceback" not in result.output and seen == []


# --- the pids limit in the policy -------------------------------------------------------------


@pytest.mark.parametrize(("value", "limit"), [(None, 4096), (64, 64), ("64", 64), (" 128 ", 128)])
def test_the_pids_keyword_is_the_workers_limit(value: object, limit: int) -> None:
    assert pids_limit_of(value) == limit
    main = policy_compose("none", pids_limit=limit)["services"]["main"]
    assert main["pids_limit"] == main["deploy"]["resources"]["limits"]["pids"] == limit


@pytest.mark.parametrize("value", ["x", 3, 0, -1, True, 1 << 30, "1e3"])
def test_a_bad_pids_keyword_refuses_the_trial(value: object) -> None:
    with pytest.raises(PolicyRefused, match="pids_limit"):
        pids_limit_of(value)


def _agent(**host: Any) -> dict[str, Any]:
    return {
        "Id": "a" * 64,
        "Name": "/t__abcdefg-main-1",
        "Config": {"Labels": {"com.docker.compose.service": "main"}},
        "HostConfig": {
            "CapDrop": ["NET_ADMIN", "NET_RAW"],
            "NetworkMode": "none",
            "PidsLimit": 64,
            "LogConfig": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "2"}},
            "Memory": DEFAULT_MEMORY_MB << 20,
            "MemorySwap": DEFAULT_MEMORY_MB << 20,
            **host,
        },
    }


def _checks(container: dict[str, Any], **kwargs: Any) -> list[str]:
    return inspect_policy("28.5.2", [container], [], mode="none", pids_limit=64, **kwargs)


def test_inspection_proves_the_tasks_cpus_and_memory_are_the_agents_limits() -> None:
    applied = _agent(NanoCpus=2_000_000_000, Memory=1 << 30, MemorySwap=1 << 30)
    assert _checks(applied, cpus=2, memory_mb=1024) == []
    failures = _checks(_agent(NanoCpus=0, Memory=0), cpus=2, memory_mb=1024)
    assert any("NanoCpus is 0" in f and "the task's 2 cpus" in f for f in failures), failures
    assert any("Memory is 0, expected 1024 MB" in f for f in failures), failures
    # A task's own compose file raising them, or swapping without bound, or a quota beside them.
    assert _checks(_agent(NanoCpus=8_000_000_000, Memory=1 << 30), cpus=2, memory_mb=1024)
    assert _checks(_agent(NanoCpus=2_000_000_000, Memory=4 << 30), cpus=2, memory_mb=1024)
    assert "unlimited swap" in " ".join(_checks(_agent(Memory=1 << 30, MemorySwap=-1), memory_mb=1024))
    assert "(no swap)" in " ".join(_checks(_agent(Memory=1 << 30, MemorySwap=2 << 30), memory_mb=1024))
    assert _checks(_agent(NanoCpus=2_000_000_000, CpuQuota=800000), cpus=2)


def test_a_task_naming_no_memory_is_held_to_the_default_request_in_every_container() -> None:
    assert trial_request((None, None), None).memory_mb == DEFAULT_MEMORY_MB  # what capacity counts
    assert _checks(_agent(), cpus=None, memory_mb=None) == []  # the default applied: no cpus asked
    unlimited = _checks(_agent(Memory=0, MemorySwap=0), memory_mb=None)
    assert any(f"Memory is 0, expected {DEFAULT_MEMORY_MB} MB" in f for f in unlimited), unlimited
    proxy = _agent(Memory=0, MemorySwap=0)
    proxy["Name"], proxy["Config"]["Labels"]["com.docker.compose.service"] = "/p", "sb-egress-proxy"
    failures = inspect_policy("28.5.2", [_agent(), proxy], [], mode="none", pids_limit=64)
    assert any("(p): HostConfig.Memory is 0" in f for f in failures), failures
    # The override gives main and the proxy that limit, or the task's, and no swap beyond it.
    proxy_files = ProxyFiles(image=PROXY_IMAGE, squid_conf="/c", passwd="/p")
    for memory_mb, expected in ((None, f"{DEFAULT_MEMORY_MB}M"), (512, "512M")):
        for mode, files in (("none", None), ("isolated-allowlist", proxy_files)):
            services = policy_compose(mode, files, "o", memory_mb=memory_mb)["services"]  # type: ignore[arg-type]
            assert services
            for service in services.values():
                assert service["deploy"]["resources"]["limits"]["memory"] == expected
                assert service["memswap_limit"] == expected


def test_inspection_refuses_a_pids_limit_above_the_workers() -> None:
    assert _checks(_agent(PidsLimit=64)) == []
    assert "PidsLimit 4096 is above 64" in " ".join(_checks(_agent(PidsLimit=4096)))


# --- the disk watch ---------------------------------------------------------------------------


class FakeApi:
    """The Engine's container listing (with sizes when asked) and kill, for a few compose projects."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes  # "project/name" -> SizeRw
        self.killed: list[str] = []
        self.sized: list[str] = []

    def _entries(self) -> list[dict[str, Any]]:
        return [
            {
                "Id": key,
                "Names": [f"/{key.split('/')[1]}"],
                "Labels": {COMPOSE_PROJECT_LABEL: key.split("/")[0]},
            }
            for key in self.sizes
        ]

    def containers(self, size: bool = False, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        label = (filters or {}).get("label", "")
        entries = [
            e
            for e in self._entries()
            if "=" not in label or label.endswith("=" + e["Labels"][COMPOSE_PROJECT_LABEL])
        ]
        if size:
            self.sized += [e["Id"] for e in entries]
            return [{**e, "SizeRw": self.sizes[e["Id"]]} for e in entries]
        return entries

    def kill(self, container: str) -> None:
        self.killed.append(container)


class FakeClient:
    def __init__(self, api: FakeApi) -> None:
        self.api = api

    def close(self) -> None:
        return None


TRIAL = "task_001__AbCdEfG"


def _watch(api: FakeApi, names: list[str], limit: int = 100) -> DiskWatch:
    return DiskWatch(limit, lambda: names, client_factory=lambda: FakeClient(api))  # type: ignore[arg-type,return-value]


def test_the_watch_kills_the_trials_container_past_the_limit_and_says_why() -> None:
    api = FakeApi({
        "task_001__abcdefg/main-1": 50,
        "task_001__abcdefg__verifier__trial/main-1": 150,  # the trial's separate verifier
        "task_001__zzzzzzz/main-1": 10_000,  # a neighbour trial of the same task: not this watch's
    })  # fmt: skip
    watch = _watch(api, [TRIAL])
    assert watch.check() is True
    assert api.killed == ["task_001__abcdefg__verifier__trial/main-1"]
    assert watch.exceeded is not None and "main-1 wrote 150 B" in watch.exceeded
    assert "--disk-limit" in watch.exceeded
    assert "task_001__zzzzzzz/main-1" not in api.sized  # a neighbour is never even measured


def test_the_watch_leaves_containers_under_the_limit_and_a_trial_not_started_yet() -> None:
    api = FakeApi({"task_001__abcdefg/main-1": 100, "task_001__zzzzzzz/main-1": 10_000})
    assert _watch(api, [TRIAL]).check() is False
    assert _watch(api, []).check() is False  # Pier has not named its trial yet
    assert api.killed == []


def test_no_watch_runs_for_a_limit_of_0() -> None:
    with watching(0, lambda: [TRIAL]) as exceeded:
        assert exceeded() is None


def test_the_watch_polls_in_its_thread_until_it_finds_one() -> None:
    api = FakeApi({"task_001__abcdefg/main-1": 500})
    watch = DiskWatch(100, lambda: [TRIAL], poll_sec=0.01, client_factory=lambda: FakeClient(api))  # type: ignore[arg-type,return-value]
    watch.start()
    for _ in range(500):
        if watch.exceeded:
            break
        time.sleep(0.01)
    watch.stop()
    assert watch.exceeded is not None and api.killed == ["task_001__abcdefg/main-1"]


def test_a_resource_limit_is_a_deterministic_harness_failure_found_by_name() -> None:
    assert failure_class("ResourceLimitError") is ResourceLimitError
    assert ResourceLimitError.stage is Stage.HARNESS and ResourceLimitError.deterministic
    assert recorded_failure("ResourceLimitError") == (Stage.HARNESS, True)
