"""Digest-pinned images on a worker host: pulled by digest, verified, at most once per host.

Each performed pull is appended to the host's pull log
(`<state>/pulls.jsonl`), the proof that concurrent trials pulled an image
once. Credentials come only from this host's Docker config.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.auth
import docker.errors
from docker.credentials.errors import StoreError

from sciencebench.core.errors import NoRoomError, PreflightError, PullError, RegistryError
from sciencebench.core.images import (
    image_digest,
    image_repository,
    platform_matches,
    repo_digest_name,
    repo_digests_contain,
)
from sciencebench.core.registryhints import refusal_status
from sciencebench.dockerhost.hostlocks import host_lock, open_state_file, state_dir
from sciencebench.worker.docker.budget import ImageBudget, expected_sizes
from sciencebench.worker.docker.engine import ENGINE_ERRORS, ClientPerProcess, connect, one_line
from sciencebench.worker.docker.imageholds import pull_lock_path
from sciencebench.worker.docker.registryprobe import probe_hint_sec


def pinned_name(ref: str) -> str:
    """`repository@sha256:...` of a pinned ref, tag dropped, registry normalized.

    This is the form the engine lists in an image's RepoDigests (after
    `normalize_repository`). Raises PullError for a ref that is not pinned.
    """
    try:
        return repo_digest_name(ref)
    except ValueError as exc:
        raise PullError(str(exc)) from None


def registry_auth(registry: str) -> dict[str, Any] | None:
    """Credentials for `registry` from this host's Docker config, as the CLI finds them.

    Reads `$DOCKER_CONFIG/config.json` (else `~/.docker/config.json`) afresh:
    `credHelpers[registry]`, else `credsStore`, runs `docker-credential-<name>
    get`; without a helper, the `auths` entry. None when nothing is configured
    (anonymous pull). Never takes credentials from anywhere else.

    Raises PullError when a configured helper is missing from PATH or fails.
    """
    config = docker.auth.load_config()
    store = config.get_credential_store(registry)
    if store:
        helper = f"docker-credential-{store}"
        if shutil.which(helper) is None:
            raise PullError(
                f"credential helper {helper} configured for {registry} in the Docker config is not on PATH"
            )
        try:
            found = config.resolve_authconfig(registry)
        except (StoreError, docker.errors.DockerException) as exc:
            # The SDK wraps the helper's StoreError (whose text is the helper's output).
            reason = one_line(str(exc.__cause__ or exc))
            raise PullError(f"credential helper {helper} failed for {registry}: {reason}") from None
    else:
        found = config.resolve_authconfig(registry)
    return dict(found) if found else None


@dataclass(frozen=True)
class ImageStatus:
    """What `ImagePuller.ensure_images` did for one image.

    `seconds` is the wall time spent on the image (waiting for another
    puller included), `waited_sec` the part spent waiting for the host lock,
    `pulled` whether this call performed the pull.
    """

    ref: str
    seconds: float
    waited_sec: float
    pulled: bool


@dataclass(frozen=True)
class PullRecord:
    """One line of the host's pull log: a pull that was actually performed."""

    ref: str
    digest: str
    platform: str
    seconds: float
    pid: int
    finished_at: str
    size: int = 0


def pull_log_path(state: Path | None = None) -> Path:
    """The host's pull log: one JSON line per pull performed (`PullRecord`)."""
    return (state or state_dir()) / "pulls.jsonl"


def read_pull_log(state: Path | None = None) -> list[PullRecord]:
    """Every pull performed on this host (state dir) so far, oldest first."""
    try:
        text = pull_log_path(state).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    entries = (json.loads(line) for line in text.splitlines() if line.strip())
    return [PullRecord(**entry) for entry in entries if "event" not in entry]  # evictions: see budget


def pull_counts(state: Path | None = None) -> dict[str, int]:
    """Pulls performed on this host per digest (`sha256:...`): the dedup proof."""
    counts: dict[str, int] = {}
    for record in read_pull_log(state):
        counts[record.digest] = counts.get(record.digest, 0) + 1
    return counts


# A pinned image the engine showed present is trusted this long before the
# engine is asked again (a digest never changes; only a prune could remove it).
PRESENT_TTL_SEC = 60.0


class ImagePuller:
    """Pulls digest-pinned images, at most once per image per host.

    Create one per worker process (it is safe to create it before a fork: the
    Docker client is made lazily, per process). `ensure`/`ensure_images` are
    thread-safe and safe across processes sharing the state dir: a pull runs
    under `<state>/locks/<digest hex>.lock` (flock) and presence is checked
    again after the lock is taken, so concurrent trials needing the same image
    wait for the one pull in progress. Each performed pull is appended to
    `<state>/pulls.jsonl` (see `pull_counts`) and counted in
    `pulls_performed` (this instance).

    Credentials come only from this host's Docker config (`registry_auth`);
    there is deliberately no way to pass any in.

    With an `image_budget` (bytes), the task images this host pulled are kept
    within it (`budget.ImageBudget`): least recently used free images are
    evicted before a pull, and again after it for the image's real size.

    With a `registry_gate` (registry -> (seconds the cluster still waits, its
    last answer), None: go), a pull from a registry the cluster is backing
    off from is not sent: RegistryError, not `asked`. A `pull_hold` (ref ->
    a context held while its pull runs) makes pulls of one image wait for one
    another across the cluster (a mirror's first pull: `worker.runtime`).
    """

    def __init__(
        self,
        state: Path | None = None,
        client_factory: Callable[[], docker.DockerClient] | None = None,
        lock_timeout_sec: float = 3 * 3600.0,
        image_budget: int = 0,
        registry_gate: Callable[[str], tuple[float, str] | None] | None = None,
        pull_hold: Callable[[str], AbstractContextManager[None]] | None = None,
    ) -> None:
        self._state = state or state_dir()
        self.budget = ImageBudget(image_budget, self._state, pull_log_path(self._state))
        self._client = ClientPerProcess(client_factory or connect)
        self._lock_timeout_sec = lock_timeout_sec
        self._registry_gate = registry_gate
        self._pull_hold = pull_hold
        self._guard = threading.Lock()
        self._pulls = 0
        # (ref, platform) -> when (monotonic) the engine last showed it present as pinned.
        self._present: dict[tuple[str, str], float] = {}

    @property
    def pulls_performed(self) -> int:
        """Pulls this instance performed (in this process)."""
        return self._pulls

    def hold(self, refs: list[str]) -> AbstractContextManager[None]:
        """Hold `refs` for a trial of this host (`imageholds.hold_images`); at its end, settle the budget.

        Nothing this host's budget evicts is held; when the trial ends, what
        only it kept over the budget is evicted in the same eviction round.
        """
        return self.budget.hold(refs, self._docker)

    def _docker(self) -> docker.DockerClient:
        try:
            return self._client.get()
        except PreflightError as exc:
            raise PullError(str(exc)) from None

    def ensure(self, refs: list[str], platform: str, skip_pull: bool) -> dict[str, float]:
        """Make every pinned ref present locally; seconds spent per ref.

        See `ensure_images`, which this wraps (and raises what it raises).
        """
        return {status.ref: status.seconds for status in self.ensure_images(refs, platform, skip_pull)}

    def ensure_images(self, refs: list[str], platform: str, skip_pull: bool) -> list[ImageStatus]:
        """Make every pinned ref (`repo[:tag]@sha256:...`) present for `platform`.

        An image counts as present when the engine has it with the pinned
        `repo@sha256:...` among its RepoDigests and built for `platform`.
        Present images are never pulled again (one seen present in the last
        `PRESENT_TTL_SEC` is not even looked up, unless the host has an image
        budget: another process may have evicted it since). Otherwise it is
        pulled by digest for `platform` (under the per-image host lock), and verified:
        RepoDigests must then hold the pinned digest. Duplicate refs are
        handled once.

        With `skip_pull`, local images are trusted and nothing is pulled; a
        missing one is an error.

        Raises PullError (one line) naming the ref: not pinned, missing under
        `skip_pull`, pull refused by the engine or registry, credentials
        unavailable, engine unreachable, digest or platform not as pinned
        after the pull, or the lock wait timed out. Raises WorkspaceError when
        the host state dir (locks, pull log) cannot be written.
        """
        for ref in refs:
            pinned_name(ref)  # validate every ref before touching anything
        statuses: list[ImageStatus] = []
        now = time.monotonic()
        # With a budget, an image seen present may have been evicted since by another process.
        ttl = PRESENT_TTL_SEC if self.budget.budget <= 0 else 0.0
        fresh = [ref for ref in dict.fromkeys(refs) if now - self._present.get((ref, platform), -1e9) < ttl]
        statuses += [ImageStatus(ref, 0.0, 0.0, False) for ref in fresh]
        missing = [ref for ref in dict.fromkeys(refs) if ref not in fresh]
        if not missing:
            return statuses
        client = self._docker()
        for ref in missing:
            started = time.monotonic()
            if skip_pull:
                problem = self._absence(client, ref, platform)
                if problem:
                    raise PullError(f"image {ref} {problem}, and skip_pull forbids pulling it")
                statuses.append(ImageStatus(ref, time.monotonic() - started, 0.0, False))
                self._present[(ref, platform)] = time.monotonic()
                continue
            if self._absence(client, ref, platform) is None:
                statuses.append(ImageStatus(ref, time.monotonic() - started, 0.0, False))
                self._present[(ref, platform)] = time.monotonic()
                continue
            lock_path = pull_lock_path(self._state, image_digest(ref))
            with host_lock(lock_path, self._lock_timeout_sec, f"pulling {ref}") as waited:
                pulled = False
                if self._absence(client, ref, platform) is not None:  # check after lock
                    self._pull_within_budget(client, ref, platform, refs)
                    pulled = True
            statuses.append(ImageStatus(ref, time.monotonic() - started, waited, pulled))
            self._present[(ref, platform)] = time.monotonic()
        return statuses

    def _pull_within_budget(
        self, client: docker.DockerClient, ref: str, platform: str, mine: list[str]
    ) -> None:
        """Pull `ref`, evicting free task images before (its size as last pulled) and after (its real size).

        A pull the disk cannot take although the budget said yes (other data
        on the disk) evicts every free task image and tries once more; when it
        fails again, or the budget cannot fit the image, NoRoomError.
        """
        if self.budget.budget <= 0:
            self._pull(client, ref, platform)
            return
        self.budget.make_room(client, expected_sizes([ref], pull_log_path(self._state)), mine)
        try:
            self._pull(client, ref, platform)
        except PullError as exc:
            if "no space left on device" not in str(exc).lower():
                raise
            self.budget.make_room(client, {ref: self.budget.budget}, mine)  # everything free goes
            try:
                self._pull(client, ref, platform)
            except PullError as again:
                if "no space left on device" in str(again).lower():
                    raise NoRoomError(
                        f"no space for {ref} on this host even after evicting: {again}"
                    ) from None
                raise
        self.budget.make_room(client, {}, mine, strict=False)

    def _absence(self, client: docker.DockerClient, ref: str, platform: str) -> str | None:
        """None when `ref` is present for `platform`, else why not (a phrase)."""
        try:
            attrs = client.images.get(pinned_name(ref)).attrs
        except docker.errors.ImageNotFound:
            return "is not present on this host"
        except ENGINE_ERRORS as exc:
            raise PullError(f"cannot inspect image {ref}: {one_line(str(exc))}") from None
        if not repo_digests_contain(attrs.get("RepoDigests") or [], ref):
            return "is not present on this host with its pinned digest"
        image_os, arch = str(attrs.get("Os", "")), str(attrs.get("Architecture", ""))
        if not platform_matches(platform, image_os, arch, str(attrs.get("Variant", ""))):
            return f"is present only for {image_os}/{arch}, not {platform}"
        return None

    def _pull(self, client: docker.DockerClient, ref: str, platform: str) -> None:
        repository = image_repository(ref)
        digest = image_digest(ref)
        registry, _ = docker.auth.resolve_repository_name(repository)
        held = self._registry_gate(registry) if self._registry_gate is not None else None
        if held is not None:
            wait, status = held
            why = f"the cluster backs off from registry {registry} ({status}) for {wait:.0f}s more"
            raise RegistryError(f"pull of {ref} held back: {why}", registry, status, wait, asked=False)
        auth = registry_auth(registry)
        with self._pull_hold(ref) if self._pull_hold is not None else contextlib.nullcontext():
            started = time.monotonic()
            try:
                stream = client.api.pull(
                    repository, tag=digest, stream=True, decode=True, platform=platform,
                    auth_config=auth or {},
                )  # fmt: skip
                for message in stream:
                    error = message.get("errorDetail", {}).get("message") or message.get("error")
                    if error:
                        raise _pull_error(ref, platform, registry, str(error), auth)
            except docker.errors.APIError as exc:
                raise _pull_error(ref, platform, registry, str(exc.explanation or exc), auth) from None
            except ENGINE_ERRORS as exc:
                raise PullError(f"pull of {ref} for {platform} failed: {one_line(str(exc))}") from None
            seconds = time.monotonic() - started
        problem = self._absence(client, ref, platform)
        if problem is not None:
            raise PullError(f"pulled {ref} for {platform}, but the image {problem}")
        with self._guard:
            self._pulls += 1
        try:
            size = int(client.images.get(pinned_name(ref)).attrs.get("Size") or 0)
        except ENGINE_ERRORS:
            size = 0
        record = PullRecord(
            ref=ref, digest=digest, platform=platform, seconds=round(seconds, 3),
            pid=os.getpid(), finished_at=datetime.now(UTC).isoformat(), size=size,
        )  # fmt: skip
        _append_line(pull_log_path(self._state), json.dumps(record.__dict__, sort_keys=True))


def _pull_error(
    ref: str, platform: str, registry: str, reason: str, auth: dict[str, Any] | None
) -> PullError:
    """A failed pull's error: `RegistryError` when the registry pushed back (with its wait), else PullError.

    The Engine reports a registry's 429 as its own error (API status 500)
    with the registry's text, so the cause is read from the message
    (`registryhints.refusal_status`). A full disk, a manifest unknown or a
    denied pull stay a PullError.
    """
    message = f"pull of {ref} for {platform} failed: {one_line(reason)}"
    status = refusal_status(reason)
    if status is None:
        return PullError(message)
    _, name = docker.auth.resolve_repository_name(image_repository(ref))
    if registry == docker.auth.INDEX_NAME and "/" not in name:
        name = f"library/{name}"  # an official image's name on Docker Hub's API
    hint = probe_hint_sec(registry, name, image_digest(ref), auth)
    return RegistryError(f"registry {registry} refused: {message}", registry, status, hint)


def _append_line(path: Path, line: str) -> None:
    """Append one line with a single O_APPEND write (atomic for small lines)."""
    fd = open_state_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    finally:
        os.close(fd)


def ensure_kit_image(ref: str) -> bool:
    """Make a pinned image of the worker's own kit (the proxy) present; True when it had to be pulled.

    Not a task image: it is not written to the pull log, so no image budget
    counts or evicts it. Raises PullError (one line, naming the ref).
    """
    name = pinned_name(ref)
    try:
        client = connect()
    except PreflightError as exc:
        raise PullError(f"{ref}: {exc}") from None
    try:
        try:
            client.images.get(name)
            return False
        except docker.errors.ImageNotFound:
            pass
        repository, digest = image_repository(ref), image_digest(ref)
        registry, _ = docker.auth.resolve_repository_name(repository)
        client.images.pull(repository, tag=digest, auth_config=registry_auth(registry) or {})
        return True
    except docker.errors.APIError as exc:
        raise PullError(f"{ref}: cannot be pulled ({one_line(str(exc), 200)})") from None
    except docker.errors.DockerException as exc:
        raise PullError(f"{ref}: the engine failed ({exc.__class__.__name__})") from None
    finally:
        client.close()
