"""A worker host's disk budget for task images: the least recently used go first.

What the budget counts is what this host's trials leave on its Engine: the
task images it pulled and what Pier's builds leave behind. `ImageBudget`
frees build leftovers first, then the least recently used task image no
live trial of the host holds (`worker.docker.imageholds`); it never touches
an image the host did not pull for a trial. When everything it could free
is held, the pull does not fit: `NoRoomError`, and the trial goes back to
the queue for a host with room. The budget is per Engine.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.errors

from sciencebench.core.errors import NoRoomError, PullError, WorkspaceError
from sciencebench.core.images import image_digest, repo_digest_name, repo_digests_contain
from sciencebench.core.sizes import format_size
from sciencebench.dockerhost.hostlocks import host_lock, open_state_file
from sciencebench.worker.docker.engine import ENGINE_ERRORS, one_line
from sciencebench.worker.docker.imageholds import image_lock_path, pull_lock_path, release_holds, take_holds

log = logging.getLogger(__name__)

EVICTION_LOCK = "evict.lock"
# How long a pull waits for another process's eviction round (one round removes a few images).
EVICTION_WAIT_SEC = 600.0
# What compose labels the images it builds with: a dangling image with it is a leftover of a build.
COMPOSE_PROJECT_LABEL = "com.docker.compose.project"


@dataclass(frozen=True)
class TaskImage:
    """A task image this host pulled that is present now: what the budget counts."""

    ref: str
    digest: str
    size: int
    last_used: float


@dataclass(frozen=True)
class BuildLeftovers:
    """What builds left on the Engine that no task needs: dangling build images and unshared build cache."""

    images: list[tuple[str, int]] = field(default_factory=list)  # (image id, size)
    cache: int = 0

    @property
    def size(self) -> int:
        """Bytes the leftovers take."""
        return self.cache + sum(size for _, size in self.images)


@dataclass(frozen=True)
class Eviction:
    """One line of the pull log: an image (or the build cache) removed to stay within the budget."""

    event: str
    ref: str
    digest: str
    size: int
    reason: str
    pid: int
    finished_at: str


class ImageBudget:
    """The task images and build leftovers of one host kept within `budget` bytes (0: no budget).

        <state>/images/<digest hex>.lock    one per task image this host used:
                                            a shared flock while a trial of the
                                            host needs the image; its mtime is the
                                            image's last use by a trial

    `worker.docker.imageholds.hold_images` takes those shared locks for a trial
    before its images are made present and keeps them until its Pier run and
    cleanup are over. `make_room` runs before a pull (and again after it) under
    one host-wide lock. The build leftovers are the build cache no image shares
    and the dangling images of compose builds (no tag, no digest: a rebuild
    took their tag). While these take more than the budget it frees, in this
    order, the build leftovers (dangling build images a container does not use,
    then the build cache, least recently used first, down to what fits), then
    the least recently used task image that no live trial of the host holds (an
    exclusive, non-blocking flock on its lock file proves that; a trial that
    wants the image meanwhile waits for the removal to end and pulls it again).
    It never touches the proxy image, baked agent images or an operator's
    images, nor one a running or claimed trial of this host needs; when the
    pull does not fit, the host is not paused. A trial's end (`hold`) settles
    the host again under the same lock: images over the budget that only ended
    trials held go at once, so the host holds more than its budget only while
    its running trials need it. Each eviction and prune is a line of the pull
    log. One worker host, one Engine, one image store: two hosts sharing an
    Engine share its images, its build cache and this count.
    """

    def __init__(self, budget: int, state: Path, log_path: Path) -> None:
        self.budget = budget
        self._state = state
        self._log_path = log_path

    def make_room(
        self,
        client: docker.DockerClient,
        incoming: dict[str, int],
        mine: Iterable[str],
        *,
        strict: bool = True,
    ) -> None:
        """Free build leftovers, then least recently used free task images, until `incoming` fits.

        `incoming`: refs about to be pulled and their expected sizes (0 when
        unknown: the call after the pull, `strict=False`, then evicts for the
        real size). `mine`: every ref of the calling trial (held by it, never
        evicted). When `strict`, raises NoRoomError if the images live trials
        of this host hold, with `incoming`, exceed the budget and other trials
        hold some of them (they may free it; another host may have room now).
        A trial whose own images alone exceed the budget runs anyway: no host
        of the same budget could run it otherwise.
        """
        if self.budget <= 0:
            return
        with host_lock(self._state / "locks" / EVICTION_LOCK, EVICTION_WAIT_SEC, "evicting images"):
            self._make_room(client, incoming, {image_digest(ref) for ref in mine}, strict)

    @contextlib.contextmanager
    def hold(self, refs: Iterable[str], client: Callable[[], docker.DockerClient]) -> Iterator[None]:
        """`hold_images`, and at the end settle the host within its budget (in the same eviction round).

        Releasing the holds and evicting what only they kept over the budget
        happen under the host's eviction lock, so no eviction round of the
        host ever sees the images of an ended trial as still needed. A settle
        that fails (the engine gone) is logged: the trial's end stands.
        """
        fds = take_holds(refs, self._state)
        try:
            yield
        finally:
            if self.budget <= 0:
                release_holds(fds)
            else:
                self._release_and_settle(fds, client)

    def _release_and_settle(self, fds: list[int], client: Callable[[], docker.DockerClient]) -> None:
        try:
            with host_lock(self._state / "locks" / EVICTION_LOCK, EVICTION_WAIT_SEC, "evicting images"):
                release_holds(fds)
                self._make_room(client(), {}, set(), strict=False)
        except (PullError, WorkspaceError) as exc:
            log.warning("could not settle the image budget after a trial: %s", exc)
        finally:
            release_holds(fds)

    def _make_room(
        self, client: docker.DockerClient, incoming: dict[str, int], mine: set[str], strict: bool
    ) -> None:
        entries = _log_entries(self._log_path)  # the pull log, read once for the round
        present = self._task_images(client, entries)
        leftovers = build_leftovers(client)
        want = sum(incoming.values())
        used = sum(image.size for image in present) + leftovers.size
        # Pulls other trials of this host have under way count as theirs already: two trials making
        # room one after the other must not both see the room the first one's pull will take.
        skip = {image.digest for image in present} | mine | {image_digest(ref) for ref in incoming}
        used += self._pulling_elsewhere(pulled_sizes(entries), skip)
        if used + want <= self.budget:
            return
        used -= self._prune_build_leftovers(client, leftovers, used + want - self.budget)
        for image in sorted(present, key=lambda i: i.last_used):
            if used + want <= self.budget:
                break
            if image.digest in mine:
                continue
            if self._evict(client, image):
                used -= image.size
        if used + want <= self.budget:
            return
        # Listed and read afresh: what the evictions left, and a pull another process finished since.
        held_by_others = [i for i in self.task_images(client) if i.digest not in mine]
        if held_by_others and strict:
            raise NoRoomError(
                f"the images this host's running trials need ({format_size(used)}) and this trial's "
                f"({format_size(want)}) exceed its image budget of {format_size(self.budget)}"
            )
        if want or mine:
            log.warning(
                "task images of running trials (%s) exceed the image budget of %s",
                format_size(used + want), format_size(self.budget),
            )  # fmt: skip

    def _pulling_elsewhere(self, sizes: dict[str, int], skip: set[str]) -> int:
        """Bytes of the images another process of this host is pulling now.

        `sizes`: digest -> size from earlier pulls (`pulled_sizes`). A pull
        holds its image's pull lock (`imageholds.pull_lock_path`) from before
        its room is made until the image is in place; a lock that cannot be
        taken at once is such a pull. `skip`: digests present or the caller's own.
        """
        pulling = 0
        for digest, size in sizes.items():
            if digest in skip:
                continue
            try:
                # Only probed, never created; O_NOFOLLOW: a symlink there is no pull, its target never opened.
                fd = os.open(pull_lock_path(self._state, digest), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # no lock (never pulled through this state dir's locks) or a symlink: no pull now
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                pulling += size
            finally:
                os.close(fd)  # closing drops a lock this call took
        return pulling

    def task_images(self, client: docker.DockerClient) -> list[TaskImage]:
        """The task images this host pulled (its pull log) that the engine still has (one listing)."""
        return self._task_images(client, _log_entries(self._log_path))

    def _task_images(self, client: docker.DockerClient, entries: list[dict[str, Any]]) -> list[TaskImage]:
        """`task_images`, with the pull log's `entries` as read already."""
        pulled = _pulled(entries)
        try:
            listed = client.api.images()
        except ENGINE_ERRORS as exc:
            raise PullError(f"cannot list images: {one_line(str(exc))}") from None
        images: list[TaskImage] = []
        for attrs in listed:
            names = set(attrs.get("RepoDigests") or [])
            ref = next((ref for ref in pulled if repo_digests_contain(names, ref)), None)
            if ref is None:
                continue
            digest = pulled[ref]
            try:
                last_used = image_lock_path(self._state, digest).stat().st_mtime
            except FileNotFoundError:
                last_used = 0.0
            images.append(TaskImage(ref, digest, int(attrs.get("Size") or 0), last_used))
        return images

    def summary(self, client: docker.DockerClient) -> str:
        """One line for `status`: what task images and build leftovers take of the budget; evictions."""
        present = self.task_images(client)
        used = sum(image.size for image in present)
        leftovers = build_leftovers(client)
        entries = read_evictions(self._log_path)
        evictions = [e for e in entries if e.event == "evicted"]
        pruned = sum(e.size for e in entries if e.event == "pruned")
        line = (
            f"task images {format_size(used)} of a {format_size(self.budget)} budget ({len(present)} images)"
        )
        if leftovers.size:
            line += f", build leftovers {format_size(leftovers.size)}"
        if evictions:
            line += f"; {len(evictions)} evicted, the last at {evictions[-1].finished_at[:19]}Z"
        if pruned:
            line += f"; {format_size(pruned)} of build leftovers pruned"
        return line

    def _evict(self, client: docker.DockerClient, image: TaskImage) -> bool:
        """Remove `image` unless a live trial holds it (or a container still uses it)."""
        fd = open_state_file(image_lock_path(self._state, image.digest), os.O_RDWR | os.O_CREAT)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return False  # a running or claimed trial of this host needs it
                raise
            try:
                client.images.remove(repo_digest_name(image.ref), force=False, noprune=False)
            except docker.errors.ImageNotFound:
                return True
            except docker.errors.APIError as exc:  # a container of someone else's still uses it
                log.info("not evicting %s: %s", image.ref, one_line(str(exc.explanation or exc)))
                return False
            self._record("evicted", image.ref, image.digest, image.size, "over the image budget")
            log.warning("evicted %s (%s) to stay within the image budget", image.ref, format_size(image.size))
            return True
        finally:
            os.close(fd)

    def _prune_build_leftovers(
        self, client: docker.DockerClient, leftovers: BuildLeftovers, over: int
    ) -> int:
        """Free up to `over` bytes of build leftovers (best effort); the bytes freed.

        Dangling build images first (all of them: nothing can name them any
        more; one a container uses stays), then the build cache down to what
        the budget leaves it, least recently used first (BuildKit's
        keep-storage). Never the engine's "dangling images" filter alone: an
        image pulled by digest has no tag, so the engine counts every pinned
        task image as dangling.
        """
        freed = 0
        for image_id, size in leftovers.images:
            try:
                client.images.remove(image_id, force=False, noprune=False)
            except docker.errors.ImageNotFound:
                continue
            except ENGINE_ERRORS as exc:  # in use by a container, or the engine failed
                log.info("not pruning build image %s: %s", image_id[:19], one_line(str(exc)))
                continue
            freed += size
            self._record("pruned", f"build image {image_id[:19]}", image_id, size, "over the image budget")
        if leftovers.cache and freed < over:
            # The dangling images' layers are build cache too: count it again now that they are gone.
            cache = build_leftovers(client).cache
            keep = max(0, cache - (over - freed))
            try:
                reclaimed = int(client.api.prune_builds(keep_storage=keep).get("SpaceReclaimed") or 0)
            except ENGINE_ERRORS as exc:
                log.warning("pruning the build cache failed: %s", one_line(str(exc)))
                return freed
            if reclaimed:
                freed += reclaimed
                self._record("pruned", "build cache", "", reclaimed, "over the image budget")
        return freed

    def _record(self, event: str, ref: str, digest: str, size: int, reason: str) -> None:
        entry = Eviction(
            event=event, ref=ref, digest=digest, size=size, reason=reason, pid=os.getpid(),
            finished_at=datetime.now(UTC).isoformat(),
        )  # fmt: skip
        fd = open_state_file(self._log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (json.dumps(entry.__dict__, sort_keys=True) + "\n").encode("utf-8"))
        finally:
            os.close(fd)


def build_leftovers(client: docker.DockerClient) -> BuildLeftovers:
    """The dangling images of compose builds (no tag, no digest) and the build cache no image shares.

    Raises PullError when the engine does not answer.
    """
    api = client.api
    try:
        dangling = api.images(filters={"dangling": True, "label": COMPOSE_PROJECT_LABEL})
        usage = api.get(f"{api.base_url}/v{api.api_version}/system/df", params={"type": "build-cache"})
        usage.raise_for_status()
        records = usage.json().get("BuildCache") or []
    except (*ENGINE_ERRORS, ValueError) as exc:
        raise PullError(f"cannot list the build leftovers: {one_line(str(exc))}") from None
    images = [
        (str(attrs["Id"]), int(attrs.get("Size") or 0))
        for attrs in dangling
        if not _names(attrs.get("RepoTags"), "<none>:<none>")
        and not _names(attrs.get("RepoDigests"), "<none>@<none>")
    ]
    cache = sum(int(record.get("Size") or 0) for record in records if not record.get("Shared"))
    return BuildLeftovers(images=images, cache=cache)


def _names(listed: list[str] | None, none: str) -> list[str]:
    return [name for name in listed or [] if name != none]


def read_evictions(log_path: Path) -> list[Eviction]:
    """Every eviction and prune this host recorded, oldest first."""
    return [Eviction(**entry) for entry in _log_entries(log_path) if "event" in entry]


def _log_entries(log_path: Path) -> list[dict[str, Any]]:
    try:
        text = log_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _pulled(entries: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Ref -> digest of every pull among the pull log's `entries`, latest ref per digest."""
    by_digest: dict[str, str] = {}
    for entry in entries:
        if "event" not in entry and entry.get("digest") and entry.get("ref"):
            by_digest[str(entry["digest"])] = str(entry["ref"])
    return {ref: digest for digest, ref in by_digest.items()}


def pulled_sizes(entries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Digest -> size of its last pull of known size, from the pull log's `entries` (oldest first).

    Evictions and prunes (entries with an `event`) are not pulls; a pull
    whose size could not be read (0) leaves the size of an earlier one.
    """
    sizes: dict[str, int] = {}
    for entry in entries:
        if "event" not in entry and entry.get("digest") and entry.get("size"):
            sizes[str(entry["digest"])] = int(str(entry["size"]))
    return sizes


def expected_sizes(refs: Iterable[str], log_path: Path) -> dict[str, int]:
    """The size each ref had when this host last pulled it (0 when never)."""
    sizes = pulled_sizes(_log_entries(log_path))
    return {ref: sizes.get(image_digest(ref), 0) for ref in refs}
