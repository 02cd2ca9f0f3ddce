"""Is this worker host fit to run trials? One line why not.

The verdicts (`check_engine_version`, `check_platform`, `check_compose`,
`check_pier_version`) are pure; `check_host` gathers the facts (Docker through
`sciencebench.dockerhost`, Pier through its CLI, the jobs dir through the
filesystem) and applies them, failing on the first problem.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from sciencebench import dockerhost
from sciencebench.errors import PreflightError

MIN_ENGINE = (28, 0)
MIN_COMPOSE_MAJOR = 2
PIER_VERSION = "0.3.0"
DEFAULT_PLATFORM = "linux/amd64"

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class HostReport:
    """What a host that passed the preflight runs."""

    engine_version: str
    api_version: str
    platform: str
    compose_version: str
    pier_version: str
    jobs_dir: Path | None

    def lines(self) -> list[str]:
        """One human-readable line per check that passed."""
        lines = [
            f"Docker Engine {self.engine_version} (API {self.api_version}) on {self.platform}",
            f"docker compose {self.compose_version}",
            f"Pier {self.pier_version}",
        ]
        if self.jobs_dir is not None:
            lines.append(f"jobs dir {self.jobs_dir} writable")
        return lines


def parse_version(text: str) -> tuple[int, int, int] | None:
    """`(major, minor, patch)` of `28.5.2`, `28.5.2+dfsg4`, `v2.40.3-3`, `28.0`; None otherwise."""
    match = _VERSION.match(text.strip())
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def check_engine_version(server_version: str) -> None:
    """Raise PreflightError unless the Docker Engine is >= 28.0."""
    parsed = parse_version(server_version)
    need = f"{MIN_ENGINE[0]}.{MIN_ENGINE[1]}"
    if parsed is None:
        raise PreflightError(
            f"Docker Engine reports version {server_version!r}, which is not a version number: "
            f"Engine >= {need} is required for isolated bridge gateway mode"
        )
    if parsed[:2] < MIN_ENGINE:
        raise PreflightError(
            f"Docker Engine {server_version} is too old: Engine >= {need} is required "
            "for isolated bridge gateway mode"
        )


def check_platform(engine_os: str, engine_arch: str, platform: str) -> None:
    """Raise PreflightError unless the engine runs `platform` (`os/arch[/variant]`) natively."""
    parts = platform.lower().split("/")
    if len(parts) < 2 or not all(parts):
        raise PreflightError(f"platform {platform!r} is not of the form os/arch")
    if (engine_os.lower(), engine_arch.lower()) != (parts[0], parts[1]):
        raise PreflightError(
            f"Docker Engine runs {engine_os}/{engine_arch} but the job needs {platform}: "
            f"run this job on {platform} hosts"
        )


def check_compose(compose_version: str | None, problem: str | None) -> str:
    """The compose version when compose v2 or later is present; else PreflightError."""
    if compose_version is None:
        raise PreflightError(f"docker compose v2 is required by Pier but unavailable: {problem}")
    parsed = parse_version(compose_version)
    if parsed is None or parsed[0] < MIN_COMPOSE_MAJOR:
        raise PreflightError(
            f"docker compose {compose_version} is not v2 or later: Pier drives `docker compose` v2"
        )
    return compose_version


def check_pier_version(reported: str, expected: str = PIER_VERSION) -> str:
    """The version Pier reports when it is `expected`; else PreflightError."""
    if reported != expected:
        raise PreflightError(
            f"Pier {reported or '(no version)'} is installed but sciencebench needs Pier {expected}: "
            f"install datacurve-pier=={expected}"
        )
    return reported


# --- fact gathering -----------------------------------------------------------

_pier_versions: dict[str, str] = {}
_pier_lock = threading.Lock()


def pier_version(pier_bin: str, timeout_sec: float = 180.0) -> str:
    """The version `pier_bin --version` prints; cached per process (it takes ~10 s).

    Runs with LITELLM_LOCAL_MODEL_COST_MAP=True (no price-table download).
    Raises PreflightError when Pier cannot be found, run, or gives no version.
    """
    resolved = shutil.which(pier_bin)
    if resolved is None:
        raise PreflightError(f"Pier is not installed: {pier_bin!r} is not an executable on PATH")
    with _pier_lock:
        cached = _pier_versions.get(resolved)
        if cached is not None:
            return cached
        if Path(resolved).parent == Path(sys.executable).parent:
            # Pier installed beside sciencebench: its metadata answers at once.
            try:
                version = importlib.metadata.version("datacurve-pier")
            except importlib.metadata.PackageNotFoundError:
                version = ""
            if parse_version(version) is not None:
                _pier_versions[resolved] = version
                return version
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
        try:
            result = subprocess.run(
                [resolved, "--version"], env=env, capture_output=True, text=True,
                timeout=timeout_sec, check=False, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise PreflightError(f"`{pier_bin} --version` did not finish within {timeout_sec:.0f}s") from None
        except OSError as exc:
            raise PreflightError(f"cannot run Pier ({resolved}): {exc.strerror}") from None
        lines = result.stdout.strip().splitlines()
        version = lines[-1].split()[-1] if lines else ""
        if result.returncode != 0 or parse_version(version) is None:
            detail = " ".join((result.stderr or result.stdout).split())[-300:]
            raise PreflightError(
                f"`{pier_bin} --version` failed (exit {result.returncode}): {detail or 'no output'}"
            )
        _pier_versions[resolved] = version
        return version


def check_jobs_dir(jobs_dir: Path) -> None:
    """Raise PreflightError unless a file can be created and removed in `jobs_dir`.

    Creates the directory (and parents) when missing.
    """
    try:
        jobs_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=jobs_dir, prefix=".sciencebench-preflight-")
        os.close(fd)
        Path(name).unlink()
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise PreflightError(f"jobs dir {jobs_dir} is not writable from this host: {reason}") from None


def check_host(
    platform: str = DEFAULT_PLATFORM, jobs_dir: Path | None = None, pier_bin: str = "pier"
) -> HostReport:
    """Check this host can run trials; a report of what it runs.

    In order: the Docker Engine answers and is >= 28.0, it runs `platform`,
    `docker compose` v2 is present, `pier_bin --version` is 0.3.0, and
    `jobs_dir` (when given) is writable. Raises PreflightError with one line
    naming the first problem and why it matters.
    """
    client = dockerhost.connect()
    try:
        facts = dockerhost.engine_facts(client)
    finally:
        client.close()
    check_engine_version(facts.server_version)
    check_platform(facts.os, facts.arch, platform)
    compose = check_compose(facts.compose_version, facts.compose_problem)
    pier = check_pier_version(pier_version(pier_bin))
    if jobs_dir is not None:
        check_jobs_dir(jobs_dir)
    return HostReport(
        engine_version=facts.server_version,
        api_version=facts.api_version,
        platform=facts.platform,
        compose_version=compose,
        pier_version=pier,
        jobs_dir=jobs_dir,
    )
