"""Start Pier from a process that has already imported it.

Pier's start-up is mostly importing LiteLLM: about 7 s of CPU per run on our
worker hosts, more than the rest of a trivial trial together. A zygote pays
that once: a long-lived helper process imports a console script's module,
then forks a fresh copy of itself for every run, which becomes the same
process a cold `pier ...` would have been. How runs are asked for, and die
with their requester, is in `Zygote`'s docstring. Nothing here knows Pier:
`sciencebench.worker.pier.process` decides when to use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from sciencebench.core.errors import SciencebenchError
from sciencebench.worker.pier import bounded

try:
    import setproctitle
except ImportError:  # an optional nicety of the worker extra
    setproctitle = None  # type: ignore[assignment]

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)
_CODE = struct.Struct("=q")
# Requests carry argv and a whole environment; far below the socket's limit.
_MAX_REQUEST = 1 << 20
# After its requester is gone a run gets SIGTERM, then SIGKILL this much later.
_ORPHAN_GRACE_SEC = 20.0
# How long a run may wait for its pid (the zygote may still be importing).
_START_TIMEOUT_SEC = 300.0
# Exit code reported when the zygote vanished before telling the run's end.
LOST = 255


def die_with_parent() -> None:
    """In a fresh child: get SIGTERM when the process that forked it dies.

    Runs in their own session (so a stop reaches the whole group), which also
    detaches them from their parent; without this, a killed worker or zygote
    would leave an orphaned Pier running a trial that is already being redone.
    Safe between fork and exec: libc was resolved at import.
    """
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ZygoteError(SciencebenchError, OSError):
    """The zygote could not start the run (nothing was started)."""


def load_entry(entry: str) -> Callable[[], Any]:
    """`module:attr` (a console-script entry point) to the callable it names."""
    module, _, attr = entry.partition(":")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target  # type: ignore[no-any-return]


# --- the requester's side -----------------------------------------------------------


class Run:
    """A run started by the zygote; the parts of `subprocess.Popen` sciencebench uses."""

    def __init__(self, pid: int, channel: socket.socket, argv: list[str]) -> None:
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None
        self._channel = channel

    def poll(self) -> int | None:
        """The exit code when the run has ended, else None (as `Popen.poll`)."""
        if self.returncode is None:
            self._read(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code (as `Popen.wait`); raises subprocess.TimeoutExpired."""
        if self.returncode is None and not self._read(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def _read(self, timeout: float | None) -> bool:
        with selectors.DefaultSelector() as selector:
            selector.register(self._channel, selectors.EVENT_READ)
            if not selector.select(timeout):
                return False
        data = self._channel.recv(_CODE.size)
        self._channel.close()
        if len(data) == _CODE.size:
            self.returncode = _CODE.unpack(data)[0]
            return True
        # The zygote vanished: its run got SIGTERM; whatever is left of its group goes now.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.returncode = LOST
        return True


class Zygote:
    """The requester's handle on one zygote process (shared by forked children).

        requester (worker)                 zygote (imported pier.cli.main)
          spawn(argv, env, cwd, log, memory) ▶ fork ─▶ child: own session,
          ◀── pid ─────────────────────────            stdin /dev/null, stdout and
          ◀── exit code (as Popen's) ──────  reap       stderr the log, cwd, exactly
                                                        `env`, title = argv, its memory
                                                        bound; runs the entry point;
                                                        exits normally

    - The zygote's own environment is the worker's without any trial secret;
      a run's environment (secrets included) exists only in its own child.
    - Requests go over one SOCK_SEQPACKET socket (one message each, so forked
      worker processes that inherited it can share one zygote). Each run has
      a private socket pair for its pid and exit code.
    - A run dies with whoever asked for it: when its requester's end of the
      pair closes (the worker process died), the zygote stops the run's whole
      process group. When no process holds the request socket any more, it
      does so for every run, then exits. When the zygote itself dies, its runs
      get SIGTERM (PR_SET_PDEATHSIG).
    """

    def __init__(self, entry: str, env: dict[str, str]) -> None:
        self.entry = entry
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "sciencebench.worker.pier.zygote", str(theirs.fileno()), entry],
                env=env, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True,
            )  # fmt: skip
        self._requests = ours
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        """The zygote's own pid."""
        return self._proc.pid

    def spawn(
        self, argv: list[str], env: dict[str, str], cwd: Path, log: BinaryIO, memory_limit: int = 0
    ) -> Run:
        """Start one run; raises ZygoteError when the zygote cannot (nothing started then).

        `memory_limit` bytes bound the run's data (`bounded.bound_memory`); 0: unbounded.
        """
        request = json.dumps({"argv": argv, "env": env, "cwd": str(cwd), "memory": memory_limit}).encode()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with theirs, self._lock:
                socket.send_fds(self._requests, [request], [theirs.fileno(), log.fileno()])
            # The first runs wait while the zygote is still importing; a stuck one is given up.
            mine.settimeout(_START_TIMEOUT_SEC)
            data = mine.recv(_CODE.size)
            mine.settimeout(None)
        except OSError as exc:
            mine.close()
            raise ZygoteError(exc.errno, f"zygote unavailable: {exc.strerror or exc}") from None
        if len(data) != _CODE.size:
            mine.close()
            raise ZygoteError(0, "zygote exited before starting the run")
        return Run(_CODE.unpack(data)[0], mine, argv)

    def close(self) -> None:
        """Stop taking requests; the zygote exits once no other process holds the socket."""
        self._requests.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)


# --- the zygote's side -----------------------------------------------------------


@dataclass
class _Child:
    request: dict[str, Any]
    log_fd: int


@dataclass
class _Tracked:
    channel: socket.socket | None
    kill_at: float | None = None


def _serve(requests: socket.socket) -> _Child | None:
    """Fork a child per request until the request socket is closed by every holder.

    Returns only in a forked child (with what it must become), or None in
    the zygote when it is time to exit: every holder is gone and so are the
    runs (stopped like those of a requester that died).
    """
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    runs: dict[int, _Tracked] = {}
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    accepting = True
    try:
        while accepting or runs:
            deadlines = [t.kill_at for t in runs.values() if t.kill_at is not None]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            for key, _ in selector.select(timeout):
                if key.data == "request":
                    message, fds, flags, _ = socket.recv_fds(requests, _MAX_REQUEST, 2)
                    if not message and not fds:
                        # Nobody can ask for a run or read one's end any more.
                        accepting = False
                        selector.unregister(requests)
                        for pid, tracked in list(runs.items()):
                            if tracked.channel is not None:
                                _requester_gone(pid, tracked, selector)
                        continue
                    if len(fds) != 2 or flags & socket.MSG_TRUNC:
                        for fd in fds:
                            os.close(fd)
                        continue
                    channel_fd, log_fd = fds
                    channel = socket.socket(fileno=channel_fd)
                    pid = os.fork()
                    if pid == 0:
                        channel.close()
                        for other in runs.values():
                            if other.channel is not None:
                                other.channel.close()
                        os.close(wake_r)
                        os.close(wake_w)
                        requests.close()
                        signal.set_wakeup_fd(-1)
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        return _Child(json.loads(message), log_fd)
                    os.close(log_fd)
                    with contextlib.suppress(OSError):
                        channel.send(_CODE.pack(pid))
                    runs[pid] = _Tracked(channel)
                    selector.register(channel, selectors.EVENT_READ, pid)
                elif key.data == "child":
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 4096)
                    _reap(runs, selector)
                elif (orphan := runs.get(key.data)) is not None and orphan.channel is not None:
                    # (A run reaped earlier in this batch has no channel left to watch.)
                    _requester_gone(key.data, orphan, selector)
            now = time.monotonic()
            for pid, tracked in runs.items():
                if tracked.kill_at is not None and tracked.kill_at <= now:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    tracked.kill_at = None
    finally:
        selector.close()
    return None


def _reap(runs: dict[int, _Tracked], selector: selectors.BaseSelector) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        tracked = runs.pop(pid, None)
        if tracked is None:
            continue
        if tracked.channel is None:
            # Nobody waits for this run: what is left of its group goes with its leader.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            continue
        selector.unregister(tracked.channel)
        with contextlib.suppress(OSError):
            tracked.channel.send(_CODE.pack(os.waitstatus_to_exitcode(status)))
        tracked.channel.close()


def _requester_gone(pid: int, tracked: _Tracked, selector: selectors.BaseSelector) -> None:
    """The requester closed its end while the run lives: it died, so the run must too."""
    assert tracked.channel is not None
    selector.unregister(tracked.channel)
    tracked.channel.close()
    tracked.channel = None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    tracked.kill_at = time.monotonic() + _ORPHAN_GRACE_SEC


def _become(child: _Child, zygote_pid: int) -> None:
    """Turn a fresh fork into the process a cold start of `argv` would have been."""
    os.setsid()
    die_with_parent()
    if os.getppid() != zygote_pid:
        os._exit(LOST)  # the zygote died between fork and prctl
    request = child.request
    if request.get("memory"):  # before anything else of the run
        bounded.bound_memory(int(request["memory"]))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(child.log_fd, 1)
    os.dup2(child.log_fd, 2)
    os.close(devnull)
    os.close(child.log_fd)
    os.chdir(request["cwd"])
    sys.argv = list(request["argv"])
    # `ps` shows the run's argv. Before the environment is replaced: setproctitle
    # needs the original environment block it takes over for a longer title.
    if setproctitle is not None:
        setproctitle.setproctitle(" ".join(sys.argv))
    os.environ.clear()
    os.environ.update(request["env"])


def main(argv: list[str]) -> int:
    """`python -m sciencebench.worker.pier.zygote <request fd> <module:attr>`."""
    zygote_pid = os.getpid()
    requests = socket.socket(fileno=int(argv[1]))
    entry = argv[2]
    # Imported before any fork: the whole point. A failure is left for each run to
    # report in its own log, exactly as a cold start would.
    try:
        load_entry(entry)
    except Exception as exc:
        print(f"sciencebench zygote: cannot import {entry} ({type(exc).__name__}: {exc}); "
              "every run will try on its own", file=sys.stderr, flush=True)  # fmt: skip
    child = _serve(requests)
    if child is None:
        return 0
    _become(child, zygote_pid)
    target = load_entry(entry)
    result = target()
    return 0 if result is None else int(result)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
