"""A host's capacity and a trial's request: the CPUs and memory a trial holds while it runs.

A trial asks its task's `cpus` and `memory_mb` (`trial_request`: agent and
separate verifier); a worker host's capacity is `worker --cpus N --memory
SIZE` (`SCIENCEBENCH_CPUS`, `SCIENCEBENCH_MEMORY`), by default what the host
has less a reserve (`host_capacity`). A host starts a trial only while the
requests of its running trials plus this one fit (`fits`; the store's
ledger: `Slots.take_room`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# What a task that names no cpus or memory_mb is counted to hold (Pier then sets no limit on it).
DEFAULT_CPUS = 1
DEFAULT_MEMORY_MB = 2048
# The memory a host keeps for itself by default: the worker, its Pier processes, the Docker daemon,
# the trials' inference proxies. CPUs: none (see the module docstring).
MEMORY_RESERVE_MB = 1024
CPU_RESERVE = 0.0
# Floating-point slack when summing fractional CPUs.
_EPSILON = 1e-9


@dataclass(frozen=True)
class Request:
    """What a trial holds while it runs, or what a host can hold: CPUs and memory (MiB)."""

    cpus: float
    memory_mb: int

    def plus(self, other: Request, times: int = 1) -> Request:
        """This and `times` of `other` together."""
        return Request(self.cpus + times * other.cpus, self.memory_mb + times * other.memory_mb)

    def __str__(self) -> str:
        return f"{self.cpus:g} cpu(s), {gib(self.memory_mb)} GiB"


NOTHING = Request(cpus=0, memory_mb=0)


Named = tuple[int | None, int | None]  # an environment's (cpus, memory_mb) as its task.toml names them


def trial_request(agent: Named, verifier: Named | None) -> Request:
    """A trial's request: its agent's and its separate verifier's (cpus, memory_mb), the larger of each.

    Pier limits each environment's containers to what it asks
    (`deploy.resources.limits`: a CFS quota and a memory limit). In
    separate-verifier mode Pier 0.3.0 stops the agent environment before it
    starts the verifier (`pier/trial/trial.py`: `_stop_agent_environment(
    keep_images=True)`, then `_run_verification`), so the two are never up at
    once. Beside them runs the trial's inference proxy, a small container no
    task names: the host's reserve covers it (`MEMORY_RESERVE_MB`).

    `verifier`: None for a verifier that runs in the agent's environment.
    A value not named counts as `DEFAULT_CPUS` / `DEFAULT_MEMORY_MB`.
    """
    envs = [agent] + ([verifier] if verifier is not None else [])
    cpus = max(cpus or DEFAULT_CPUS for cpus, _ in envs)
    memory = max(memory or DEFAULT_MEMORY_MB for _, memory in envs)
    return Request(cpus=cpus, memory_mb=memory)


def fits(used: Request, request: Request, capacity: Request) -> bool:
    """Whether `request` fits beside `used` within `capacity` (both resources)."""
    return (
        used.cpus + request.cpus <= capacity.cpus + _EPSILON
        and used.memory_mb + request.memory_mb <= capacity.memory_mb
    )


def dominant_share(used: Request, total: Request) -> float:
    """Dominant-resource share: the larger of the CPU and memory fractions of `total` that `used` takes."""
    cpu = used.cpus / total.cpus if total.cpus > 0 else 0.0
    memory = used.memory_mb / total.memory_mb if total.memory_mb > 0 else 0.0
    return max(cpu, memory)


def gib(memory_mb: float) -> str:
    """MiB as GiB for people: `8`, `8.79`."""
    return f"{round(memory_mb / 1024, 2):g}"


def in_use(used: Request, capacity: Request, trials: int) -> str:
    """A host's capacity in use, for `status`: `capacity in use 4 of 8 cpu(s), 16 of 62 GiB (2 trials)`."""
    return (
        f"capacity in use {used.cpus:g} of {capacity.cpus:g} cpu(s), "
        f"{gib(used.memory_mb)} of {gib(capacity.memory_mb)} GiB ({trials} trial(s))"
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


@cache
def detect_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> float:
    """This host's CPUs: its cgroup's quota (cgroup v2 `cpu.max`) when set, else the CPUs it may run on."""
    try:
        count = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        count = float(os.cpu_count() or 1)
    quota, _, period = _read(cgroup / "cpu.max").partition(" ")
    if quota.isdigit() and period.isdigit() and int(period) > 0:
        count = min(count, int(quota) / int(period))
    return count


@cache
def detect_memory_mb(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """This host's memory in MiB: `MemTotal`, or its cgroup's `memory.max` when lower (0: unknown)."""
    total = 0
    for line in _read(meminfo).splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal" and value.split() and value.split()[0].isdigit():
            total = int(value.split()[0]) // 1024
    limit = _read(cgroup / "memory.max")
    if limit.isdigit():
        total = min(total, int(limit) // (1 << 20)) if total else int(limit) // (1 << 20)
    return total


def host_capacity(cpus: float = 0.0, memory_bytes: int = 0) -> Request:
    """A host's capacity: the operator's `--cpus` / `--memory` when given, else detected less the reserve.

    Memory is reserved (`MEMORY_RESERVE_MB`: the worker, its Pier processes,
    the Docker daemon, the proxies), CPUs are not: a trial's `cpus` is a
    ceiling on its CPU time, not a reservation, and Docker refuses only a
    limit above the host's CPUs, so a 2-CPU task runs on a 2-core host whose
    own processes then share its time; a trial over its memory limit is killed.
    """
    detected_cpus = max(detect_cpus() - CPU_RESERVE, 1.0)
    detected_memory = max(detect_memory_mb() - MEMORY_RESERVE_MB, 0)
    return Request(
        cpus=cpus if cpus > 0 else detected_cpus,
        memory_mb=memory_bytes // (1 << 20) if memory_bytes > 0 else detected_memory,
    )
