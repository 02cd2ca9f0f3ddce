"""What the store's parts answer and keep besides trial records (`coordination.protocol`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from sciencebench.core.capacity import Request
from sciencebench.core.models import Redispatch


class Claim(StrEnum):
    """What a trial's claim found (`Leases.start`)."""

    CLAIMED = "claimed"  # the caller holds the lease now
    HELD = "held"  # another live process holds it
    ANSWERED = "answered"  # the trial has a result, and the chord counted it
    RECORDED = "recorded"  # it has a result the chord has not counted: the caller holds the lease now


class Unfit(BaseModel):
    """Why a host cannot serve a job, and when it last found so (the store's clock, s)."""

    reason: str
    at: float


class Held(BaseModel):
    """A trial of a job kept back from the broker: how to send it and how long it should run."""

    payload: Redispatch
    expected_sec: float


class HostKit(BaseModel):
    """What a worker host brings to a job, as it reports it at start: submit checks a job against it."""

    model_config = ConfigDict(frozen=True)

    # "online": Pier may install agents in its derived build; "baked": only baked agent images run.
    agent_install: str = "online"
    # The digest-pinned inference-proxy image model-agent trials need ("" when the host has none).
    proxy_image: str = ""
    # The directories the host serves (`worker --jobs-root`, `--selection-root`, `--env-file-root`).
    jobs_roots: tuple[str, ...] = ()
    selection_roots: tuple[str, ...] = ()
    env_file_roots: tuple[str, ...] = ()
    # The gateways its operator allows (`worker --gateway`, as `scheme://host:port`); empty: any
    # gateway but an internal address (`core.gateways.allowed_by`).
    gateways: tuple[str, ...] = ()
    # Its worker's --concurrency: the cluster's slots are what fair share hands out (0: not said).
    slots: int = 0
    # What each trial container may use (`worker --pids-limit`, `--disk-limit` in bytes; 0: not said
    # for pids, not watched for disk).
    pids_limit: int = 0
    disk_limit: int = 0
    # The data each of its Pier processes may take (`worker --pier-memory`, bytes; 0: unbounded or not said).
    pier_memory: int = 0
    # Its capacity (`worker --cpus`, `--memory`; `core.capacity`): its running trials' requests fit
    # within it (0: not said, e.g. an older worker: no bound but its slots).
    cpus: float = 0.0
    memory_mb: int = 0

    @property
    def capacity(self) -> Request | None:
        """Its capacity, None when it did not say."""
        said = self.cpus > 0 and self.memory_mb > 0
        return Request(cpus=self.cpus, memory_mb=self.memory_mb) if said else None


@dataclass(frozen=True)
class Room:
    """A trial's part of its host's capacity (`Slots.take_room`): the host, the trial (`J/K`), its request."""

    host: str
    member: str
    request: Request
    capacity: Request

    @staticmethod
    def member_of(job: str, key: str) -> str:
        """A trial's name in its host's ledger: `<job>/<trial key>`."""
        return f"{job}/{key}"


class HostStatus(BaseModel):
    """A worker host as the store knows it: last heartbeat (store clock, s) and health."""

    seen_at: float
    paused: bool = False
    reason: str = ""
    # What its task images take of its image budget, with its evictions (`worker --image-budget`).
    images: str = ""
    # What it reported it brings (None: a host that has not said, e.g. an older worker).
    kit: HostKit | None = None


@dataclass(frozen=True)
class Start:
    """What `Leases.start` found: the claim, and when claimed the cancel flag, the budget and a slot.

    `over_budget`: the job's budget is reached, so the trial must not start (it took no slot).
    """

    claim: Claim
    cancelled: bool = False
    slot: bool = False
    over_budget: bool = False
