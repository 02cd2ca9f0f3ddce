"""A trial's holds on its task images: a shared flock per image, so no eviction removes one it needs.

    <state>/images/<digest hex>.lock    one per task image this host used: a shared flock
                                        while a trial of the host needs the image; its
                                        mtime is the image's last use by a trial
    <state>/locks/<digest hex>.lock     one per task image pulled: an exclusive flock
                                        while a process of the host pulls it (`pull_lock_path`)

The image budget (`worker.docker.budget`) evicts only an image whose lock it can take
exclusively (no live trial of the host holds it), least recently used first by its mtime.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from sciencebench.core.images import image_digest
from sciencebench.dockerhost.hostlocks import open_state_file

IMAGES_DIR = "images"


def image_lock_path(state: Path, digest: str) -> Path:
    """The lock file of the task image with `digest` (`sha256:...`) in the host state directory."""
    return state / IMAGES_DIR / f"{digest.split(':', 1)[1]}.lock"


def pull_lock_path(state: Path, digest: str) -> Path:
    """The lock a pull of the image with `digest` (`sha256:...`) holds in the host state directory.

    `ImagePuller.ensure_images` holds it (exclusive) from before the pull's
    room is made until the image is in place; the budget counts an image
    whose pull lock is held as a pull in progress.
    """
    return state / "locks" / f"{digest.split(':', 1)[1]}.lock"


@contextlib.contextmanager
def hold_images(refs: Iterable[str], state: Path) -> Iterator[None]:
    """Mark `refs` as needed by a trial of this host until the block ends (or its holder dies).

    A shared flock per image: an eviction in any process of the host skips a
    held image, and the hold waits while an eviction removes the image (it is
    then pulled again). Entering and leaving both count as the image's last use.
    Raises WorkspaceError when the state directory cannot be written.
    """
    fds = take_holds(refs, state)
    try:
        yield
    finally:
        release_holds(fds)


def take_holds(refs: Iterable[str], state: Path) -> list[int]:
    """A shared flock on each image of `refs` (each marked used); the fds, to `release_holds`."""
    fds: list[int] = []
    try:
        for digest in sorted({image_digest(ref) for ref in refs}):
            fd = open_state_file(image_lock_path(state, digest), os.O_RDWR | os.O_CREAT)
            fds.append(fd)
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.utime(fd)
    except BaseException:
        release_holds(fds)
        raise
    return fds


def release_holds(fds: list[int]) -> None:
    """Mark each image used once more and close its fd (which drops the flock); empties `fds`."""
    while fds:
        fd = fds.pop()
        with contextlib.suppress(OSError):
            os.utime(fd)
        os.close(fd)
