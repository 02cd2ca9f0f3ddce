"""Files between a trial's containers and the host: nothing mounted, every copy through the archive API.

No host directory is mounted into a trial container (no log mounts,
`capabilities.mounted` false, so Pier copies logs, rewards and artifacts
explicitly), and every copy goes through the Engine's archive API and
`network.transfer` (`network.extract`, `network.tarbuild`): nothing a
container wrote (a link, a device) is ever followed or created on the host,
and what was refused is written to the trial's `transfer-refusals.json`
(`network.refusals`).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import posixpath
import tarfile
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import docker
from docker.errors import NotFound
from pier.environments.base import ExecResult
from pier.environments.capabilities import EnvironmentCapabilities
from pier.environments.docker.docker import _sanitize_docker_compose_project_name

from sciencebench.core.errors import TransferRefused
from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL, COMPOSE_SERVICE_LABEL
from sciencebench.network.execenv import SecretSafeExecEnvironment
from sciencebench.network.extract import extract, extract_file
from sciencebench.network.refusals import record_refusals
from sciencebench.network.tarbuild import build_tar, directory_headers
from sciencebench.network.transfer import (
    Budget,
    ChunkReader,
    Refusal,
    Transfer,
    open_dir,
    open_trial_dir,
    posix_parts,
    trial_relative,
)

# Per-request timeout of the Engine's archive API (a transfer of up to 2 GiB streams within it).
TRANSFER_TIMEOUT_SEC = 300
_LOG_DIR_MODE = 0o777


# What each trial's downloads carried, shared by its environments (the agent's, a separate verifier's)
# while any of them lives.
_BUDGETS: weakref.WeakValueDictionary[str, Budget] = weakref.WeakValueDictionary()
_BUDGETS_LOCK = threading.Lock()


def _trial_budget(trial_dir: Path) -> Budget:
    """The budget of all downloads into `trial_dir` (`network.transfer.Budget`), one per trial."""
    with _BUDGETS_LOCK:
        budget = _BUDGETS.get(os.path.abspath(trial_dir))
        if budget is None:
            budget = _BUDGETS[os.path.abspath(trial_dir)] = Budget()
        return budget


class ContainerFilesEnvironment(SecretSafeExecEnvironment):
    """Pier's Docker environment with no host directory mounted and every copy a checked archive."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._docker_client: docker.DockerClient | None = None
        self._main_id: str | None = None
        self._log_dirs_made = False
        # No host directory is mounted: Pier's own log mounts (the separate
        # verifier's included) are dropped; the logs are copied instead.
        self._dropped_mounts = list(kwargs.pop("mounts_json", None) or [])
        kwargs["mounts_json"] = []
        super().__init__(*args, **kwargs)
        self._mounts_json = []
        self._received = _trial_budget(Path(self.trial_paths.trial_dir))

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """Pier's Docker capabilities, except that nothing is mounted: Pier copies every file explicitly."""
        capabilities: EnvironmentCapabilities = super().capabilities
        return capabilities.model_copy(update={"mounted": False})

    def _default_log_mounts(self) -> list[Any]:
        """No log mounts: a container never writes into a host directory."""
        return []

    async def prepare_logs_for_host(self) -> None:
        """Nothing to do: the host's copies are created by this process, never by a container."""

    async def _chown_to_host_user(self, path: str, recursive: bool = False) -> None:
        """Nothing to do (see `prepare_logs_for_host`)."""

    @property
    def compose_project(self) -> str:
        """This environment's compose project, as Pier names it."""
        return str(_sanitize_docker_compose_project_name(self.session_id))

    async def exec(self, command: str, *args: Any, **kwargs: Any) -> ExecResult:
        """Run a command; Pier's post-`up` chmod of its (unmounted) log directories creates them instead.

        The arguments are Pier's (`cwd`, `env`, `timeout_sec`, `user`), passed on unchanged.
        """
        if not self._log_dirs_made and command == self._pier_log_chmod:
            await asyncio.to_thread(self._make_log_dirs)
            return ExecResult(stdout=None, stderr=None, return_code=0)
        result: ExecResult = await super().exec(command, *args, **kwargs)
        return result

    @property
    def _pier_log_chmod(self) -> str:
        # What DockerEnvironment.start runs after `up` (Pier 0.3.0).
        return f"chmod 777 {self._env_paths.agent_dir} {self._env_paths.verifier_dir}"

    def _make_log_dirs(self) -> None:
        """Create the container's log directories (root-owned, mode 777: non-root agents write there)."""
        paths = [self._env_paths.agent_dir, self._env_paths.verifier_dir, self._env_paths.artifacts_dir]
        headers = {h.name: h for p in paths for h in directory_headers(posix_parts(str(p)))}
        leaves = {"/".join(posix_parts(str(p))) for p in paths}
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for name, header in sorted(headers.items()):
                header.mode = _LOG_DIR_MODE if name in leaves else header.mode
                tar.addfile(header)
        self._client().api.put_archive(self._main_container(), "/", archive.getvalue())
        self._log_dirs_made = True

    def _client(self) -> docker.DockerClient:
        if self._docker_client is None:
            self._docker_client = docker.from_env(timeout=TRANSFER_TIMEOUT_SEC)
        return self._docker_client

    def _close_docker(self) -> None:
        # Also drops a connection left with an unread archive (a transfer stopped at a bound).
        if self._docker_client is not None:
            self._docker_client.close()
            self._docker_client = None

    @property
    def _main_labels(self) -> list[str]:
        return [f"{COMPOSE_PROJECT_LABEL}={self.compose_project}", f"{COMPOSE_SERVICE_LABEL}=main"]

    def _main_container(self) -> str:
        """The id of this project's `main` container (found by its compose labels)."""
        if self._main_id is None:
            found = self._client().containers.list(all=True, filters={"label": self._main_labels})
            if len(found) != 1:
                raise RuntimeError(f"{self.compose_project}: {len(found)} main containers, expected 1")
            self._main_id = str(found[0].id)
        return self._main_id

    def _archive(self, source: str) -> IO[bytes]:
        chunks, _stat = self._client().api.get_archive(self._main_container(), source)
        return io.BufferedReader(ChunkReader(chunks), buffer_size=1024 * 1024)

    def _refused(self, direction: str, source: str, target: str, refusals: Sequence[Refusal]) -> None:
        """Keep `refusals` in the trial's transfer-refusals.json and the trial's log."""
        if not refusals:
            return
        self.logger.warning(f"{direction} {source} -> {target}: refused {len(refusals)} item(s)")
        try:
            record_refusals(Path(self.trial_paths.trial_dir), direction, source, target, refusals)
        except OSError as exc:
            self.logger.warning(f"could not record transfer refusals: {exc}")

    def _target_fd(self, target: Path, *, parent: bool) -> tuple[int, str]:
        """A no-follow fd of `target` (or of its parent, and the last component) in the trial directory."""
        parts = trial_relative(Path(self.trial_paths.trial_dir), target)
        if parent and len(parts) < 2:
            raise TransferRefused([Refusal(str(target), "a file cannot replace a trial directory")])
        trial_fd = open_trial_dir(Path(self.trial_paths.trial_dir))
        try:
            return open_dir(trial_fd, parts[:-1] if parent else parts), parts[-1]
        except OSError as exc:
            raise TransferRefused([Refusal(str(target), f"host path refused ({exc.strerror})")]) from None
        finally:
            os.close(trial_fd)

    def _download(self, source: str, target: Path, exclude: Sequence[str] = (), *, file: bool) -> Transfer:
        source = posixpath.normpath(source)
        try:
            fd, name = self._target_fd(target, parent=file)
            try:
                stream = self._archive(source)
                if file:
                    return extract_file(stream, fd, name, budget=self._received)
                strip = posixpath.basename(source)
                result = extract(stream, fd, strip=strip, exclude=exclude, budget=self._received)
                self._refused("download", source, str(target), result.refusals)
                if any("extraction stopped" in r.reason for r in result.refusals):
                    self._close_docker()
                return result
            finally:
                os.close(fd)
        except TransferRefused as exc:
            self._close_docker()
            self._refused("download", source, str(target), [_as_refusal(r) for r in exc.refusals])
            raise

    def _path_mode(self, path: str) -> int | None:
        """The Go `FileMode` bits of a container path (its last element not followed), None when absent.

        The Engine's archive HEAD request: a stat, no archive, no exec.
        """
        api = self._client().api
        url = api._url("/containers/{0}/archive", self._main_container())  # type: ignore[attr-defined]
        response = api.head(url, params={"path": path})
        if response.status_code == 404:
            return None
        response.raise_for_status()
        header = response.headers.get("X-Docker-Container-Path-Stat", "")
        return int(json.loads(base64.b64decode(header)).get("mode", 0))

    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        """Whether `path` is a directory in the container (a link is not one: it would be refused anyway)."""
        mode = await asyncio.to_thread(self._path_mode, path)
        return mode is not None and bool(mode & _GO_MODE_DIR)

    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        """Whether `path` is a regular file in the container (no type bit in its mode)."""
        mode = await asyncio.to_thread(self._path_mode, path)
        return mode is not None and not mode & _GO_MODE_TYPE

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy one regular file of the container to exactly `target_path` (inside the trial directory).

        Raises TransferRefused (recorded in transfer-refusals.json) when the
        source is a link, a device or a directory, or the target is outside
        the trial directory or reached through a link.
        """
        await asyncio.to_thread(self._download, str(source_path), Path(target_path), file=True)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy the contents of a container directory into `target_dir` (merged, files overwritten).

        Links, devices and other special members are refused one by one
        (recorded); raises TransferRefused when the source itself is not a
        directory or the target is not a trial directory reachable without links.
        """
        await asyncio.to_thread(self._download, str(source_dir), Path(target_dir), file=False)

    async def download_dir_with_exclusions(
        self, *, source_dir: str, target_dir: Path | str, exclude: list[str]
    ) -> None:
        """`download_dir`, leaving out members `exclude` matches (`tar --exclude` patterns)."""
        await asyncio.to_thread(self._download, str(source_dir), Path(target_dir), exclude, file=False)

    def _existing_ancestor(self, path: str) -> tuple[str, list[str]]:
        """The nearest existing directory of `path` in the container, and the components below it."""
        parts = posix_parts(posixpath.normpath(path))
        for keep in range(len(parts), 0, -1):
            candidate = "/" + "/".join(parts[:keep])
            try:
                self._client().api.put_archive(self._main_container(), candidate, _EMPTY_TAR)
            except NotFound:
                continue
            return candidate, parts[keep:]
        return "/", parts

    def _upload(self, source: Path, target: str, *, file: bool) -> None:
        directory = posixpath.dirname(posixpath.normpath(target)) if file else target
        base, missing = self._existing_ancestor(directory)
        try:
            archive, result = build_tar(
                source, missing, file_name=posixpath.basename(target) if file else None
            )
        except TransferRefused as exc:
            self._refused("upload", str(source), target, [_as_refusal(r) for r in exc.refusals])
            raise
        with archive:
            self._refused("upload", str(source), target, result.refusals)
            self._client().api.put_archive(self._main_container(), base, archive)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy one host file to `target_path` in the container (parents created), no link followed."""
        await asyncio.to_thread(self._upload, Path(source_path), str(target_path), file=True)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a host directory's contents into `target_dir` (created if missing); links skipped."""
        await asyncio.to_thread(self._upload, Path(source_dir), str(target_dir), file=False)


# Go's os.FileMode type bits, as the Engine's path stat reports them.
_GO_MODE_DIR = 1 << 31
_GO_MODE_TYPE = sum(
    1 << bit for bit in (31, 27, 26, 25, 24, 21, 19)
)  # dir, symlink, device, pipe, socket, char device, irregular
_EMPTY_TAR = bytes(1024)  # two zero blocks: a valid empty archive (probes that a directory exists)


def _as_refusal(item: object) -> Refusal:
    return item if isinstance(item, Refusal) else Refusal("", str(item))
