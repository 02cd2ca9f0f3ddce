"""Inspection on a real Engine: each deviation is built on purpose and must fail the start.

A test subclass of IsolatedDockerEnvironment edits the policy compose
override just before `compose up`, so the Engine really creates the
deviating container or network; `start` must then raise PolicyViolation
naming the deviation and leave no container of the trial running. Nothing
here sends network traffic.
"""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest
from pier.models.agent.network import NetworkAllowlist
from pier.models.task.config import EnvironmentConfig
from pier.models.trial.paths import TrialPaths

from sciencebench.core.errors import PolicyViolation
from sciencebench.network.environment import IsolatedDockerEnvironment

pytestmark = pytest.mark.docker

Compose = dict[str, Any]
Mutation = Callable[[Compose], None]


class DeviantEnvironment(IsolatedDockerEnvironment):
    """Applies `mutate` to the policy override after it is written, before `up`."""

    def __init__(self, *args: Any, mutate: Mutation, **kwargs: Any) -> None:
        self._mutate = mutate
        super().__init__(*args, **kwargs)

    def _prepare_egress_proxy_compose(self) -> None:
        super()._prepare_egress_proxy_compose()
        assert self._policy_compose_path is not None
        compose = json.loads(self._policy_compose_path.read_text())
        self._mutate(compose)
        self._policy_compose_path.write_text(json.dumps(compose))


def make_env(
    root: Path, base_image: str, *, egress: bool, mutate: Mutation = lambda _: None
) -> IsolatedDockerEnvironment:
    squid_image = os.environ.get("SB_SQUID_IMAGE")
    if not squid_image:
        raise RuntimeError("SB_SQUID_IMAGE is unset: run the tests through scripts/test.sh")
    env_dir = root / "environment"
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "Dockerfile").write_text(f"FROM {base_image}\n")
    trial_paths = TrialPaths(trial_dir=root / "trial")
    trial_paths.mkdir()  # type: ignore[no-untyped-call]
    return DeviantEnvironment(
        environment_dir=env_dir,
        environment_name="policy-live",
        session_id=f"sbnet-live-{uuid.uuid4().hex[:8]}",
        trial_paths=trial_paths,
        task_env_config=EnvironmentConfig(docker_image=base_image, allow_internet=False),
        network_allowlist=NetworkAllowlist(domains=["api.openai.com", "gw"]) if egress else None,
        inference_urls=["http://gw:4000/v1"],
        proxy_image=squid_image,
        mutate=mutate,
    )


def project_containers(project: str) -> list[str]:
    client = docker.from_env()
    try:
        found = client.containers.list(all=True, filters={"label": f"com.docker.compose.project={project}"})
        return [str(c.name) for c in found]
    finally:
        client.close()


def main(compose: Compose) -> dict[str, Any]:
    service: dict[str, Any] = compose["services"]["main"]
    return service


def proxy(compose: Compose) -> dict[str, Any]:
    service: dict[str, Any] = compose["services"]["sb-egress-proxy"]
    return service


def internal(compose: Compose) -> dict[str, Any]:
    network: dict[str, Any] = compose["networks"]["sb-internal"]
    return network


def set_key(get: Callable[[Compose], dict[str, Any]], key: str, value: Any) -> Mutation:
    def mutate(compose: Compose) -> None:
        get(compose)[key] = value

    return mutate


def drop_gateway_mode(compose: Compose) -> None:
    internal(compose).pop("driver_opts")


def not_internal(compose: Compose) -> None:
    # An isolated gateway needs an internal network, so a non-internal one
    # necessarily has the default gateway mode as well.
    internal(compose)["internal"] = False
    internal(compose).pop("driver_opts")


EGRESS_DEVIATIONS: dict[str, tuple[Mutation, list[str]]] = {
    "extra network": (
        set_key(main, "networks", ["sb-internal", "sb-egress"]),
        ["main", "joins 2 network(s)"],
    ),
    "non-internal network": (not_internal, ["sb-internal: not Internal"]),
    "IPv6 on": (set_key(internal, "enable_ipv6", True), ["EnableIPv6 is True"]),
    "gateway present": (drop_gateway_mode, ["has a host gateway", "gateway_mode_ipv4 is None"]),
    "missing cap drop": (
        set_key(main, "cap_drop", ["NET_ADMIN"]),
        ["main", "NET_RAW not in HostConfig.CapDrop"],
    ),
    "cap_add": (set_key(main, "cap_add", ["SYS_PTRACE"]), ["main", "CapAdd"]),
    "privileged": (set_key(proxy, "privileged", True), ["sb-egress-proxy", "Privileged is true"]),
    "proxy forwarding on": (
        set_key(proxy, "sysctls", {"net.ipv4.ip_forward": "1", "net.ipv6.conf.all.forwarding": "0"}),
        ["sb-egress-proxy", "net.ipv4.ip_forward is '1'"],
    ),
    "proxy cap drop missing": (set_key(proxy, "cap_drop", []), ["sb-egress-proxy", "NET_ADMIN not in"]),
}

NONE_DEVIATIONS: dict[str, tuple[Mutation, list[str]]] = {
    "agent on a network": (set_key(main, "network_mode", "bridge"), ["NetworkMode is 'bridge'"]),
    "privileged verifier": (set_key(main, "privileged", True), ["main", "Privileged is true"]),
    "missing cap drop": (set_key(main, "cap_drop", []), ["NET_ADMIN not in", "NET_RAW not in"]),
    # PID 1's stdout is a file on the host's disk beside the writable layer: unbounded, a disk fill.
    "unbounded logs": (set_key(main, "logging", {"driver": "json-file"}), ["main", "HostConfig.LogConfig"]),
}


def assert_rejected(env: IsolatedDockerEnvironment, fragments: list[str]) -> None:
    try:
        with pytest.raises(PolicyViolation) as info:
            asyncio.run(env.start(force_build=False))
        text = "; ".join(info.value.violations)
        for fragment in fragments:
            assert fragment in text, text
        # Stopped before raising: nothing of the trial is left running.
        assert project_containers(env.compose_project) == []
        assert not env.policy_record_path.exists()
    finally:
        asyncio.run(env.stop(delete=False))


@pytest.mark.parametrize("name", sorted(EGRESS_DEVIATIONS))
def test_egress_deviation_is_rejected(tmp_path: Path, base_image: str, name: str) -> None:
    mutate, fragments = EGRESS_DEVIATIONS[name]
    assert_rejected(make_env(tmp_path, base_image, egress=True, mutate=mutate), fragments)


@pytest.mark.parametrize("name", sorted(NONE_DEVIATIONS))
def test_no_network_deviation_is_rejected(tmp_path: Path, base_image: str, name: str) -> None:
    mutate, fragments = NONE_DEVIATIONS[name]
    assert_rejected(make_env(tmp_path, base_image, egress=False, mutate=mutate), fragments)


def test_compliant_no_network_trial_passes_and_stops_fast(tmp_path: Path, base_image: str) -> None:
    env = make_env(tmp_path, base_image, egress=False)
    try:
        asyncio.run(env.start(force_build=False))
        record = json.loads(env.policy_record_path.read_text())
        assert record["network_mode"] == "none" and record["internal_network"] is None
        assert (asyncio.run(env.exec("ip -o link show | grep -vc ': lo:'")).stdout or "").strip() == "0"
    finally:
        started = time.monotonic()
        asyncio.run(env.stop(delete=False))
        stop_sec = time.monotonic() - started
    # `sleep infinity` as PID 1 ignores SIGTERM: without stop_signal SIGKILL
    # compose down waits out its 10 s grace period.
    assert stop_sec < 5, f"compose down took {stop_sec:.1f} s"
    assert project_containers(env.compose_project) == []


def test_stop_with_delete_keeps_the_shared_images(tmp_path: Path, base_image: str) -> None:
    # Pier's `down --rmi all` would delete the pinned proxy and task images
    # that every other trial on the host uses; the policy's stop must not.
    env = make_env(tmp_path, base_image, egress=True)
    try:
        asyncio.run(env.start(force_build=False))
    finally:
        asyncio.run(env.stop(delete=True))
    client = docker.from_env()
    try:
        for ref in (base_image, os.environ["SB_SQUID_IMAGE"]):
            client.images.get(ref)  # raises ImageNotFound if it was removed
        assert project_containers(env.compose_project) == []
        project_label = f"com.docker.compose.project={env.compose_project}"
        assert not client.networks.list(filters={"label": project_label})
    finally:
        client.close()
