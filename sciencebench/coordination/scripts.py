"""The store's Lua scripts over Redis, each in a file of `lua/` with its keys named.

A script is `lua/<name>.lua` after the functions it uses (`lua/lib/<name>.lua`),
one atomic step on the Redis server. Its header names each `KEYS[i]`; `keys`
here names them alike, and a call names a job and a trial: each name's Redis
key is `store_keys`'s (the keys of `coordination.protocol`), so no caller
counts positions (`tests/unit/test_lua_scripts.py` checks the names agree).
The files ship inside the package (the wheel carries them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

import redis
from redis.commands.core import AsyncScript
from redis.commands.core import Script as RedisScript
from redis.typing import EncodableT

from sciencebench.coordination.keys import (
    GATEWAYS_KEY,
    HISTORY_KEY,
    HOLDS_KEY,
    JOBS_KEY,
    PULLING_KEY,
    ROUTED_KEY,
    SHARES_KEY,
    WEIGHTS_KEY,
    ClusterKeys,
    JobKeys,
)

LUA = files("sciencebench.coordination") / "lua"


@dataclass(frozen=True)
class Script:
    """One script: its file, the functions it uses (in order), and what its `KEYS[1..n]` are."""

    name: str
    keys: tuple[str, ...]
    uses: tuple[str, ...] = ()

    def source(self) -> str:
        """The text Redis runs: the functions used, then the script."""
        return _source(self)

    def key_list(self, job: str, key: str = "", authority: str = "", host: str = "") -> list[str]:
        """The `KEYS` list in the script's order, for the job's trial `key` (`store_keys`)."""
        named = store_keys(job, key, authority, host)
        return [named[name] for name in self.keys]


def store_keys(job: str, key: str = "", authority: str = "", host: str = "") -> Mapping[str, str]:
    """Each name a script's `KEYS` use -> its Redis key, for a job's trial `key` (`coordination.protocol`).

    `authority`: a model gateway's `host:port`, for the gateway limits' keys (`coordination.gateways`);
    `host`: a worker host, for its capacity's keys (`Slots.take_room`).
    """
    job_keys = JobKeys(job)
    return {
        "jobs": JOBS_KEY,
        "gateways": GATEWAYS_KEY,
        "gateway": ClusterKeys.gateway(authority),
        "gateway_slots": ClusterKeys.gateway_slots(authority),
        "room": ClusterKeys.room(host),
        "room_requests": ClusterKeys.room_requests(host),
        "history": HISTORY_KEY,
        "shares": SHARES_KEY,
        "weights": WEIGHTS_KEY,
        "holds": HOLDS_KEY,
        "routed": ROUTED_KEY,
        "pulling": PULLING_KEY,
        "lease": job_keys.lease(key),
        "result": job_keys.result(key),
        "counted": job_keys.counted(key),
        "running": job_keys.running,
        "slots": job_keys.slots,
        "state": job_keys.state,
        "cancelled": job_keys.cancelled,
        "waiting": job_keys.waiting,
        "waiting_payloads": job_keys.waiting_payloads,
        "held": job_keys.held,
        "held_payloads": job_keys.held_payloads,
        "held_tasks": job_keys.held_tasks,
        "held_probe": job_keys.held_probe,
        "held_meta": job_keys.held_meta,
        "budget": job_keys.budget,
        "budget_started": job_keys.budget_started,
    }


@cache
def _source(script: Script) -> str:
    parts = [(LUA / "lib" / f"{name}.lua").read_text(encoding="utf-8") for name in script.uses]
    return "".join([*parts, (LUA / f"{script.name}.lua").read_text(encoding="utf-8")])


_BUDGET = ("budget", "budget_started")
# A job's held trials (`Slots.hold`).
HELD = ("held", "held_payloads", "held_tasks", "held_probe", "held_meta")

PARK = Script("park", ("lease", "jobs", "counted"), uses=("park_absent",))
RENEW = Script("renew", ("lease", "running"), uses=("rightful",))
COMMIT = Script(
    "commit",
    ("lease", "running", "result", "state", *_BUDGET),
    uses=("rightful", "budget_reached", "add_spend"),
)
FINISH = Script("finish", ("lease", "running", "slots"), uses=("rightful",))
WAIT = Script("wait", ("waiting", "waiting_payloads"))
TAKE_ORPHAN = Script("take_orphan", ("lease", "running"))
SLOT = Script("slot", ("slots",), uses=("take_slot",))
ROOM = Script("room", ("room", "room_requests"), uses=("take_room",))
START = Script(
    "start",
    ("lease", "result", "jobs", "cancelled", "slots", "running", *_BUDGET, "counted"),
    uses=("take_slot", "budget_reached", "let_start"),
)
NEXT_WAITING = Script(
    "next_waiting",
    ("waiting", "waiting_payloads", *HELD, "running", "jobs"),
    uses=("measured", "park_absent", "guard"),
)
RELEASE_HELD = Script("release_held", (*HELD, "running", "jobs"), uses=("park_absent", "guard"))
ADD_DURATIONS = Script("add_durations", ("history",))
SET_BUDGET = Script("set_budget", _BUDGET, uses=("budget_reached",))
START_WITHIN_BUDGET = Script("start_within_budget", _BUDGET, uses=("budget_reached", "let_start"))

# Fair share and placement: keys of the whole cluster, no job's.
SHARE_CHOOSE = Script("share_choose", ("shares", "weights"))
PLACE_LOADS = Script("place_loads", ("jobs", "routed"))
PLACE_REPORT = Script("place_report", ("holds", "pulling"))
PLACE_LINES = Script("place_lines", ("jobs", "routed"), uses=("measured",))

# A model gateway's cluster-wide limit (`coordination.gateways`): keys of one authority, no job's.
GATEWAY_ACQUIRE = Script("gateway_acquire", ("gateway", "gateway_slots", "gateways"))
GATEWAY_RENEW = Script("gateway_renew", ("gateway_slots",))
GATEWAY_ADJUST = Script("gateway_adjust", ("gateway",))

ALL = (PARK, RENEW, COMMIT, FINISH, WAIT, TAKE_ORPHAN, SLOT, ROOM, START, NEXT_WAITING, RELEASE_HELD,
       ADD_DURATIONS, SET_BUDGET, START_WITHIN_BUDGET, SHARE_CHOOSE, PLACE_LOADS, PLACE_REPORT,
       PLACE_LINES, GATEWAY_ACQUIRE, GATEWAY_RENEW, GATEWAY_ADJUST)  # fmt: skip


class Registered:
    """A script registered with a client (`EVALSHA`, loaded again when the server lost it)."""

    def __init__(self, client: redis.Redis, script: Script) -> None:
        self.script = script
        self._run: RedisScript | AsyncScript = client.register_script(script.source())

    def __call__(
        self, job: str, key: str, args: Sequence[EncodableT] = (), authority: str = "", host: str = ""
    ) -> Any:
        """Run it on the job's trial `key` (its keys by name, `store_keys`) with `args` (its ARGV)."""
        return self._run(keys=self.script.key_list(job, key, authority, host), args=list(args))
