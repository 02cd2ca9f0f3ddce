"""Image-aware placement: which host's free slot the trial fair share chose takes.

Fair share (`coordination.shares`) decides which job's trial a free slot of
the cluster takes, and in which order; placement decides whose slot. Each
worker host reports the pinned task images it holds, with their sizes and
the throughput its pulls measured (`HostImages`, from its pull log and its
Engine: at start, after each pull or eviction, and every lease period). A
trial takes a free slot of the host missing the fewest bytes of its images,
counting images a host holds and those it is pulling (placement marks an
image as pulling on the host it sent the image's first trial to). When every
host that holds them is busy, the trial is sent to wait on that host's own
queue, at most `wait_bound` seconds (the time the free host would need to
pull what it lacks, with a floor and a cap: waiting longer than a pull is
never better than pulling), and fill goes on with the next trial for the
free slot. The bound alone limits a wait (a long line on one host sends
its last trials elsewhere once their bound passes). Once the bound has passed the trial's
parked lease lapses and the watchdog sends it to the shared queue, where
any host takes it; a host that pauses or dies meanwhile loses nothing: its
routed trials come back the same way (their running entry and parked lease,
as every held trial taken from the store).

A trial is routed to `<default queue>.host.<host>` (`host_queue`), which
every worker consumes beside the shared default queue, and stops consuming
while its host is paused.

Keys (Redis):

    sciencebench:hosts:holds          hash host -> HostImages JSON: the pinned task images it holds
    sciencebench:place:routed         hash <job>/<K> -> Routed JSON: the host a trial was sent to
    sciencebench:place:pulling        hash repository@digest -> Pulling JSON: the host sent to pull it
"""

from __future__ import annotations

import statistics
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from pydantic import BaseModel

from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.images import repo_digest_name

if TYPE_CHECKING:
    from sciencebench.coordination.memory import MemoryCoordinator
    from sciencebench.coordination.memory.placement import MemoryPlacementStore


# The bound on a trial's wait for a host that holds its images: the time the free host would take to
# pull what it lacks, at the pull throughput the hosts measured, kept within these.
WAIT_FLOOR_SEC = 30.0
WAIT_CAP_SEC = 900.0
# A throughput to assume before any host has measured one, and a size for an image no host reported.
DEFAULT_BYTES_PER_SEC = 50e6
DEFAULT_IMAGE_BYTES = 1 << 30
# An image marked as pulling on a host counts as that host's for this long at most (the pull may
# have failed; the host's own report replaces the mark once it holds the image).
PULLING_TTL_SEC = 2 * WAIT_CAP_SEC


class HostImages(BaseModel):
    """What a host holds: pinned task image (`repository@sha256:...`) -> bytes, and its pulls' bytes/s."""

    images: dict[str, int] = {}
    bytes_per_sec: float = 0.0
    at: float = 0.0


class Routed(BaseModel):
    """Where `fill` sent a trial: the host, when (store clock), and until when it counts there.

    `until`: when its parked lease lapses (a lease period for a free slot,
    the bound for a wait); `waits`: sent to wait for a busy host's slot.
    """

    host: str
    at: float
    until: float
    waits: bool = False


class Pulling(BaseModel):
    """An image placement sent to a host that did not hold it: that host is pulling it since `at`."""

    host: str
    at: float


def host_queue(default_queue: str, host: str) -> str:
    """The Celery queue of one worker host (its node name): trials placed on it."""
    return f"{default_queue}.host.{host}"


def pinned(refs: Iterable[str]) -> list[str]:
    """`repository@sha256:...` of each pinned ref (as hosts report them), in order, once each."""
    return list(dict.fromkeys(repo_digest_name(ref) for ref in refs))


class HostLoad(NamedTuple):
    """A host's trials now: running on it, sent to it and not started, and of those the ones waiting."""

    running: int = 0
    routed: int = 0
    waiting: int = 0


@dataclass
class HostView:
    """One live, unpaused host as placement sees it during one fill."""

    name: str
    slots: int
    busy: int = 0  # running on it, or sent to it and not started (waiting ones included)
    waiting: int = 0  # sent to wait for one of its slots
    images: dict[str, int] = field(default_factory=dict)
    pulling: set[str] = field(default_factory=set)

    @property
    def free(self) -> int:
        """Its slots no trial runs in or is on its way to."""
        return self.slots - self.busy

    def has(self, image: str) -> bool:
        """Whether it holds `image` or is pulling it."""
        return image in self.images or image in self.pulling


@dataclass(frozen=True)
class Choice:
    """Where a trial goes: a host, and until when (store clock) it waits there for a slot (0: a free one)."""

    host: str
    until: float = 0.0
    pulls: tuple[str, ...] = ()  # the images the host lacks and will pull for it


def wait_bound(missing_bytes: int, bytes_per_sec: float) -> float:
    """Seconds a trial may wait for a host holding its images: the pull it saves, within floor and cap."""
    rate = bytes_per_sec if bytes_per_sec > 0 else DEFAULT_BYTES_PER_SEC
    return min(max(missing_bytes / rate, WAIT_FLOOR_SEC), WAIT_CAP_SEC)


@dataclass
class Placement:
    """The cluster's hosts for one fill: chooses a host per trial and keeps count of what it placed."""

    hosts: dict[str, HostView]
    sizes: dict[str, int]
    bytes_per_sec: float
    now: float

    @property
    def free(self) -> int:
        """Free slots across the hosts."""
        return sum(max(host.free, 0) for host in self.hosts.values())

    @property
    def waiting(self) -> int:
        """Trials sent to wait on a busy host: fair share counts them busy, yet they take no free slot."""
        return sum(host.waiting for host in self.hosts.values())

    def size(self, image: str) -> int:
        """An image's bytes as a host reported them; else the median reported size (else a default)."""
        if image in self.sizes:
            return self.sizes[image]
        return int(statistics.median(self.sizes.values())) if self.sizes else DEFAULT_IMAGE_BYTES

    def stored(self, host: HostView) -> int:
        """Bytes of task images it holds or pulls: new images go to the host storing least."""
        return sum(host.images.values()) + sum(self.size(i) for i in host.pulling - set(host.images))

    def missing(self, host: HostView, images: list[str]) -> int:
        """Bytes of `images` that `host` neither holds nor is pulling."""
        return sum(self.size(image) for image in images if not host.has(image))

    def choose(self, refs: list[str]) -> Choice | None:
        """The host for a trial with image refs `refs`; None when no host has a free slot.

        The free host missing the fewest bytes of them, unless a busy host
        misses fewer: then wait there
        (until `now + wait_bound` of the bytes the free host would pull).
        Ties: more free slots, then fewer stored bytes, then the name.
        """
        free = [host for host in self.hosts.values() if host.free > 0]
        if not free:
            return None
        images = pinned(refs)

        def rank(host: HostView) -> tuple[int, int, int, str]:
            return (self.missing(host, images), -host.free, self.stored(host), host.name)

        best = min(free, key=rank)
        lacking = self.missing(best, images)
        better = [
            host for host in self.hosts.values() if host.free <= 0 and self.missing(host, images) < lacking
        ]
        if better:
            holder = min(better, key=lambda h: (self.missing(h, images), h.waiting / h.slots, h.name))
            until = self.now + wait_bound(lacking - self.missing(holder, images), self.bytes_per_sec)
            return Choice(host=holder.name, until=until)
        return Choice(host=best.name, pulls=tuple(image for image in images if not best.has(image)))

    def take(self, choice: Choice) -> None:
        """Count the trial on its host: a slot (or a place in its line) and the images it pulls."""
        host = self.hosts[choice.host]
        host.busy += 1
        if choice.until:
            host.waiting += 1
        host.pulling.update(choice.pulls)


class PlacementStore(ABC):
    """What placement keeps in the store (see the module docstring).

    Over Redis `coordination.redis.placement.RedisPlacementStore`, in one
    process `coordination.memory.placement.MemoryPlacementStore`.
    """

    @abstractmethod
    def report(self, host: str, held: HostImages) -> None:
        """The host's images now (replacing its last report); its pulling marks of them go."""

    @abstractmethod
    def forget(self, host: str) -> None:
        """The host stopped: it holds nothing the cluster can use."""

    @abstractmethod
    def holdings(self) -> dict[str, HostImages]:
        """Every host's last report."""

    @abstractmethod
    def route(self, job: str, key: str, routed: Routed) -> None:
        """Remember where `fill` sent a trial (until it starts)."""

    @abstractmethod
    def loads(self, now: float) -> dict[str, HostLoad]:
        """Per host: trials running on it (their running entries), routed to it and not started.

        A routed trial counts while its running entry is the guard's (no
        host claimed it) and its park has not lapsed (`until`); once claimed
        it counts where it runs, and its route is forgotten, as is one whose
        trial has no running entry. One whose park lapsed counts for no host:
        it is on its way to the shared queue.
        """

    @abstractmethod
    def mark_pulling(self, host: str, images: Iterable[str], at: float) -> None:
        """The host was sent these images' first trial (or a pre-pull): it is pulling them."""

    @abstractmethod
    def pulling(self, now: float) -> dict[str, Pulling]:
        """Every image marked as pulling, and where; marks older than `PULLING_TTL_SEC` are dropped."""


_MEMORY: weakref.WeakKeyDictionary[MemoryCoordinator, MemoryPlacementStore] = weakref.WeakKeyDictionary()
_MEMORY_LOCK = threading.Lock()


def placement_store(coord: Coordinator) -> PlacementStore:
    """The placement state kept in `coord`'s store (Redis, or the embedded mode's memory)."""
    from sciencebench.coordination.memory import MemoryCoordinator
    from sciencebench.coordination.memory.placement import MemoryPlacementStore
    from sciencebench.coordination.redis import RedisCoordinator
    from sciencebench.coordination.redis.placement import RedisPlacementStore

    if isinstance(coord, RedisCoordinator):
        return RedisPlacementStore(coord)
    assert isinstance(coord, MemoryCoordinator), "a coordinator of another kind keeps no placement"
    with _MEMORY_LOCK:
        if coord not in _MEMORY:
            _MEMORY[coord] = MemoryPlacementStore(coord)
        return _MEMORY[coord]


def cluster_view(coord: Coordinator, store: PlacementStore, lease_seconds: float) -> Placement:
    """The live, unpaused hosts that report slots, with their loads, holdings and pulling marks."""
    now = coord.now()
    holdings, loads, marks = store.holdings(), store.loads(now), store.pulling(now)
    hosts: dict[str, HostView] = {}
    for name, status in coord.hosts().items():
        if (
            status.kit is None
            or status.kit.slots <= 0
            or status.paused
            or now - status.seen_at >= 2 * lease_seconds
        ):
            continue
        load = loads.get(name, HostLoad())
        held = holdings.get(name, HostImages())
        hosts[name] = HostView(name=name, slots=status.kit.slots, busy=load.running + load.routed,
                               waiting=load.waiting, images=dict(held.images))  # fmt: skip
    for image, mark in marks.items():
        if mark.host in hosts:
            hosts[mark.host].pulling.add(image)
    sizes: dict[str, int] = {}
    for held in holdings.values():
        sizes.update({image: size for image, size in held.images.items() if size > 0})
    rates = [
        held.bytes_per_sec for name, held in holdings.items() if name in hosts and held.bytes_per_sec > 0
    ]
    rate = statistics.median(rates) if rates else DEFAULT_BYTES_PER_SEC
    return Placement(hosts=hosts, sizes=sizes, bytes_per_sec=rate, now=now)
