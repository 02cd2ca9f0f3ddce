"""Everything sciencebench does with the local Docker Engine (besides network/).

Three jobs, all host-local:

* facts about the engine for the preflight (`engine_facts`);
* pulling digest-pinned task images at most once per host (`ImagePuller`);
* removing what Pier leaves behind under `--no-delete` (`cleanup_trial`,
  `cleanup_by_prefix`, `sweep_leftovers`), never touching pinned task images.

How Pier 0.3.0 names things (read from `pier/environments/docker/docker.py`
and `pier/trial/trial.py`, checked against the real functions by
`tests/docker/test_dockerhost.py`):

* A trial is named `<task dir name[:32] stripped of trailing '_-'>__<7 random
  alphanumerics>`; the trial directory carries exactly that name.
* The agent environment's session id is the trial name. Its compose project is
  `compose_project_name(trial_name)`: lowercased, a `0` prepended when it does
  not start with `[a-z0-9]`, every character outside `[a-z0-9_-]` replaced by
  `-` (so `task_002__AbC1xyz` -> `task_002__abc1xyz`).
* A separate verifier environment's session id is
  `<trial name>__verifier__<key>` (key `trial`, or the step name of a
  multi-step task), every character outside alphanumerics and `-._` replaced
  by `_`, cut to 63 characters with an 8-hex sha1 suffix when longer; its
  project is `compose_project_name` of that id.
* Every container, network and volume compose creates carries the label
  `com.docker.compose.project=<project>`. When Pier builds (installed agents,
  or tasks without a prebuilt image) compose tags the result
  `<project>-main:latest` and labels it the same way; a prebuilt task image
  run as is carries no such label (and has RepoDigests from its registry).
* `--no-delete` runs `compose down` (containers and networks go, images stay);
  a crashed or killed Pier leaves containers, networks and volumes as well.

So everything of one trial is found by the label value `P` for `P` in
`trial_project_names(trial_name)`, or by `projects_of_trial(trial_name)` which
also matches verifier projects of any step.

Live trials: Pier picks the trial name itself, so a trial runner holds
`trial_lease(pier_trial_prefix(task_dir.name))` (an flock under the host
state dir) around its Pier run; `sweep_leftovers`, in any process of the host,
spares every project a held lease covers and those the caller names active.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.auth
import docker.errors
from docker.credentials.errors import StoreError

from sciencebench.errors import PreflightError, PullError, WorkspaceError
from sciencebench.taskspec import check_image_ref, image_digest, image_repository

COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
# Every container the network-policy environment starts carries this label
# (its value is the container's role); a sweep only touches such projects.
MANAGED_LABEL = "org.sciencebench.network-role"
# Which worker state directory started a trial's containers: a sweep only
# removes projects of its own host state, never another worker's live trial.
OWNER_LABEL = "org.sciencebench.owner"
STATE_DIR_ENV = "SCIENCEBENCH_STATE_DIR"
# A fixed host-local directory shared by every worker process of the host (not a temp file).
DEFAULT_STATE_DIR = Path("/var/tmp/sciencebench")  # noqa: S108
# Pier's `_MAX_VERIFIER_ENV_SESSION_ID_LEN`.
_MAX_VERIFIER_SESSION_ID_LEN = 63
_VERIFIER_MARK = "__verifier__"
_DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
# What a call to the engine may raise: the SDK's errors, and requests' connection
# errors (subclasses of OSError) that the SDK lets through when the socket dies.
_ENGINE_ERRORS = (docker.errors.DockerException, OSError)
# A compose project of a Pier trial: `<trial name>` or `<trial name>__verifier__<key>`.
_PIER_PROJECT = re.compile(r"^(?P<trial>[a-z0-9][a-z0-9_-]*__[a-z0-9]{7})(?:__verifier__.+)?$")


def state_dir() -> Path:
    """The host-local state directory: `$SCIENCEBENCH_STATE_DIR` or /var/tmp/sciencebench.

    It must be on a local filesystem of the worker host (pull locks, the pull
    log and trial leases live there), shared by all worker processes of the host.
    """
    configured = os.environ.get(STATE_DIR_ENV, "").strip()
    return Path(configured) if configured else DEFAULT_STATE_DIR


# --- engine facts -------------------------------------------------------------


@dataclass(frozen=True)
class EngineFacts:
    """What the preflight needs to know about the local engine and CLI."""

    server_version: str
    api_version: str
    os: str
    arch: str
    compose_version: str | None
    compose_problem: str | None

    @property
    def platform(self) -> str:
        """`os/arch` of the engine, e.g. `linux/amd64`."""
        return f"{self.os}/{self.arch}"


def connect(timeout_sec: int = 120) -> docker.DockerClient:
    """A client for the engine named by DOCKER_HOST (and DOCKER_TLS_*), as the CLI uses.

    Raises PreflightError with one line when the engine does not answer.
    """
    where = os.environ.get("DOCKER_HOST") or _DEFAULT_DOCKER_HOST
    if where.startswith("unix://"):
        # Probe with a socket we close ourselves: the SDK leaks the socket of a
        # failed unix connect (a ResourceWarning later, at garbage collection).
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(10)
                probe.connect(where.removeprefix("unix://"))
        except OSError as exc:
            reason = exc.strerror or exc.__class__.__name__
            raise PreflightError(f"Docker Engine at {where} is unreachable: {reason}") from None
    try:
        return docker.from_env(timeout=timeout_sec)
    except _ENGINE_ERRORS as exc:
        raise PreflightError(f"Docker Engine at {where} is unreachable: {_one_line(str(exc))}") from None


def compose_version(timeout_sec: float = 60.0) -> tuple[str | None, str | None]:
    """`(version, None)` from `docker compose version --short`, or `(None, why)`.

    Uses the same `docker` CLI Pier will use (first on PATH, plugins from
    DOCKER_CONFIG), so a missing compose plugin is found before a trial needs it.
    """
    docker_cli = shutil.which("docker")
    if docker_cli is None:
        return None, "the docker CLI is not on PATH"
    try:
        result = subprocess.run(
            [docker_cli, "compose", "version", "--short"],
            capture_output=True, text=True, timeout=timeout_sec, check=False,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"`docker compose version` did not answer within {timeout_sec:.0f}s"
    except OSError as exc:
        return None, f"cannot run {docker_cli}: {exc.strerror}"
    text = result.stdout.strip()
    if result.returncode != 0 or not text:
        return None, _one_line(result.stderr or result.stdout or f"exit code {result.returncode}")
    return text.splitlines()[-1].strip(), None


def engine_facts(client: docker.DockerClient) -> EngineFacts:
    """Ask the engine for its version and platform, and the CLI for compose.

    Raises PreflightError when the engine does not answer.
    """
    try:
        info = client.version()
    except _ENGINE_ERRORS as exc:
        raise PreflightError(f"Docker Engine did not answer: {_one_line(str(exc))}") from None
    version, problem = compose_version()
    return EngineFacts(
        server_version=str(info.get("Version", "")),
        api_version=str(info.get("ApiVersion", "")),
        os=str(info.get("Os", "")),
        arch=str(info.get("Arch", "")),
        compose_version=version,
        compose_problem=problem,
    )


# --- pure helpers -------------------------------------------------------------


def _one_line(text: str, limit: int = 400) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def normalize_repository(name: str) -> str:
    """A repository name as the engine stores it, registry made explicit.

    `ubuntu` and `docker.io/ubuntu` -> `docker.io/library/ubuntu`;
    `index.docker.io/x/y` -> `docker.io/x/y`; other registries unchanged.
    """
    first, _, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        first, rest = "docker.io", name
    if first == "index.docker.io":
        first = "docker.io"
    if first == "docker.io" and "/" not in rest:
        rest = f"library/{rest}"
    return f"{first}/{rest}"


def pinned_name(ref: str) -> str:
    """`repository@sha256:...` of a pinned ref, tag dropped, registry normalized.

    This is the form the engine lists in an image's RepoDigests (after
    `normalize_repository`). Raises PullError for a ref that is not pinned.
    """
    try:
        check_image_ref(ref)
    except ValueError as exc:
        raise PullError(str(exc)) from None
    return f"{normalize_repository(image_repository(ref))}@{image_digest(ref)}"


def repo_digests_contain(repo_digests: Iterable[str], ref: str) -> bool:
    """True when `repo_digests` (an image's RepoDigests) holds the pinned `ref`."""
    want = pinned_name(ref)
    for entry in repo_digests:
        name, sep, digest = entry.rpartition("@")
        if sep and f"{normalize_repository(name)}@{digest}" == want:
            return True
    return False


def platform_matches(platform: str, image_os: str, image_arch: str, image_variant: str) -> bool:
    """Whether an image built for `image_os/image_arch[/variant]` serves `platform`.

    `platform` is `os/arch[/variant]`; a variant is compared only when both
    sides name one.
    """
    parts = platform.lower().split("/")
    if len(parts) < 2:
        return False
    want_os, want_arch = parts[0], parts[1]
    want_variant = parts[2] if len(parts) > 2 else ""
    if (image_os.lower(), image_arch.lower()) != (want_os, want_arch):
        return False
    return not (want_variant and image_variant and want_variant != image_variant.lower())


def owner_id(state: Path | None = None) -> str:
    """This host state's id for `OWNER_LABEL`: host name and state directory, hashed."""
    where = f"{os.uname().nodename}:{(state or state_dir()).resolve()}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def compose_project_name(session_id: str) -> str:
    """Pier's `_sanitize_docker_compose_project_name`: the compose project of a session id."""
    name = session_id.lower()
    if not re.match(r"^[a-z0-9]", name):
        name = "0" + name
    return re.sub(r"[^a-z0-9_-]", "-", name)


def verifier_session_id(trial_name: str, key: str = "trial") -> str:
    """Pier's `Trial._separate_verifier_session_id`: session id of a separate verifier env."""
    raw = f"{trial_name}{_VERIFIER_MARK}{key}"
    safe = "".join(char if char.isalnum() or char in "-._" else "_" for char in raw)
    if len(safe) <= _MAX_VERIFIER_SESSION_ID_LEN:
        return safe
    digest = hashlib.sha1(safe.encode()).hexdigest()[:8]  # noqa: S324 - Pier's naming, not security
    suffix = f"__{digest}"
    prefix = safe[: _MAX_VERIFIER_SESSION_ID_LEN - len(suffix)].rstrip("-._")
    return f"{prefix}{suffix}"


def trial_project_names(trial_name: str, verifier_keys: Iterable[str] = ("trial",)) -> list[str]:
    """Compose projects Pier may create for the trial named `trial_name`.

    `trial_name` is the trial directory name. The first entry is the agent
    environment; one verifier project follows per key (`trial` for an
    ordinary task in separate verifier mode, the step names otherwise).
    """
    names = [compose_project_name(trial_name)]
    names += [compose_project_name(verifier_session_id(trial_name, key)) for key in verifier_keys]
    return names


def project_trial_key(project: str) -> str:
    """The agent-environment project a project belongs to (itself, or before `__verifier__`)."""
    return project.split(_VERIFIER_MARK, 1)[0]


def projects_of_trial(trial_name: str) -> Callable[[str], bool]:
    """A predicate matching every compose project of one trial, verifier steps included."""
    key = compose_project_name(trial_name)
    return lambda project: project_trial_key(project) == key


def is_pier_project(project: str) -> bool:
    """Whether a compose project name has the shape of a Pier trial's project."""
    return _PIER_PROJECT.match(project) is not None


# --- image pulls --------------------------------------------------------------


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
            reason = _one_line(str(exc.__cause__ or exc))
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


def pull_log_path(state: Path | None = None) -> Path:
    """The host's pull log: one JSON line per pull performed (`PullRecord`)."""
    return (state or state_dir()) / "pulls.jsonl"


def read_pull_log(state: Path | None = None) -> list[PullRecord]:
    """Every pull performed on this host (state dir) so far, oldest first."""
    try:
        text = pull_log_path(state).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [PullRecord(**json.loads(line)) for line in text.splitlines() if line.strip()]


def pull_counts(state: Path | None = None) -> dict[str, int]:
    """Pulls performed on this host per digest (`sha256:...`): the dedup proof."""
    counts: dict[str, int] = {}
    for record in read_pull_log(state):
        counts[record.digest] = counts.get(record.digest, 0) + 1
    return counts


def _open_state_file(path: Path, flags: int) -> int:
    """Open a file of the host state dir; WorkspaceError (one line) when that is impossible."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise WorkspaceError(
            f"host state dir {path.parent} is unusable ({exc.strerror or exc.__class__.__name__}): "
            f"set {STATE_DIR_ENV} to a writable host-local directory"
        ) from None


@contextlib.contextmanager
def _host_lock(path: Path, timeout_sec: float, what: str) -> Iterator[float]:
    """Hold an exclusive flock on `path`; yields the seconds spent waiting.

    flock locks belong to the open file description, so two threads of one
    process exclude each other as two processes do (each opens its own fd).
    The kernel drops the lock when its holder dies.
    """
    started = time.monotonic()
    fd = _open_state_file(path, os.O_RDWR | os.O_CREAT)
    try:
        # Poll (a blocking flock could not time out): the cap keeps the hand-over
        # from a finished pull to the next waiter short, and costs ~20 syscalls/s.
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if time.monotonic() - started > timeout_sec:
                raise PullError(
                    f"waited {timeout_sec:.0f}s for another process on this host to finish {what}; giving up"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        yield time.monotonic() - started
    finally:
        os.close(fd)  # releases the lock


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
    """

    def __init__(
        self,
        state: Path | None = None,
        client_factory: Callable[[], docker.DockerClient] | None = None,
        lock_timeout_sec: float = 3 * 3600.0,
    ) -> None:
        self._state = state or state_dir()
        self._client_factory = client_factory or connect
        self._lock_timeout_sec = lock_timeout_sec
        self._guard = threading.Lock()
        self._client: docker.DockerClient | None = None
        self._pid = os.getpid()
        self._pulls = 0

    @property
    def pulls_performed(self) -> int:
        """Pulls this instance performed (in this process)."""
        return self._pulls

    def _docker(self) -> docker.DockerClient:
        if self._pid != os.getpid():  # forked: never share the parent's connections
            self._guard = threading.Lock()
            self._client = None
            self._pid = os.getpid()
        with self._guard:
            if self._client is None:
                try:
                    self._client = self._client_factory()
                except PreflightError as exc:
                    raise PullError(str(exc)) from None
            return self._client

    def ensure(self, refs: list[str], platform: str, skip_pull: bool) -> dict[str, float]:
        """Make every pinned ref present locally; seconds spent per ref.

        See `ensure_images`, which this wraps (and raises what it raises).
        """
        return {status.ref: status.seconds for status in self.ensure_images(refs, platform, skip_pull)}

    def ensure_images(self, refs: list[str], platform: str, skip_pull: bool) -> list[ImageStatus]:
        """Make every pinned ref (`repo[:tag]@sha256:...`) present for `platform`.

        An image counts as present when the engine has it with the pinned
        `repo@sha256:...` among its RepoDigests and built for `platform`.
        Present images are never pulled again. Otherwise it is pulled by
        digest for `platform` (under the per-image host lock), and verified:
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
        client = self._docker()
        statuses: list[ImageStatus] = []
        for ref in dict.fromkeys(refs):
            started = time.monotonic()
            if skip_pull:
                problem = self._absence(client, ref, platform)
                if problem:
                    raise PullError(f"image {ref} {problem}, and skip_pull forbids pulling it")
                statuses.append(ImageStatus(ref, time.monotonic() - started, 0.0, False))
                continue
            if self._absence(client, ref, platform) is None:
                statuses.append(ImageStatus(ref, time.monotonic() - started, 0.0, False))
                continue
            lock_path = self._state / "locks" / f"{image_digest(ref).split(':', 1)[1]}.lock"
            with _host_lock(lock_path, self._lock_timeout_sec, f"pulling {ref}") as waited:
                pulled = False
                if self._absence(client, ref, platform) is not None:  # check after lock
                    self._pull(client, ref, platform)
                    pulled = True
            statuses.append(ImageStatus(ref, time.monotonic() - started, waited, pulled))
        return statuses

    def _absence(self, client: docker.DockerClient, ref: str, platform: str) -> str | None:
        """None when `ref` is present for `platform`, else why not (a phrase)."""
        try:
            attrs = client.images.get(pinned_name(ref)).attrs
        except docker.errors.ImageNotFound:
            return "is not present on this host"
        except _ENGINE_ERRORS as exc:
            raise PullError(f"cannot inspect image {ref}: {_one_line(str(exc))}") from None
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
        auth = registry_auth(registry)
        started = time.monotonic()
        try:
            stream = client.api.pull(
                repository, tag=digest, stream=True, decode=True, platform=platform,
                auth_config=auth or {},
            )  # fmt: skip
            for message in stream:
                error = message.get("errorDetail", {}).get("message") or message.get("error")
                if error:
                    raise PullError(f"pull of {ref} for {platform} failed: {_one_line(error)}")
        except docker.errors.APIError as exc:
            reason = exc.explanation or str(exc)
            raise PullError(f"pull of {ref} for {platform} failed: {_one_line(str(reason))}") from None
        except _ENGINE_ERRORS as exc:
            raise PullError(f"pull of {ref} for {platform} failed: {_one_line(str(exc))}") from None
        seconds = time.monotonic() - started
        problem = self._absence(client, ref, platform)
        if problem is not None:
            raise PullError(f"pulled {ref} for {platform}, but the image {problem}")
        with self._guard:
            self._pulls += 1
        record = PullRecord(
            ref=ref, digest=digest, platform=platform, seconds=round(seconds, 3),
            pid=os.getpid(), finished_at=datetime.now(UTC).isoformat(),
        )  # fmt: skip
        _append_line(pull_log_path(self._state), json.dumps(record.__dict__, sort_keys=True))


def _append_line(path: Path, line: str) -> None:
    """Append one line with a single O_APPEND write (atomic for small lines)."""
    fd = _open_state_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    finally:
        os.close(fd)


# --- trial leases -------------------------------------------------------------


def pier_trial_prefix(task_dir_name: str) -> str:
    """The compose-project prefix of every trial Pier starts for a task directory.

    Pier names a trial `<task dir name[:32] stripped of '_-'>__<7 random>`, so
    before Pier has picked the name, `<...>__` (compose-normalized) is known.
    """
    return compose_project_name(f"{task_dir_name[:32].rstrip('_-')}__")


def _lease_path(state: Path, key: str) -> Path:
    return state / "leases" / f"{compose_project_name(key)}.lock"


@contextlib.contextmanager
def trial_lease(key: str, state: Path | None = None) -> Iterator[None]:
    """Mark the trials whose projects start with `key` as live on this host.

    `key` is a trial name, or — before Pier has named the trial — the
    `pier_trial_prefix` of its task directory (which also covers other
    attempts of that task on this host; a sweep then merely waits). Hold it
    around the Pier run: `sweep_leftovers` in any process of the host leaves
    those projects alone. The lease is a shared flock, so it ends when the
    block ends or its holder dies, and never outlives a crashed worker.

    Raises WorkspaceError when the host state dir cannot be written.
    """
    fd = _open_state_file(_lease_path(state or state_dir(), key), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def held_leases(state: Path | None = None) -> set[str]:
    """Keys (compose-normalized) of the trial leases some live process of this host holds."""
    directory = (state or state_dir()) / "leases"
    try:
        paths = sorted(directory.glob("*.lock"))
    except OSError:
        return set()
    held: set[str] = set()
    for path in paths:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            held.add(path.name.removesuffix(".lock"))
        finally:
            os.close(fd)
    return held


def lease_held(project: str, state: Path | None = None) -> bool:
    """Whether a live process on this host holds a lease covering `project`."""
    return any(project.startswith(key) for key in held_leases(state))


# --- cleanup ------------------------------------------------------------------


@dataclass
class CleanupReport:
    """What a cleanup removed (names or short ids), and what it could not."""

    projects: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    kept_images: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def merge(self, other: CleanupReport) -> None:
        for name in ("projects", "containers", "networks", "volumes", "images", "kept_images"):
            getattr(self, name).extend(getattr(other, name))
        self.errors.extend(other.errors)


def _label_filter(project: str | None) -> dict[str, Any]:
    return {"label": COMPOSE_PROJECT_LABEL if project is None else f"{COMPOSE_PROJECT_LABEL}={project}"}


def compose_projects(client: docker.DockerClient | None = None) -> set[str]:
    """Every compose project with a container, network, volume or image on this engine.

    Raises PreflightError when no client is given and the engine is unreachable.
    """
    with _client_or(client) as api:
        return compose_projects_api(api)


@contextlib.contextmanager
def _client_or(client: docker.DockerClient | None) -> Iterator[docker.APIClient]:
    if client is not None:
        yield client.api
        return
    own = connect()
    try:
        yield own.api
    finally:
        own.close()


def derived_image_removable(attrs: dict[str, Any], project: str) -> bool:
    """Whether an image (as listed by the engine) is a derived image of `project`.

    True only when the image carries `com.docker.compose.project=<project>`
    and every RepoDigest it has names a `<project>-...` repository: an image
    that came from a registry (a pinned task image) has a registry
    RepoDigest and is never removable, whatever its labels say.
    """
    labels = attrs.get("Labels") or {}
    if labels.get(COMPOSE_PROJECT_LABEL) != project:
        return False
    digests = attrs.get("RepoDigests") or []
    return all(entry.rpartition("@")[0].startswith(f"{project}-") for entry in digests)


def _remove(
    report: CleanupReport, what: str, action: Callable[..., object], *args: Any, **kwargs: Any
) -> bool:
    """Run one removal; False when the object was already gone or the engine refused."""
    try:
        action(*args, **kwargs)
    except docker.errors.NotFound:
        return False
    except _ENGINE_ERRORS as exc:
        report.errors.append(f"{what}: {_one_line(str(exc))}")
        return False
    return True


def _cleanup_project(api: docker.APIClient, project: str) -> CleanupReport:
    report = CleanupReport(projects=[project])
    only = _label_filter(project)
    for item in api.containers(all=True, filters=only):
        name = (item.get("Names") or [item["Id"][:12]])[0].lstrip("/")
        if _remove(report, f"container {name}", api.remove_container, item["Id"], v=True, force=True):
            report.containers.append(name)
    for item in api.networks(filters=only):
        if _remove(report, f"network {item['Name']}", api.remove_network, item["Id"]):
            report.networks.append(item["Name"])
    for item in api.volumes(filters=only).get("Volumes") or []:
        if _remove(report, f"volume {item['Name']}", api.remove_volume, item["Name"], force=True):
            report.volumes.append(item["Name"])
    for item in api.images(filters=only):
        tags = [t for t in item.get("RepoTags") or [] if t != "<none>:<none>"]
        if not derived_image_removable(item, project):
            report.kept_images.extend(tags or [item["Id"]])
            continue
        ours = [t for t in tags if t.startswith(f"{project}-")]
        report.kept_images.extend(t for t in tags if t not in ours)
        # Untag our own tags only (without other tags that deletes the image);
        # an untagged derived image is removed by id. Never forced.
        for target in ours or ([] if tags else [item["Id"]]):
            if _remove(report, f"image {target}", api.remove_image, target):
                report.images.append(target)
    return report


def cleanup_trial(project_names: Iterable[str], client: docker.DockerClient | None = None) -> CleanupReport:
    """Remove the containers, networks, volumes and derived images of these compose projects.

    Finds objects by the label `com.docker.compose.project=<name>` (compute
    the names with `trial_project_names(trial_dir.name)`). Containers go
    first (forced, with their anonymous volumes), then networks, volumes, and
    derived images `<project>-<service>:<tag>` (see `derived_image_removable`).
    Pinned task images, and any tag not of the project, are never removed.

    Best effort and idempotent: never raises for Docker errors; what could not
    be removed is listed in `CleanupReport.errors` (an unreachable engine too).
    """
    report = CleanupReport()
    try:
        with _client_or(client) as api:
            for project in dict.fromkeys(project_names):
                try:
                    report.merge(_cleanup_project(api, project))
                except _ENGINE_ERRORS as exc:
                    report.errors.append(f"project {project}: {_one_line(str(exc))}")
    except PreflightError as exc:
        report.errors.append(str(exc))
    return report


def cleanup_by_prefix(prefix: str, client: docker.DockerClient | None = None) -> CleanupReport:
    """`cleanup_trial` for every compose project whose name starts with `prefix`.

    For one trial prefer `cleanup_matching(projects_of_trial(name))`. Raises
    ValueError for an empty prefix (that would be every project of the host).
    """
    if not prefix:
        raise ValueError("cleanup_by_prefix needs a non-empty prefix")
    return cleanup_matching(lambda project: project.startswith(prefix), client)


def cleanup_matching(
    match: Callable[[str], bool], client: docker.DockerClient | None = None
) -> CleanupReport:
    """`cleanup_trial` for every compose project on the engine that `match` accepts.

    Never raises for Docker errors (see `cleanup_trial`).
    """
    try:
        with _client_or(client) as api:
            projects = sorted(p for p in compose_projects_api(api) if match(p))
    except (PreflightError, *_ENGINE_ERRORS) as exc:
        return CleanupReport(errors=[_one_line(str(exc))])
    return cleanup_trial(projects, client)


def compose_projects_api(api: docker.APIClient) -> set[str]:
    """`compose_projects` on a low-level client."""
    found: set[str] = set()
    everything = _label_filter(None)
    for item in api.containers(all=True, filters=everything):
        found.add((item.get("Labels") or {}).get(COMPOSE_PROJECT_LABEL, ""))
    for item in api.networks(filters=everything):
        found.add((item.get("Labels") or {}).get(COMPOSE_PROJECT_LABEL, ""))
    for item in api.volumes(filters=everything).get("Volumes") or []:
        found.add((item.get("Labels") or {}).get(COMPOSE_PROJECT_LABEL, ""))
    for item in api.images(filters=everything):
        found.add((item.get("Labels") or {}).get(COMPOSE_PROJECT_LABEL, ""))
    found.discard("")
    return found


def leftover_projects(
    projects: Iterable[str],
    live: Collection[str],
    prefix: str | None = None,
) -> list[str]:
    """The projects a sweep removes: Pier-shaped, under `prefix`, and not live.

    A project is live when it starts with the compose-normalized form of any
    entry of `live` (trial names, project names, `pier_trial_prefix`es, lease
    keys).
    """
    keys = {compose_project_name(name) for name in live if name}
    return sorted(
        project
        for project in projects
        if is_pier_project(project)
        and (prefix is None or project.startswith(prefix))
        and not any(project.startswith(key) for key in keys)
    )


def sweep_leftovers(
    active: Collection[str] = (),
    prefix: str | None = None,
    client: docker.DockerClient | None = None,
    state: Path | None = None,
) -> CleanupReport:
    """Remove what crashed trials left on this host; call at worker start.

    Considers only compose projects shaped like Pier trial projects
    (`is_pier_project`) with a container that sciencebench's policy
    environment started for this host state (`OWNER_LABEL` = `owner_id`),
    optionally only those starting with `prefix`. Leaves
    alone every project covered by `active` (the caller's live trial names or
    `pier_trial_prefix`es) or by a `trial_lease` held in any process of this
    host. Everything else goes as in `cleanup_trial`; pinned task images are
    never removed. Other compose projects of the host (a Redis deployment,
    say) are untouched.

    Never raises for Docker errors (see `cleanup_trial`).
    """
    try:
        with _client_or(client) as api:
            candidates = {
                (item.get("Labels") or {}).get(COMPOSE_PROJECT_LABEL, "")
                for item in api.containers(
                    all=True, filters={"label": [MANAGED_LABEL, f"{OWNER_LABEL}={owner_id(state)}"]}
                )
            } - {""}
    except (PreflightError, *_ENGINE_ERRORS) as exc:
        return CleanupReport(errors=[_one_line(str(exc))])
    # Leases are read after listing: a trial that starts in between is either
    # not listed yet or already leased.
    live = set(active) | held_leases(state)
    return cleanup_trial(leftover_projects(candidates, live, prefix), client)
