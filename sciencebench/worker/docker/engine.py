"""The local Docker Engine: connecting, its facts, the compose CLI.

The only module of the worker that starts the `docker` CLI; everything else
talks to the engine through the client `connect` returns.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

import docker
import docker.errors

from sciencebench.core.errors import PreflightError

_DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
# What a call to the engine may raise: the SDK's errors, and requests' connection
# errors (subclasses of OSError) that the SDK lets through when the socket dies.
ENGINE_ERRORS = (docker.errors.DockerException, OSError)


def one_line(text: str, limit: int = 400) -> str:
    """`text` on one line, cut to `limit` characters (engine messages can be long)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


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
    except ENGINE_ERRORS as exc:
        raise PreflightError(f"Docker Engine at {where} is unreachable: {one_line(str(exc))}") from None


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
        return None, one_line(result.stderr or result.stdout or f"exit code {result.returncode}")
    return text.splitlines()[-1].strip(), None


def engine_facts(client: docker.DockerClient) -> EngineFacts:
    """Ask the engine for its version and platform, and the CLI for compose.

    Raises PreflightError when the engine does not answer.
    """
    try:
        info = client.version()
    except ENGINE_ERRORS as exc:
        raise PreflightError(f"Docker Engine did not answer: {one_line(str(exc))}") from None
    version, problem = compose_version()
    return EngineFacts(
        server_version=str(info.get("Version", "")),
        api_version=str(info.get("ApiVersion", "")),
        os=str(info.get("Os", "")),
        arch=str(info.get("Arch", "")),
        compose_version=version,
        compose_problem=problem,
    )


class ClientPerProcess:
    """One Docker client per process, made on first use and never shared across a fork.

    Safe to create before Celery forks its pool; thread-safe.
    """

    def __init__(self, factory: Callable[[], docker.DockerClient] = connect) -> None:
        self._factory = factory
        self._client: docker.DockerClient | None = None
        self._pid = os.getpid()
        self._guard = threading.Lock()

    def get(self) -> docker.DockerClient:
        """This process's client; raises PreflightError when the engine does not answer."""
        if self._pid != os.getpid():  # forked: never share the parent's connections
            self._guard = threading.Lock()
            self._client, self._pid = None, os.getpid()
        with self._guard:
            if self._client is None:
                self._client = self._factory()
            return self._client
