"""A worker host's disk budget for task images: the least recently used go first.

    <state>/images/<digest hex>.lock    one per task image this host used:
                                        a shared flock while a trial of the
                                        host needs the image; its mtime is the
                                        image's last use by a trial

`hold_images` takes those shared locks for a trial before its images are
made present and keeps them until its Pier run and cleanup are over.
`ImageBudget.make_room` runs before a pull (and again after it) under one
host-wide lock: while the task images this host pulled (its pull log) take
more than the budget, it removes the least recently used one that no live
trial of the host holds (an exclusive, non-blocking flock on its lock file
proves that; a trial that wants the image meanwhile waits for the removal to
end and pulls it again). It never touches an image the host did not pull
for a trial (the proxy image, an operator's images), nor one a running or
claimed trial of this host needs. When every image the budget could free is
held, the pull does not fit: `NoRoomError`, and the trial goes back to the
queue for a host with room — the host is not paused. Each eviction is a
line of the pull log. When an eviction runs, the build cache that Pier's
builds leave behind is pruned too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.errors

from sciencebench.core.errors import NoRoomError, PullError
from sciencebench.core.images import image_digest, repo_digest_name, repo_digests_contain
from sciencebench.core.sizes import format_size
from sciencebench.worker.docker.engine import ENGINE_ERRORS, one_line
from sciencebench.worker.docker.hostlocks import host_lock, open_state_file

log = logging.getLogger(__name__)

IMAGES_DIR = "images"
EVICTION_LOCK = "evict.lock"
# How long a pull waits for another process's eviction round (one round removes a few images).
EVICTION_WAIT_SEC = 600.0


def _lock_path(state: Path, digest: str) -> Path:
    return state / IMAGES_DIR / f"{digest.split(':', 1)[1]}.lock"


@contextlib.contextmanager
def hold_images(refs: Iterable[str], state: Path) -> Iterator[None]:
    """Mark `refs` as needed by a trial of this host until the block ends (or its holder dies).

    A shared flock per image: an eviction in any process of the host skips a
    held image, and the hold waits while an eviction removes the image (it is
    then pulled again). Entering and leaving both count as the image's last use.
    Raises WorkspaceError when the state directory cannot be written.
    """
    fds: list[int] = []
    try:
        for digest in sorted({image_digest(ref) for ref in refs}):
            fd = open_state_file(_lock_path(state, digest), os.O_RDWR | os.O_CREAT)
            fds.append(fd)
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.utime(fd)
        yield
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.utime(fd)
            os.close(fd)


@dataclass(frozen=True)
class TaskImage:
    """A task image this host pulled that is present now: what the budget counts."""

    ref: str
    digest: str
    size: int
    last_used: float


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
    """The task images of one host kept within `budget` bytes (0: no budget)."""

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
        """Evict least recently used free task images until `incoming` fits within the budget.

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

    def _make_room(
        self, client: docker.DockerClient, incoming: dict[str, int], mine: set[str], strict: bool
    ) -> None:
        present = self.task_images(client)
        want = sum(incoming.values())
        used = sum(image.size for image in present)
        if used + want <= self.budget:
            return
        evicted = False
        for image in sorted(present, key=lambda i: i.last_used):
            if used + want <= self.budget:
                break
            if image.digest in mine:
                continue
            if self._evict(client, image):
                used -= image.size
                evicted = True
        if evicted:
            self._prune_build_leftovers(client)
        if used + want <= self.budget:
            return
        held_by_others = [i for i in self.task_images(client) if i.digest not in mine]
        if held_by_others and strict:
            raise NoRoomError(
                f"the images this host's running trials need ({format_size(used)}) and this trial's "
                f"({format_size(want)}) exceed its image budget of {format_size(self.budget)}"
            )
        log.warning(
            "task images of running trials (%s) exceed the image budget of %s",
            format_size(used + want), format_size(self.budget),
        )  # fmt: skip

    def task_images(self, client: docker.DockerClient) -> list[TaskImage]:
        """The task images this host pulled (its pull log) that the engine still has (one listing)."""
        pulled = self._pulled()
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
                last_used = _lock_path(self._state, digest).stat().st_mtime
            except FileNotFoundError:
                last_used = 0.0
            images.append(TaskImage(ref, digest, int(attrs.get("Size") or 0), last_used))
        return images

    def summary(self, client: docker.DockerClient) -> str:
        """One line for `status`: what the task images take of the budget, and the evictions so far."""
        present = self.task_images(client)
        used = sum(image.size for image in present)
        evictions = [e for e in read_evictions(self._log_path) if e.event == "evicted"]
        line = (
            f"task images {format_size(used)} of a {format_size(self.budget)} budget ({len(present)} images)"
        )
        if evictions:
            line += f"; {len(evictions)} evicted, the last at {evictions[-1].finished_at[:19]}Z"
        return line

    def _pulled(self) -> dict[str, str]:
        """Ref -> digest of every pull in the log, latest ref per digest."""
        by_digest: dict[str, str] = {}
        for entry in _log_entries(self._log_path):
            if "event" not in entry and entry.get("digest") and entry.get("ref"):
                by_digest[str(entry["digest"])] = str(entry["ref"])
        return {ref: digest for digest, ref in by_digest.items()}

    def _evict(self, client: docker.DockerClient, image: TaskImage) -> bool:
        """Remove `image` unless a live trial holds it (or a container still uses it)."""
        fd = open_state_file(_lock_path(self._state, image.digest), os.O_RDWR | os.O_CREAT)
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

    def _prune_build_leftovers(self, client: docker.DockerClient) -> None:
        """Prune the build cache no build uses (what derived builds leave); best effort.

        Never "dangling images": an image pulled by digest alone has no tag,
        so the engine counts every pinned task image as dangling.
        """
        try:
            freed = int(client.api.prune_builds().get("SpaceReclaimed") or 0)
        except ENGINE_ERRORS as exc:
            log.warning("pruning the build cache failed: %s", one_line(str(exc)))
            return
        if freed:
            self._record("pruned", "build cache", "", freed, "over the image budget")

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


def read_evictions(log_path: Path) -> list[Eviction]:
    """Every eviction and prune this host recorded, oldest first."""
    return [Eviction(**entry) for entry in _log_entries(log_path) if "event" in entry]


def _log_entries(log_path: Path) -> list[dict[str, Any]]:
    try:
        text = log_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def expected_sizes(refs: Iterable[str], log_path: Path) -> dict[str, int]:
    """The size each ref had when this host last pulled it (0 when never)."""
    sizes: dict[str, int] = {}
    for entry in _log_entries(log_path):
        if "event" not in entry and entry.get("size"):
            sizes[str(entry["digest"])] = int(str(entry["size"]))
    return {ref: sizes.get(image_digest(ref), 0) for ref in refs}
