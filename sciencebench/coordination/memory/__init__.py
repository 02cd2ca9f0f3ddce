"""The coordination contract in memory, for the embedded mode (`submit --local`, no Redis).

`MemoryCoordinator` is made of the same parts as `RedisCoordinator`
(`coordination.redis`), each a module here over one store in the process
(`base`): leases (Results, Leases), holds (Slots), jobs (JobControl, History,
Budgets), board (Board, Shares).
"""

from __future__ import annotations

from sciencebench.coordination.memory.board import MemoryBoard
from sciencebench.coordination.memory.holds import MemorySlots
from sciencebench.coordination.memory.jobs import MemoryJobs
from sciencebench.coordination.memory.leases import MemoryLeases
from sciencebench.coordination.protocol import Coordinator

__all__ = ["MemoryCoordinator"]


class MemoryCoordinator(MemoryLeases, MemorySlots, MemoryJobs, MemoryBoard, Coordinator):
    """The same contract in one process, for `submit --local` (no Redis).

    A lease, slot or lock expires on the monotonic clock. Running trials are
    tracked as over Redis, though in one process no host is ever lost.
    """
