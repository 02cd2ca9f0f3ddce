"""The hand-over to a same-container verifier without an engine: when it happens, what it runs.

The real processes and directories are in
tests/docker/test_forged_rewards.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sciencebench.core.errors import PolicyViolation
from sciencebench.network.environment import IsolatedDockerEnvironment
from sciencebench.network.handoff import END_ROUNDS, end_and_reset_script
from tests.unit.test_network_environment import make_env

pytestmark = pytest.mark.unit


def _recording_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[IsolatedDockerEnvironment, list[str]]:
    env = make_env(tmp_path, allowlist=None)
    calls: list[str] = []

    def root_exec(script: str, what: str) -> str:
        calls.append(script)
        return "1:100\n7:101\n"

    monkeypatch.setattr(env, "_root_exec", root_exec)
    monkeypatch.setattr(env, "_verifier_owner", lambda: "0")
    monkeypatch.setattr(env, "_upload", lambda source, target, *, file: calls.append(f"upload {target}"))
    return env, calls


def test_only_the_tests_upload_hands_over_and_before_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, calls = _recording_env(tmp_path, monkeypatch)
    env._note_start_processes()
    assert env._start_processes == ["1:100", "7:101"]
    calls.clear()
    asyncio.run(env.upload_dir(tmp_path, "/logs/agent"))
    assert calls == ["upload /logs/agent"]
    asyncio.run(env.upload_dir(tmp_path, "/tests/"))
    assert len(calls) == 3 and calls[2] == "upload /tests/"
    assert "keep=' 1:100 7:101 '" in calls[1] and "rm -rf /logs/verifier" in calls[1]


def test_without_the_start_listing_the_verifier_does_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, calls = _recording_env(tmp_path, monkeypatch)
    with pytest.raises(PolicyViolation, match="never listed"):
        asyncio.run(env.upload_dir(tmp_path, "/tests"))
    assert calls == []  # nothing copied


def test_a_failed_hand_over_stops_the_upload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env, calls = _recording_env(tmp_path, monkeypatch)
    env._start_processes = ["1:100"]

    def fail(script: str, what: str) -> Any:
        raise PolicyViolation([f"{what} (exit 3): processes still running: 42"])

    monkeypatch.setattr(env, "_root_exec", fail)
    with pytest.raises(PolicyViolation, match="processes still running"):
        asyncio.run(env.upload_dir(tmp_path, "/tests"))
    assert calls == []


def test_the_script_quotes_the_owner_and_bounds_its_rounds() -> None:
    script = end_and_reset_script(["1:5"], "/logs/verifier", "agent; reboot")
    assert "chown 'agent; reboot' /logs/verifier" in script
    assert f"rounds={END_ROUNDS}\n" in script and "chmod 755 /logs/verifier" in script
    assert script.index("kill -KILL") < script.index("rm -rf /logs/verifier")


def test_a_start_whose_processes_cannot_be_listed_stops_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path, allowlist=None)
    stopped: list[bool] = []

    async def nothing(*args: Any) -> None:
        return None

    async def stop(delete: bool) -> None:
        stopped.append(delete)

    def fail(script: str, what: str) -> str:
        raise PolicyViolation([f"{what} (exit 127): sh: not found"])

    monkeypatch.setattr(env, "_start_with_agent", nothing)
    monkeypatch.setattr(env, "_enforce", nothing)
    monkeypatch.setattr(env, "_check_task_files", lambda: None)
    monkeypatch.setattr(env, "_log_dirs_made", True)
    monkeypatch.setattr(env, "_root_exec", fail)
    monkeypatch.setattr(env, "stop", stop)
    with pytest.raises(PolicyViolation, match="could not be listed"):
        asyncio.run(env.start(force_build=False))
    assert stopped == [False]
