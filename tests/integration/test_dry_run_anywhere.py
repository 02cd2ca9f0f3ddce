"""The spec's dry run on any machine: no broker, no proxy image, the images asked of their registry.

Runs the installed entry point as a user would, with SCIENCEBENCH_BROKER_URL
on a closed loopback port (a password in it, the canary) and no
SCIENCEBENCH_PROXY_IMAGE; the images are the loopback registry's
(`SB_BASE_IMAGE`) or refs it does not have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.selection import make_selection
from tests.fixtures.services import free_port

pytestmark = pytest.mark.integration

SCIENCEBENCH = Path(sys.executable).parent / "sciencebench"
CANARY_BROKER = "canary-dry-broker-5e1f"
KEY = "sk-canary-dry-77aa"


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SCIENCEBENCH_")}
    env["SCIENCEBENCH_BROKER_URL"] = f"redis://default:{CANARY_BROKER}@127.0.0.1:{free_port()}/0"
    env["COLUMNS"] = "200"
    return subprocess.run(
        [str(SCIENCEBENCH), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _not_checked(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("dry run: not checked here: ")]


def _spec_dry_run(
    tmp_path: Path, *extra: str, selection: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The spec's `--agent codex --env-file ... --skip-pull --dry-run` (with `extra` before it)."""
    selection = selection or make_selection(tmp_path / "tasks-selected-small", ["002", "005"])
    (tmp_path / "codex.env").write_text(f"OPENAI_API_KEY={KEY}\n")
    return _run(tmp_path, "submit", *extra, "--path", str(selection), "--agent", "codex",
                "--env-file", str(tmp_path / "codex.env"), "--jobs-dir", str(tmp_path / "jobs"),
                "--skip-pull", "--dry-run")  # fmt: skip


def test_the_spec_dry_run_needs_no_broker_and_says_what_it_skipped(tmp_path: Path) -> None:
    done = _spec_dry_run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "dry run: 2 trial(s) of 2 task(s)" in done.stdout and "pier command: pier run" in done.stdout
    skipped = _not_checked(done.stdout)
    assert len(skipped) == 1, done.stdout
    assert skipped[0].startswith(
        "dry run: not checked here: the live worker hosts' roots, gateways, proxy image, agent install "
        "and pre-warm pulls (broker unreachable: ConnectionError at redis://default:***@127.0.0.1:"
    )
    record = json.loads((tmp_path / "tasks-selected-small" / "batch-run.json").read_text())
    assert record["task_ids"] == ["002", "005"] and record["agent"] == "codex"
    for text in (done.stdout, json.dumps(record)):
        assert CANARY_BROKER not in text and KEY not in text
    assert not (tmp_path / "jobs").exists()


def test_a_local_dry_run_of_a_model_agent_needs_no_proxy_image(tmp_path: Path) -> None:
    done = _spec_dry_run(tmp_path, "--local")
    assert done.returncode == 0, done.stderr
    skipped = _not_checked(done.stdout)
    assert skipped == [
        "dry run: not checked here: this host's inference proxy image "
        "(SCIENCEBENCH_PROXY_IMAGE, needed by the real run)"
    ]
    assert (tmp_path / "tasks-selected-small" / "batch-run.json").is_file()
    assert not (tmp_path / "jobs").exists()


def test_the_real_local_run_refuses_without_a_proxy_image_in_one_sentence(tmp_path: Path) -> None:
    selection = make_selection(tmp_path / "sel", ["002"])
    (tmp_path / "codex.env").write_text(f"OPENAI_API_KEY={KEY}\n")
    done = _run(tmp_path, "submit", "--local", "--path", str(selection), "--agent", "codex",
                "--env-file", str(tmp_path / "codex.env"), "--jobs-dir", str(tmp_path / "jobs"))  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        "sciencebench: error: this job's model agent runs behind the inference proxy, but this host has "
        "no proxy image: set SCIENCEBENCH_PROXY_IMAGE to the digest-pinned image compose/build.yml builds\n"
    )
    assert not (tmp_path / "jobs").exists() and not (selection / "batch-run.json").exists()


def _nop_dry_run(tmp_path: Path, image: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    selection = make_selection(tmp_path / "sel", ["002"], agent_image=image)
    done = _run(tmp_path, "submit", *extra, "--path", str(selection), "--jobs-dir", str(tmp_path / "jobs"),
                "--dry-run")  # fmt: skip
    return done, selection


@pytest.mark.parametrize("local", [False, True], ids=["no-broker", "local"])
def test_without_skip_pull_the_images_are_asked_of_their_registry(
    tmp_path: Path, base_image: str, local: bool
) -> None:
    extra = ("--local",) if local else ()
    there, selection = _nop_dry_run(tmp_path / "there", base_image, *extra)
    assert there.returncode == 0, there.stderr
    assert not any("in their registries" in line for line in _not_checked(there.stdout)), there.stdout
    assert (selection / "batch-run.json").is_file()

    absent = base_image.rsplit("@", 1)[0] + "@sha256:" + "0d" * 32
    missing, selection = _nop_dry_run(tmp_path / "missing", absent, *extra)
    assert missing.returncode == 2
    registry = base_image.split("/", 1)[0]
    assert missing.stderr == (
        f"sciencebench: error: image {absent}: {registry} has no such manifest (asked without pulling)\n"
    )
    assert missing.stdout == ""
    assert not (selection / "batch-run.json").exists()


def test_a_registry_that_cannot_be_asked_is_named_not_failed(tmp_path: Path) -> None:
    unreachable = f"127.0.0.1:{free_port()}/sciencebench/nowhere@sha256:" + "0e" * 32
    done, selection = _nop_dry_run(tmp_path, unreachable)
    assert done.returncode == 0, done.stderr
    skipped = _not_checked(done.stdout)
    assert len(skipped) == 1
    assert f"1 image(s) not checked in their registries: {unreachable} (" in skipped[0]
    assert "unreachable: ConnectionRefusedError" in skipped[0]
    assert (selection / "batch-run.json").is_file()


def test_with_skip_pull_no_registry_is_asked(tmp_path: Path) -> None:
    unreachable = f"127.0.0.1:{free_port()}/sciencebench/nowhere@sha256:" + "0e" * 32
    done, _ = _nop_dry_run(tmp_path, unreachable, "--skip-pull")
    assert done.returncode == 0, done.stderr
    assert not any("in their registries" in line for line in _not_checked(done.stdout))
