"""The coordination contract over Redis: every operation is one round trip or one script.

`RedisCoordinator`: one part per concept of `coordination.protocol`, each a module over one client (`base`).

    leases   Results, Leases          records, fenced leases, running entries, locks
    holds    Slots                    the job's cap, trials waiting for a slot, held trials
    jobs     JobControl, History, Budgets: cancel flags, unfit hosts, chords; durations; spend
    board    Board, Shares            trial states, worker hosts; fair share

Scripts: `coordination/lua/` (`coordination.scripts`); keys: `coordination.keys`.
"""

from __future__ import annotations

from sciencebench.coordination.protocol import Coordinator
from sciencebench.coordination.redis.board import RedisBoard
from sciencebench.coordination.redis.holds import RedisSlots
from sciencebench.coordination.redis.jobs import RedisJobs
from sciencebench.coordination.redis.leases import RedisLeases

__all__ = ["RedisCoordinator"]


class RedisCoordinator(RedisLeases, RedisSlots, RedisJobs, RedisBoard, Coordinator):
    """`Coordinator` over Redis (see the module docstring); `ping` answers at once."""
