"""Image-aware placement: which host's free slot the trial fair share chose takes.

Fair share (`coordination.shares`) decides which job's trial a free slot
takes; placement decides whose slot. Each host reports the pinned task
images it holds (`HostImages`); a trial takes a free slot of the host
missing the fewest bytes of its images, or waits on a busy host that holds
more of them when it is expected ready within `wait_bound` (`Placement`).
A routed trial goes to its host's own queue (`host_queue`); when its parked
lease lapses (the host paused or died) the watchdog sends it to the shared queue.
"""

from __future__ import annotations

import heapq
import json
import statistics
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from pydantic import BaseModel

from sciencebench.coordination.history import stored_seconds
from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.capacity import NOTHING, Request, fits
from sciencebench.core.images import repo_digest_name
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import Redispatch

# The bound on a trial's wait for a host that holds its images: the pull it saves (the free host's,
# at the pull throughput the hosts measured), at least the floor (what a second copy of the image
# costs beyond its pull's seconds, see `Placement`), at most the cap (beyond it the cluster
# has changed too much for the estimate to mean much). A holder is waited for only when it is
# expected to be ready within that bound (`Placement.holder`).
WAIT_FLOOR_SEC = 10.0
WAIT_CAP_SEC = 900.0
# What a trial sent to a host counts in its line (`line_seconds`): at least this when measured, and
# this when nothing measured it: half the floor, so that a host of unmeasured trials takes about two
# waiting trials per slot within the floor before the next trial of its images pulls elsewhere.
MIN_LINE_SEC = 1.0
UNMEASURED_LINE_SEC = WAIT_FLOOR_SEC / 2
# How many earlier attempts of a task the store reads for its measured seconds (the first record found).
MEASURED_ATTEMPTS = 4
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


class HostLine(NamedTuple):
    """A host's trials in time: when its running trials end, and how long those on their way run.

    `ends`: seconds until each running trial is expected to end (`remaining`);
    `line`: the seconds each trial sent to it and not started is counted to
    hold a slot (`line_seconds`), in the order they were sent.
    """

    ends: tuple[float, ...] = ()
    line: tuple[float, ...] = ()


@dataclass
class HostView:
    """One live, unpaused host as placement sees it during one fill."""

    name: str
    slots: int
    busy: int = 0  # running on it, or sent to it and not started (waiting ones included)
    waiting: int = 0  # sent to wait for one of its slots
    images: dict[str, int] = field(default_factory=dict)
    pulling: set[str] = field(default_factory=set)
    ends: list[float] = field(default_factory=list)  # `HostLine.ends`
    line: list[float] = field(default_factory=list)  # `HostLine.line`, and what this fill sent it
    # Its capacity (None: it said none) and what its running trials, and those this fill sent, ask.
    capacity: Request | None = None
    used: Request = NOTHING

    @property
    def free(self) -> int:
        """Its slots no trial runs in or is on its way to."""
        return self.slots - self.busy

    def fits(self, request: Request | None) -> bool:
        """Whether a trial asking `request` fits beside its trials now (`core.capacity.fits`)."""
        return request is None or self.capacity is None or fits(self.used, request, self.capacity)

    def has(self, image: str) -> bool:
        """Whether it holds `image` or is pulling it."""
        return image in self.images or image in self.pulling

    def frees_in(self) -> float:
        """Seconds until a slot frees for one more trial, as its trials are expected to run.

        Each slot frees at its running trial's expected end (a slot with no
        known trial: now); each trial of its line takes the first slot to
        free, for its expected seconds.
        """
        slots = sorted(self.ends)[: self.slots] + [0.0] * max(self.slots - len(self.ends), 0)
        heapq.heapify(slots)
        for seconds in self.line:
            heapq.heappush(slots, heapq.heappop(slots) + seconds)
        return slots[0] if slots else float("inf")


@dataclass(frozen=True)
class Choice:
    """Where a trial goes: a host, and until when (store clock) it waits there for a slot (0: a free one)."""

    host: str
    until: float = 0.0
    pulls: tuple[str, ...] = ()  # the images the host lacks and will pull for it
    expected: float = 0.0  # its `line_seconds`: it holds a slot of the host that long, after its pulls
    request: Request | None = None  # what it asks of the host's capacity


def pull_seconds(missing_bytes: int, bytes_per_sec: float) -> float:
    """The time a host needs to pull `missing_bytes` at the measured throughput (else a default)."""
    return missing_bytes / (bytes_per_sec if bytes_per_sec > 0 else DEFAULT_BYTES_PER_SEC)


def wait_bound(missing_bytes: int, bytes_per_sec: float) -> float:
    """Seconds a trial may wait for a host holding its images: the pull it saves, between floor and cap."""
    return min(max(pull_seconds(missing_bytes, bytes_per_sec), WAIT_FLOOR_SEC), WAIT_CAP_SEC)


@dataclass
class Placement:
    """The cluster's hosts for one fill: chooses a host per trial and keeps count of what it placed.

    Each worker host reports the pinned task images it holds, with their sizes
    and the throughput its pulls measured (`HostImages`, from its pull log and
    its Engine: at start, after each pull or eviction, and every lease period).
    A trial takes a free slot of the host missing the fewest bytes of its
    images, counting images a host holds and those it is pulling (placement
    marks an image as pulling on the host it sent the image's first trial to).
    A busy host that holds more of them is worth waiting for when it is
    expected to be ready within the bound of a wait (`wait_bound`: the pull the
    wait saves, at the hosts' measured pull throughput, between
    `WAIT_FLOOR_SEC` and `WAIT_CAP_SEC`). Ready: its next slot frees
    (`HostView.frees_in`: its running trials' expected ends, then the trials
    already on their way to it, each with the pull it was sent for), then its
    own pull of what it lacks. A running trial's expected end does not count a
    pull it may still be doing (the store does not tie a host's pulling marks
    to its running trials): a host sent an image's first trial in an earlier
    fill can look ready up to that pull sooner than it is. Then the trial is
    sent to wait on that host's own queue, and fill goes on with the next trial
    for the free slot; otherwise the free host takes it and pulls.

    A running trial ends at its start plus what the store measured of its task
    in the job (`remaining`); trial durations are heavy-tailed, so a fresh
    trial's host is worth waiting for and one whose trial has already run long
    is not (its timeouts are only an upper bound: counting them would make
    every holder look busy for an hour, and a job's first trials would pull
    every image on every host). A trial sent to a host and not started holds a
    slot there for its measured seconds (`line_seconds`), plus the pull it was
    sent for. The floor is the price of a second copy: a duplicate pull costs
    more than its seconds (another host's disk and budget, the registry's
    bandwidth that every host shares, and a pull measured alone is slower when
    many hosts pull at once), so a holder that frees within a short trial's
    time is waited for even when a pull would be a little quicker. The cap:
    beyond it the cluster has changed too much for the estimate to mean much.
    Once the bound has passed the trial's parked lease lapses and the watchdog
    sends it to the shared queue, where any host takes it; a host that pauses
    or dies meanwhile loses nothing: its routed trials come back the same way.
    A routed trial's queue, `<default queue>.host.<host>`, is consumed by its
    host beside the shared default queue, and not while the host is paused.
    """

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

    def choose(
        self, refs: list[str], measured: float | None = None, request: Request | None = None
    ) -> Choice | None:
        """The host for a trial with image refs `refs` (its task measured `measured` s); None: no free slot.

        Free: a free slot and room for its `request` beside the host's trials
        (`HostView.fits`); a host without room is busy. The free host missing
        the fewest bytes of them, unless a busy host
        is ready within the wait's worth (`holder`): then wait there, until
        `now + wait_bound` of the bytes waiting saves. Either way the trial
        counts in its host's line for `line_seconds(measured)`.
        Ties: more free slots, then fewer stored bytes, then the name.
        """
        expected = line_seconds(measured)
        free = [host for host in self.hosts.values() if host.free > 0 and host.fits(request)]
        if not free:
            return None
        images = pinned(refs)

        def rank(host: HostView) -> tuple[int, int, int, str]:
            return (self.missing(host, images), -host.free, self.stored(host), host.name)

        best = min(free, key=rank)
        lacking = self.missing(best, images)
        holder = self.holder(images, lacking, request)
        if holder is not None:
            until = self.now + wait_bound(lacking - self.missing(holder, images), self.bytes_per_sec)
            return Choice(host=holder.name, until=until, expected=expected, request=request)
        pulls = tuple(image for image in images if not best.has(image))
        return Choice(host=best.name, pulls=pulls, expected=expected, request=request)

    def holder(self, images: list[str], lacking: int, request: Request | None = None) -> HostView | None:
        """The busy host worth waiting for, if any: the one ready soonest, if within the wait's worth.

        Of the busy hosts missing fewer bytes than `lacking` (the free
        host's), the one whose next free slot (`HostView.frees_in`) plus its
        own pull comes first (ties: the shorter line, then the name), if that
        comes within the bound of a wait for it (`wait_bound` of the bytes it
        saves: the free host's pull of `lacking` less its own, between
        `WAIT_FLOOR_SEC` and `WAIT_CAP_SEC`).
        """
        ready = {
            host.name: host.frees_in() + pull_seconds(missing, self.bytes_per_sec)
            for host in self.hosts.values()
            if (host.free <= 0 or not host.fits(request))
            and (host.capacity is None or request is None or fits(NOTHING, request, host.capacity))
            and (missing := self.missing(host, images)) < lacking
        }
        soonest = min(ready, key=lambda name: (ready[name], self.hosts[name].waiting, name), default=None)
        if soonest is None:
            return None
        holder = self.hosts[soonest]
        bound = wait_bound(lacking - self.missing(holder, images), self.bytes_per_sec)
        return holder if ready[soonest] < bound else None

    def take(self, choice: Choice) -> None:
        """Count the trial on its host: a slot (or a place in its line) and the images it pulls."""
        host = self.hosts[choice.host]
        host.busy += 1
        if choice.until:
            host.waiting += 1
        elif choice.request is not None:
            host.used = host.used.plus(choice.request)
        # The slot is held while the host pulls what it lacks, then while the trial runs.
        pull = pull_seconds(sum(self.size(image) for image in choice.pulls), self.bytes_per_sec)
        host.line.append(choice.expected + pull)
        host.pulling.update(choice.pulls)


class PlacementStore(ABC):
    """What placement keeps in the store (its keys: `coordination.keys`).

    Its implementation: `coordination.redis.placement.RedisPlacementStore`.
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
    def lines(self, now: float) -> dict[str, HostLine]:
        """Per host, its trials in time (`HostLine`), each by what its task measured (`expected_of`).

        The running ones' ends (`remaining`, from their `running` state's
        time, else now) and those routed to it and not started
        (`line_seconds`; a route counts as in `loads`).
        """

    @abstractmethod
    def estimate(self, job: str, payload: Redispatch) -> float | None:
        """A trial's measured seconds (`expected_of`), from the records of its task's earlier attempts."""

    @abstractmethod
    def mark_pulling(self, host: str, images: Iterable[str], at: float) -> None:
        """The host was sent these images' first trial (or a pre-pull): it is pulling them."""

    @abstractmethod
    def pulling(self, now: float) -> dict[str, Pulling]:
        """Every image marked as pulling, and where; marks older than `PULLING_TTL_SEC` are dropped."""


def earlier_keys(key: str) -> list[str]:
    """The trial keys of the attempts before `key` whose records may measure its task (the first few)."""
    try:
        task, attempt = TrialKey.parse(key)
    except ValueError:
        return []
    return [str(TrialKey(task, n)) for n in range(1, min(attempt, MEASURED_ATTEMPTS + 1))]


def remaining(measured: float | None, started: float, now: float) -> float:
    """Seconds until a trial that started at `started` is expected to end.

    Its task's measured seconds from its start; a trial nothing measured is
    expected to go on as long again as it has run so far, and one past its
    measured seconds as long again as it has overrun them (a trial 300 s
    into a task measured at 1 s is no longer about to end; one a little
    past them, by a start-up the measurement leaves out, nearly is).
    """
    if measured is None:
        return max(now - started, 0.0)
    return abs(started + measured - now)


def line_seconds(measured: float | None) -> float:
    """Seconds a trial sent to a host and not started is counted to hold a slot there.

    Its task's measured seconds (at least `MIN_LINE_SEC`: a record that
    measured 0 s would let a line grow without end), else `UNMEASURED_LINE_SEC`.
    """
    return UNMEASURED_LINE_SEC if measured is None else max(measured, MIN_LINE_SEC)


def expected_of(records: Iterable[str | None]) -> float | None:
    """A trial's measured seconds: the first of `records` (its task's earlier attempts') that has them.

    None when none does (see `Placement` for how placement counts
    such a trial).
    """
    for record in records:
        try:
            value = json.loads(record) if record is not None else None
        except ValueError:
            continue
        if isinstance(value, dict) and (seconds := stored_seconds(value)) is not None:
            return seconds
    return None


def host_lines(items: Iterable[tuple[str, str, float | None, float]], now: float) -> dict[str, HostLine]:
    """`HostLine`s from (host, "end" | "line", measured seconds or None, when) items.

    An "end" is a running trial (when: its start, `remaining`), a "line" a
    trial routed to the host and not started (when: its route's time,
    `line_seconds`); a line is in routing order.
    """
    ends: dict[str, list[float]] = {}
    line: dict[str, list[tuple[float, float]]] = {}
    for host, kind, measured, at in items:
        if kind == "end":
            ends.setdefault(host, []).append(remaining(measured, min(at, now), now))
        else:
            line.setdefault(host, []).append((at, line_seconds(measured)))
    return {
        host: HostLine(ends=tuple(sorted(ends.get(host, []))),
                       line=tuple(seconds for _, seconds in sorted(line.get(host, []))))
        for host in ends.keys() | line.keys()
    }  # fmt: skip


def cluster_view(coord: Coordinator, store: PlacementStore, lease_seconds: float) -> Placement:
    """The live, unpaused hosts that report slots, with their loads, holdings and pulling marks."""
    now = coord.now()
    holdings, loads, marks = store.holdings(), store.loads(now), store.pulling(now)
    lines = store.lines(now)
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
        held, line = holdings.get(name, HostImages()), lines.get(name, HostLine())
        hosts[name] = HostView(name=name, slots=status.kit.slots, busy=load.running + load.routed,
                               waiting=load.waiting, images=dict(held.images), ends=list(line.ends),
                               line=list(line.line), capacity=status.kit.capacity)  # fmt: skip
    # What their running trials hold of their capacities (the ledger: `Slots.take_room`); a trial
    # routed to a host and not started yet is not in it: its start checks again and hands it back.
    for name, (used, _) in coord.room_used(sorted(hosts)).items():
        hosts[name].used = used
    sizes: dict[str, int] = {}
    for held in holdings.values():
        sizes.update({image: size for image, size in held.images.items() if size > 0})
    rates = [
        held.bytes_per_sec for name, held in holdings.items() if name in hosts and held.bytes_per_sec > 0
    ]
    rate = statistics.median(rates) if rates else DEFAULT_BYTES_PER_SEC
    for image, mark in marks.items():
        if mark.host in hosts:
            hosts[mark.host].pulling.add(image)
    return Placement(hosts=hosts, sizes=sizes, bytes_per_sec=rate, now=now)
