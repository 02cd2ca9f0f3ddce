"""Pier's memory bound: what its own process on a worker host may take, and its end past it.

Pier parses what a trial's containers left (an agent's logs, its
trajectory) in its own process on the host, outside every cgroup a trial
has: a Codex session log of 48 MiB of `{}` lines took an unbounded Pier to
1.33 GiB resident (tests/docker/test_pier_memory.py). Each Pier a worker
starts is held to its `--pier-memory` (`bound_memory`); past it, this
environment's Pier exits `OUT_OF_MEMORY`, which `worker.stages` turns into
the trial's `OutputLimitError`.
"""

from __future__ import annotations

import os
import resource
import sys
from types import CodeType

# The exit code of a Pier that went past its memory bound (no code of Pier's or Python's own).
OUT_OF_MEMORY = 250
# sys.monitoring tools 0-2 and 5 are the debugger's, coverage's, the profiler's and the optimizer's.
_TOOL_IDS = (4, 3)
_TOOL_NAME = "sciencebench-pier-memory"


def bound_memory(limit: int) -> None:
    """In a process about to become Pier: hold its data to `limit` bytes and end it at a MemoryError.

    Its data (heap and private writable mappings) is limited by
    `RLIMIT_DATA`, soft and hard, which the docker CLI and compose it runs
    inherit, each its own. It also ends at its first `MemoryError`,
    wherever raised: Pier catches `Exception` around its log parsers and
    would go on with the trial half-parsed otherwise. Another installation
    of Pier gets the limit alone (`process.start_pier`). A lower hard limit
    the process already has stays (no process may raise its own).
    """
    held = data_limit(limit)
    resource.setrlimit(resource.RLIMIT_DATA, (held, held))
    _exit_on_memory_error(held)


def data_limit(limit: int) -> int:
    """`limit`, or the lower hard RLIMIT_DATA this process (so each it starts) already has."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    return limit if hard == resource.RLIM_INFINITY else min(limit, hard)


def _exit_on_memory_error(limit: int) -> None:
    """End the process with OUT_OF_MEMORY at the first MemoryError raised in any of its threads.

    The callback allocates nothing of its own: the line is made now, and
    `os.write` and `os._exit` need no memory the process may no longer get.
    """
    line = f"\nsciencebench: Pier went past its memory bound ({limit} bytes of data); stopped\n".encode()
    write, exit_now, out_of_memory = os.write, os._exit, OUT_OF_MEMORY

    def on_raise(code: CodeType, offset: int, exc: BaseException) -> None:
        if isinstance(exc, MemoryError):
            write(2, line)
            exit_now(out_of_memory)

    monitoring = sys.monitoring
    for tool in _TOOL_IDS:
        try:
            monitoring.use_tool_id(tool, _TOOL_NAME)
        except ValueError:  # taken
            continue
        monitoring.register_callback(tool, monitoring.events.RAISE, on_raise)
        monitoring.set_events(tool, monitoring.events.RAISE)
        return
    raise RuntimeError("no sys.monitoring tool id is free for Pier's memory bound")


def main(argv: list[str]) -> int:
    """`python -m sciencebench.worker.pier.bounded <limit> <module:attr> <argv...>`: a cold Pier, bounded."""
    from sciencebench.worker.pier.zygote import load_entry  # the zygote starts bounded runs itself

    limit, entry = int(argv[1]), argv[2]
    bound_memory(limit)
    sys.argv = argv[3:]
    result = load_entry(entry)()
    return 0 if result is None else int(result)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
