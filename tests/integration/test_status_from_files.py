"""Honest answers about a job: from its files when the store does not know it, one line when nobody does.

The installed entry point, as a user runs it, on the fixed jobs of
`tests.fixtures.job_files` (a nop job with twelve trial records, a codex job
with none): with SCIENCEBENCH_BROKER_URL on a closed loopback port (its
password the canary), or on a real redis-server that never saw the jobs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sciencebench.core.models import JobSpec
from sciencebench.core.summary import write_summary
from tests.fixtures.job_files import codex_job, nop_job
from tests.fixtures.services import RedisServer, free_port

pytestmark = pytest.mark.integration

SCIENCEBENCH = Path(sys.executable).parent / "sciencebench"
CANARY = "canary-status-pw-4b7d"


def _run(broker_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SCIENCEBENCH_")}
    env["SCIENCEBENCH_BROKER_URL"] = broker_url
    env["COLUMNS"] = "200"
    return subprocess.run(
        [str(SCIENCEBENCH), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _closed() -> str:
    return f"redis://default:{CANARY}@127.0.0.1:{free_port()}/0"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> RedisServer:
    server = RedisServer(tmp_path_factory.mktemp("redis-status"), password=CANARY)
    server.start()
    yield server  # type: ignore[misc]
    server.stop()


@pytest.fixture
def nop(tmp_path: Path) -> JobSpec:
    job, _ = nop_job(tmp_path / "nop")
    return job


@pytest.fixture
def codex(tmp_path: Path) -> JobSpec:
    job, _, _ = codex_job(tmp_path / "codex")
    return job


def _one_error_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.startswith("sciencebench: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and CANARY not in done.stderr
    return done.stderr


def test_a_name_with_no_job_directory_is_one_line_exit_2(tmp_path: Path) -> None:
    line = _one_error_line(_run(_closed(), "status", "nobody", "--jobs-dir", str(tmp_path / "jobs")), 2)
    assert "no job 'nobody'" in line


def test_without_a_broker_a_job_answers_from_its_records(nop: JobSpec) -> None:
    done = _run(_closed(), "status", nop.job_name, "--jobs-dir", str(nop.jobs_dir))
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"job golden-nop: from its files in {nop.job_dir} (broker unreachable: ")
    assert "redis://default:***@127.0.0.1:" in first and "SCIENCEBENCH_BROKER_URL" in first
    assert "golden-nop: 12 of 12 trial(s) recorded, 6 failed" in done.stdout
    assert "no summary yet" in done.stdout
    assert "unknown" not in done.stdout and "ETA" not in done.stdout
    assert CANARY not in done.stdout + done.stderr


def test_a_finished_job_the_store_forgot_answers_from_its_summary(nop: JobSpec, broker: RedisServer) -> None:
    write_summary(nop)
    done = _run(broker.url, "status", nop.job_name, "--jobs-dir", str(nop.jobs_dir))
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first == (
        f"job golden-nop: from its files in {nop.job_dir} "
        f"(the broker at redis://default:***@127.0.0.1:{broker.port}/0 does not know it)"
    )
    assert "golden-nop: 12 trial(s), 1 not started" in done.stdout
    assert "unknown" not in done.stdout and "waiting" not in done.stdout
    assert CANARY not in done.stdout + done.stderr


def test_a_job_directory_moved_elsewhere_answers_from_where_it_is(nop: JobSpec, tmp_path: Path) -> None:
    moved = nop.jobs_dir.rename(tmp_path / "moved")
    done = _run(_closed(), "status", nop.job_name, "--jobs-dir", str(moved))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"job golden-nop: from its files in {moved / 'golden-nop'} (")
    assert "12 of 12 trial(s) recorded" in done.stdout


def test_a_job_neither_the_store_nor_its_files_know_is_one_line_exit_2(
    codex: JobSpec, broker: RedisServer
) -> None:
    line = _one_error_line(_run(broker.url, "status", codex.job_name, "--jobs-dir", str(codex.jobs_dir)), 2)
    assert line == (
        f"sciencebench: error: job golden-codex: the broker at redis://default:***@127.0.0.1:{broker.port}/0 "
        f"does not know it and {codex.job_dir} holds no trial record or summary\n"
    )


@pytest.mark.parametrize(
    "command",
    [
        ["status", "golden-codex"],
        ["cancel", "golden-codex"],
        ["retry", "golden-codex", "--failed"],
        ["share"],
    ],
)
def test_every_commands_broker_error_names_the_url_and_the_variable(
    codex: JobSpec, command: list[str]
) -> None:
    url = _closed()
    args = [*command, "--jobs-dir", str(codex.jobs_dir)] if command != ["share"] else command
    line = _one_error_line(_run(url, *args), 1)
    masked = url.replace(CANARY, "***")
    assert line == (
        f"sciencebench: error: broker unreachable: ConnectionError at {masked}; "
        "set SCIENCEBENCH_BROKER_URL to the cluster's Redis\n"
    )
