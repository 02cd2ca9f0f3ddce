"""The process that opens a task's files with the rights of the job's owner (`worker.ownerread`).

Run as `python -I -S ownerread_child.py UID GID [GROUP ...]` (standard library
only) by a root worker, its socket as descriptor 3. Before it reads anything
it takes the owner's groups, gid and uid (real, effective and saved: root's
capabilities go, and the owner may not trace it). It then answers requests
until the worker closes its end: `os.open` flags, a path and an optional
directory descriptor in; the open's errno, and the descriptor when 0, out.
Every check of the kernel is the owner's.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import sys

SOCKET_FD = 3
REQUEST_BYTES = 8192
INT = struct.Struct("=i")


def drop_to(uid: int, gid: int, groups: list[int]) -> None:
    """Become `uid` with primary group `gid` and supplementary `groups`, for good."""
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise SystemExit(2)
    if set(os.getgroups()) - {gid} != set(groups) - {gid}:
        raise SystemExit(2)
    if any(value != 0 for value in capabilities().values()):
        raise SystemExit(2)  # kept across the setuid (a securebit set by the worker's supervisor)


def capabilities() -> dict[str, int]:
    """This process's permitted, effective and ambient capability sets (`/proc/self/status`)."""
    with open("/proc/self/status", "rb") as status:  # bytes: `-S` leaves no text codec to look up
        fields = dict(line.split(b":", 1) for line in status if b":" in line)
    return {name: int(fields[name.encode()], 16) for name in ("CapPrm", "CapEff", "CapAmb")}


def answer(sock: socket.socket, message: bytes, fds: list[int], flags: int) -> None:
    """Open what one request names and send back the errno (0) and the descriptor."""
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(message) <= INT.size or len(fds) > 1:
            raise OSError(errno.EINVAL, "not a request")
        (open_flags,) = INT.unpack_from(message)
        opened = os.open(message[INT.size :], open_flags, dir_fd=fds[0] if fds else None)
    except OSError as exc:
        socket.send_fds(sock, [INT.pack(exc.errno or errno.EIO)], [])
        return
    finally:
        for fd in fds:
            os.close(fd)
    try:
        socket.send_fds(sock, [INT.pack(0)], [opened])
    finally:
        os.close(opened)


def main(argv: list[str]) -> int:
    """Serve the worker as the account `argv` names (UID GID [GROUP ...]); the exit code."""
    uid, gid, *groups = (int(arg) for arg in argv)
    if uid == 0:
        return 2  # the worker reads as root itself; this process exists to be someone else
    os.closerange(SOCKET_FD + 1, os.sysconf("SC_OPEN_MAX"))  # nothing of the worker's but the socket
    drop_to(uid, gid, groups)
    with socket.socket(fileno=SOCKET_FD) as sock:
        while True:
            message, fds, flags, _ = socket.recv_fds(sock, REQUEST_BYTES, 1)
            if not message:  # the worker closed its end
                for fd in fds:
                    os.close(fd)
                return 0
            answer(sock, message, fds, flags)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
