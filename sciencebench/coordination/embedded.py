"""The embedded mode's store: a private redis-server of the host's state dir, on a unix socket.

`submit --local` runs the cluster's coordination code (`coordination.redis`)
on it. The server listens on `<state dir>/store/redis.sock` only (no TCP
port, socket and directory 0700), keeps its data there (append-only file),
and runs on after the command that started it, so a local job's state
outlives its process; the next command finds it (under a file lock) or
starts it again. `coordinator` is the one way to it (`is_running` asks
without starting it). Its failures are EmbeddedStoreError, which names its
directory, not a broker.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import override

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.errors import BrokerUnavailableError, EmbeddedStoreError, SettingsError

STORE_DIR = "store"
SOCKET = "redis.sock"
PIDFILE = "redis.pid"
# How long a server may take to answer after its start (it reads its append-only file first).
READY_SEC = 60.0
# The longest path a unix socket may have (sun_path, less its terminating NUL).
_SOCKET_PATH_MAX = 107


def store_dir(state_dir: Path) -> Path:
    """Where the embedded server keeps its socket, data, pid and log: `<state dir>/store` (absolute)."""
    return state_dir.absolute() / STORE_DIR  # the server resolves its paths after its chdir there


def socket_path(state_dir: Path) -> Path:
    """The embedded server's unix socket."""
    return store_dir(state_dir) / SOCKET


def server_binary() -> str | None:
    """The `redis-server` executable on PATH (Debian's package redis-server), else None."""
    return shutil.which("redis-server")


def check_embedded(state_dir: Path) -> None:
    """Raise SettingsError (one line, exit 2) when this host cannot run the embedded store."""
    if server_binary() is None:
        raise SettingsError("submit --local needs redis-server on PATH (Debian package redis-server)")
    if len(str(socket_path(state_dir))) > _SOCKET_PATH_MAX:
        raise SettingsError(
            f"SCIENCEBENCH_STATE_DIR is too long for the embedded store's socket: {socket_path(state_dir)}"
        )


class EmbeddedCoordinator(RedisCoordinator):
    """A coordinator of the state dir's embedded server: its failures name the server, not a broker."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(f"unix://{socket_path(state_dir)}")
        self.directory = store_dir(state_dir)

    @override
    def unavailable(self, problem: str) -> BrokerUnavailableError:
        """The embedded store's `problem`, with where it keeps its socket, data and log."""
        return EmbeddedStoreError(f"the embedded store {problem}", self.directory)


def coordinator(state_dir: Path) -> EmbeddedCoordinator:
    """A coordinator connected to the state dir's embedded server, which is started when not running."""
    ensure(state_dir)
    coord = EmbeddedCoordinator(state_dir)
    coord.ping()
    return coord


def is_running(state_dir: Path) -> bool:
    """Whether the state dir's server runs and answers now; nothing is started to find out."""
    return _answers(socket_path(state_dir))


def ensure(state_dir: Path) -> Path:
    """The socket of the state dir's running server: found, or started (one command at a time)."""
    check_embedded(state_dir)
    directory = store_dir(state_dir)
    sock = socket_path(state_dir)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.chmod(0o700)
        with _locked(directory):
            if _answers(sock):
                return sock
            if _server_pid(directory) is None:  # none runs (else it is still loading its data: wait)
                sock.unlink(missing_ok=True)
                _start(directory)
            _wait_ready(sock, directory)
    except OSError as exc:  # its directory cannot be made, locked or written: where, not a traceback
        where = f": {exc.filename}" if exc.filename else ""
        raise EmbeddedStoreError(
            f"the embedded store did not start: {exc.strerror or exc.__class__.__name__}{where}", directory
        ) from None
    return sock


def stop(state_dir: Path) -> None:
    """Stop the state dir's server, if one runs (its data stays); return once it has exited."""
    directory = store_dir(state_dir)
    pid = _server_pid(directory)
    if pid is None:
        return
    os.kill(pid, 15)  # SIGTERM: the server writes its append-only file out and exits
    deadline = time.monotonic() + READY_SEC
    while _server_pid(directory) == pid and time.monotonic() < deadline:
        time.sleep(0.02)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    with open(directory / "lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _answers(sock: Path) -> bool:
    if not sock.exists():
        return False
    client = redis.Redis(unix_socket_path=str(sock), socket_timeout=5, retry=Retry(NoBackoff(), 0))
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _server_pid(directory: Path) -> int | None:
    """The pid of the server that runs in `directory` (by its pid file and its title), else None."""
    try:
        pid = int((directory / PIDFILE).read_text(encoding="utf-8").strip())
        title = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    # Its title names its socket (`--proc-title-template`): a pid reused by another process is not it.
    return pid if f"unixsocket:{directory / SOCKET}".encode() in title else None


def _start(directory: Path) -> None:
    binary = server_binary()
    assert binary is not None  # check_embedded
    # Its own session (daemonize): it outlives this command. No TCP port, no RDB snapshots.
    started = subprocess.run(
        [binary, "--port", "0", "--unixsocket", str(directory / SOCKET), "--unixsocketperm", "700",
         "--dir", str(directory), "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
         "--maxmemory-policy", "noeviction", "--daemonize", "yes", "--pidfile", str(directory / PIDFILE),
         "--logfile", str(directory / "redis.log"), "--proc-title-template", "{title} {listen-addr}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False,
    )  # fmt: skip
    if started.returncode != 0:
        why = started.stderr.decode(errors="replace").strip().splitlines()
        raise EmbeddedStoreError(
            f"the embedded store did not start: {why[-1] if why else started.returncode}", directory
        )


def _wait_ready(sock: Path, directory: Path) -> None:
    deadline = time.monotonic() + READY_SEC
    while not _answers(sock):
        if time.monotonic() > deadline:
            raise EmbeddedStoreError(
                f"the embedded store did not start: see {directory / 'redis.log'}", directory
            )
        time.sleep(0.02)
