"""Redis ACL users per role, generated from the scripts each role runs (`compose/redis-users.acl`).

`login` (submit, status, cancel: enqueues, reads state, never takes, renews or
commits a lease), `worker`, `flower` (reads, listens, inspects; writes only its
own queues), `admin` (the operator's redis-cli); `default` may only PING (the
compose healthcheck). `python -m sciencebench.coordination.acl` writes the
file: without passwords the reviewable rules (every user `off`, as committed);
with `--passwords FILE` (lines `role=password`) the deployable one, holding each
password's SHA-256 only. `tests/unit/test_acl.py` checks the committed file.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from celery.backends.redis import (  # type: ignore[attr-defined]  # not in the stubs
    CHORD_CLAIM_EXTEND_LUA,
    CHORD_CLEANUP_LUA,
    CHORD_PART_RETURN_LUA,
)
from kombu.transport.redis import REFRESH_BINDING, SWEEP_BINDINGS  # type: ignore[attr-defined]
from redis.lock import Lock

from sciencebench.coordination import scripts

# What the ACL can and cannot do. Redis checks each command a Lua script calls, and each key
# it names, against the user that runs the script, so a script can do no more than its
# caller could with plain commands. But a permission cannot be tied to a script: a user
# whose scripts write a key may write it with SET or HSET too. So the roles are kept apart
# by key patterns and commands, not by the scripts they may run: the login user writes no
# record or count, and no lease but by renaming its own parking key onto an absent one
# (`lua/lib/park_absent.lua`, a Redis 7 selector), so it cannot take a worker's lease, by
# script or by hand. Scripts run by `EVALSHA` of their known hashes only (no `EVAL` or
# `FUNCTION`): no arbitrary script, though one could do nothing its caller could not.
# The channels assume database 0 (`/0` in every broker URL).

# Commands every role but flower's may use on the keys its patterns allow (no EVAL, no admin command).
_DATA = ("+@read", "+@write", "+@pubsub", "+@transaction", "+@connection", "+@blocking", "-@dangerous",
         "+time", "+ping", "+select", "+client|setname", "+client|id", "+info",
         "+script|load", "+script|exists")  # fmt: skip
# The queues and bindings kombu writes when it sends a message, and Celery's results and chord state.
_SEND_KEYS = ("celery", "celery.host.*", "*.dq2", "_kombu.binding.*", "_kombu.binding_permanent.*",
              "_kombu.binding_deadlines", "celery-task-meta-*", "celery-taskset-meta-*",
              "chord-unlock-*")  # fmt: skip
# The store keys a submit, status, cancel or retry writes: never a lease, a record or a count. The
# running entries of held trials it sends are its too (`lib/guard.lua`), and their parking keys.
_LOGIN_STATE = ("sciencebench:jobs", "sciencebench:history", "sciencebench:shares",
                "sciencebench:shares:weights", "sciencebench:place:*", "sciencebench:hosts:holds",
                "sciencebench:*:cancelled", "sciencebench:*:slots",
                "sciencebench:*:waiting", "sciencebench:*:waiting:payloads", "sciencebench:*:held",
                "sciencebench:*:held:*", "sciencebench:*:budget", "sciencebench:*:dispatches",
                "sciencebench:*:share:sent", "sciencebench:*:requests", "sciencebench:*:state",
                "sciencebench:*:unfit",
                "sciencebench:lock:*", "sciencebench:*:parking:*", "sciencebench:*:running")  # fmt: skip


def _sha(source: str) -> str:
    return hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()


# Celery's task events (kombu's fanout channels of database 0, the broker URLs' `/0`); PSUBSCRIBE
# is allowed a pattern only as it is written here.
_EVENTS = "&/0.celeryev/*"
_LEASE = "sciencebench:*:lease:*"
# A login node parks held trials it sends (`lib/park_absent.lua`): it may rename its parking
# key onto an absent lease (RENAMENX: never over one that exists, never one away, as it
# cannot read a lease under this selector) and run `park.lua`, whose keys name the lease.
_LOGIN_SELECTORS = (
    f"(%RW~sciencebench:*:parking:* %W~{_LEASE} +renamenx)",
    f"(%RW~{_LEASE} %RW~sciencebench:jobs %RW~sciencebench:*:counted:* "
    f"+evalsha|{_sha(scripts.PARK.source())})",
)


# Flower reads, and keeps its own event queue and its inspect replies' queue. Its event capture
# wakes the workers and it inspects them by broadcast, so it may publish on their control
# channel: read-only Flower (FLOWER_READ_ONLY) sends nothing else, and its password is the operator's.
_FLOWER = ("+@read", "-@dangerous", "+@connection", "+@transaction", "+subscribe", "+psubscribe",
           "+unsubscribe", "+punsubscribe", "+ping", "+select", "+info", "+client|setname", "+time",
           "+set", "+sadd", "+srem", "+zadd", "+del", "+brpop", "+publish", "+script|load",
           "+script|exists")  # fmt: skip
# kombu's consumer takes `unacked_mutex` (redis-py's lock) before it looks for unacknowledged messages.
_FLOWER_KEYS = ("celeryev.*", "*.reply.celery.pidbox*", "unacked_mutex", "_kombu.binding.celeryev",
                "_kombu.binding_deadlines",
                "_kombu.binding_permanent.celeryev", "_kombu.binding.reply.celery.pidbox",
                "_kombu.binding_permanent.reply.celery.pidbox")  # fmt: skip
# Celery's chord scripts, kombu's binding scripts and redis-py's lock (kombu's mutex), as registered.
_CELERY = (CHORD_PART_RETURN_LUA, CHORD_CLEANUP_LUA, CHORD_CLAIM_EXTEND_LUA, REFRESH_BINDING, SWEEP_BINDINGS,
           Lock.LUA_RELEASE_SCRIPT, Lock.LUA_EXTEND_SCRIPT, Lock.LUA_REACQUIRE_SCRIPT)  # fmt: skip
# The store's scripts a login node runs: placing and holding trials, budgets, fair share; no lease's.
LOGIN_SCRIPTS = (scripts.WAIT, scripts.SLOT, scripts.NEXT_WAITING, scripts.RELEASE_HELD, scripts.SET_BUDGET,
                 scripts.SHARE_CHOOSE, scripts.PLACE_LOADS, scripts.PLACE_REPORT, scripts.PLACE_LINES,
                 scripts.ADD_DURATIONS)  # fmt: skip


@dataclass(frozen=True)
class Role:
    """One ACL user: its commands, key patterns, channels and the scripts it may run by hash."""

    name: str
    about: str
    commands: tuple[str, ...]
    keys: tuple[str, ...]
    channels: tuple[str, ...]
    sources: tuple[str, ...] = ()
    # Further permission sets (Redis 7 selectors): a command any one of them allows in full runs.
    selectors: tuple[str, ...] = ()

    def rules(self) -> list[str]:
        """The user's rules after its password, in ACL file syntax."""
        hashes = sorted({_sha(source) for source in self.sources})
        return ["resetkeys", *self.keys, "resetchannels", *self.channels, "-@all", *self.commands,
                *(f"+evalsha|{sha}" for sha in hashes), *self.selectors]  # fmt: skip


ROLES = (
    Role("login", "login nodes: enqueue trials, read state; no lease, record or count",
         _DATA, ("%R~*", *(f"%RW~{key}" for key in (*_SEND_KEYS, *_LOGIN_STATE))),
         (_EVENTS, "&celery-task-meta-*"),
         (*(script.source() for script in LOGIN_SCRIPTS), *_CELERY), _LOGIN_SELECTORS),
    Role("worker", "worker hosts: take, renew and commit leases, consume trials",
         _DATA, ("~*",), ("&*",), (*(script.source() for script in scripts.ALL), *_CELERY)),
    Role("flower", "Flower: reads state and events, inspects workers, writes only its own queues",
         _FLOWER, ("%R~*", *(f"%RW~{key}" for key in _FLOWER_KEYS)), (_EVENTS, "&/0.celery.pidbox"),
         (REFRESH_BINDING, SWEEP_BINDINGS, Lock.LUA_RELEASE_SCRIPT, Lock.LUA_EXTEND_SCRIPT)),
    Role("admin", "the operator's redis-cli", ("+@all",), ("~*",), ("&*",)),
)  # fmt: skip
ROLE_NAMES = tuple(role.name for role in ROLES)


def render(passwords: Mapping[str, str] | None = None) -> str:
    """The ACL file: each role's user, `on` with its password's SHA-256 when given one, else `off`."""
    passwords = passwords or {}
    unknown = sorted(set(passwords) - set(ROLE_NAMES))
    if unknown:
        raise ValueError(f"no such role: {unknown[0]} (roles: {', '.join(ROLE_NAMES)})")
    # Redis takes no comments in an ACL file: each role's `about` is in ROLES.
    lines = ["user default on nopass resetkeys resetchannels -@all +ping"]
    for role in ROLES:
        password = passwords.get(role.name)
        login = ["on", "#" + hashlib.sha256(password.encode()).hexdigest()] if password else ["off"]
        lines.append(" ".join(["user", role.name, *login, *role.rules()]))
    return "\n".join(lines) + "\n"


def _read_passwords(path: Path) -> dict[str, str]:
    passwords = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        role, sep, password = line.partition("=")
        if not sep or not password.strip() or any(ch.isspace() for ch in password.strip()):
            raise ValueError(f"{path}:{number}: expected role=password (no spaces in the password)")
        passwords[role.strip()] = password.strip()
    return passwords


def main(argv: Sequence[str] | None = None) -> int:
    """Write the ACL file (`--out`, default stdout); exit 2 on a bad passwords file."""
    parser = argparse.ArgumentParser(prog="python -m sciencebench.coordination.acl", description=__doc__)
    parser.add_argument("--passwords", type=Path, help="lines role=password (else every user is off)")
    parser.add_argument("--out", type=Path, help="the file to write (default: stdout)")
    args = parser.parse_args(argv)
    try:
        text = render(_read_passwords(args.passwords) if args.passwords else None)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
