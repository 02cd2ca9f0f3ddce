"""The embedded mode's store: a private redis-server of the state dir, shared, persistent, restarted.

Each case starts real servers (`coordination.embedded`) under its own state
dir and stops them at its end.
"""

from __future__ import annotations

import os
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.coordination import embedded
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    yield state
    embedded.stop(state)


def test_the_server_listens_only_on_a_private_unix_socket_and_keeps_an_append_only_file(state: Path) -> None:
    coord = embedded.coordinator(state)
    config = coord.client.config_get("*")
    coord.close()
    assert (config["port"], config["appendonly"]) == ("0", "yes")  # no TCP port
    assert config["unixsocket"] == str(embedded.socket_path(state))
    assert stat.S_IMODE(embedded.store_dir(state).stat().st_mode) == 0o700
    assert stat.S_IMODE(embedded.socket_path(state).stat().st_mode) == 0o700


def test_its_data_outlives_the_server_and_a_killed_server_is_started_again(state: Path) -> None:
    coord = embedded.coordinator(state)
    coord.store_result("job", "001#1", '{"a": 1}')
    coord.close()
    embedded.stop(state)  # as a reboot would
    assert embedded._server_pid(embedded.store_dir(state)) is None
    coord = embedded.coordinator(state)
    assert coord.get_result("job", "001#1") == '{"a": 1}'
    pid = embedded._server_pid(embedded.store_dir(state))
    assert pid is not None
    coord.close()
    os.kill(pid, signal.SIGKILL)  # dead, its socket file left behind
    coord = embedded.coordinator(state)
    assert embedded._server_pid(embedded.store_dir(state)) not in (None, pid)
    assert coord.get_result("job", "001#1") == '{"a": 1}'
    coord.close()


def test_a_relative_state_dir_is_its_absolute_path(
    tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    coord = embedded.coordinator(Path(state.name))
    assert coord.client.config_get("unixsocket")["unixsocket"] == str(embedded.socket_path(state))
    coord.close()


def test_commands_at_once_share_one_server(state: Path) -> None:
    sockets: list[Path] = []
    threads = [threading.Thread(target=lambda: sockets.append(embedded.ensure(state))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sockets == [embedded.socket_path(state)] * 4
    servers = [
        pid for pid in os.listdir("/proc")
        if pid.isdigit() and str(embedded.store_dir(state)).encode() in _cmdline(pid)
    ]  # fmt: skip
    assert len(servers) == 1


def _cmdline(pid: str) -> bytes:
    try:
        return (Path("/proc") / pid / "cmdline").read_bytes()
    except OSError:
        return b""


def test_a_local_submit_without_redis_server_is_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    jobs = tmp_path / "jobs"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no redis-server on it
    monkeypatch.setenv("SCIENCEBENCH_STATE_DIR", str(tmp_path / "state"))
    result = CliRunner().invoke(
        cli.main, ["submit", "--local", "--path", str(selection), "--jobs-dir", str(jobs), "--job-name", "t"]
    )
    assert result.exit_code == 2, result.output
    assert (
        result.stderr
        == "sciencebench: error: submit --local needs redis-server on PATH (Debian package redis-server)\n"
    )
    assert not jobs.exists() and not (selection / ".sciencebench").exists()
    assert not (tmp_path / "state").exists()
