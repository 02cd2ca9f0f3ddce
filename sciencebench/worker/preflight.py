"""Is this worker host fit to run trials? One line why not.

The verdicts (`check_engine_version`, `check_platform`, `check_compose`,
`check_pier_version`) are pure; `check_host` gathers the facts (Docker through
`worker.docker.engine`, Pier through `worker.pier.process`, the jobs dir through the
filesystem) and applies them, failing on the first problem.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sciencebench.core.errors import PreflightError, PullError
from sciencebench.core.harness import PIER_VERSION
from sciencebench.core.images import DEFAULT_PLATFORM, check_image_ref, parse_platform
from sciencebench.core.settings import PROXY_IMAGE_ENV
from sciencebench.core.versions import parse_version
from sciencebench.worker.docker import engine
from sciencebench.worker.docker.images import ensure_kit_image
from sciencebench.worker.pier.process import pier_version

MIN_ENGINE = (28, 0)
MIN_COMPOSE_MAJOR = 2


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
    wanted = parse_platform(platform)
    if wanted is None:
        raise PreflightError(f"platform {platform!r} is not of the form os/arch")
    if (engine_os.lower(), engine_arch.lower()) != (wanted.os, wanted.arch):
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


def check_jobs_dir(jobs_dir: Path) -> None:
    """Raise PreflightError unless a file can be created and removed in `jobs_dir`.

    Creates the directory (and parents) when missing.
    """
    _check_writable(
        jobs_dir, ".sciencebench-preflight-", f"jobs dir {jobs_dir} is not writable from this host"
    )


def check_state_dir(state_dir: Path) -> None:
    """Raise PreflightError unless the host state dir (pull locks, live-trial locks) takes a file."""
    _check_writable(state_dir, ".preflight-", f"host state dir {state_dir} is not writable")


def _check_writable(directory: Path, prefix: str, refusal: str) -> None:
    """Create `directory` when missing, then create and remove a file in it; `refusal: <why>` otherwise."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=directory, prefix=prefix)
        os.close(fd)
        Path(name).unlink()
    except OSError as exc:
        raise PreflightError(f"{refusal}: {exc.strerror or exc.__class__.__name__}") from None


def check_host(
    platform: str | None = DEFAULT_PLATFORM,
    jobs_dir: Path | None = None,
    pier_bin: str = "pier",
    state_dir: Path | None = None,
) -> HostReport:
    """Check this host can run trials; a report of what it runs.

    In order: the Docker Engine answers and is >= 28.0, it runs `platform`
    (when given), `docker compose` v2 is present, `pier_bin --version` is
    0.3.0, and `jobs_dir` and `state_dir` (when given) are writable. Raises
    PreflightError with one line naming the first problem and why it matters.
    """
    client = engine.connect()
    try:
        facts = engine.engine_facts(client)
    finally:
        client.close()
    check_engine_version(facts.server_version)
    if platform is not None:
        check_platform(facts.os, facts.arch, platform)
    compose = check_compose(facts.compose_version, facts.compose_problem)
    pier = check_pier_version(pier_version(pier_bin))
    if jobs_dir is not None:
        check_jobs_dir(jobs_dir)
    if state_dir is not None:
        check_state_dir(state_dir)
    return HostReport(
        engine_version=facts.server_version,
        api_version=facts.api_version,
        platform=facts.platform,
        compose_version=compose,
        pier_version=pier,
        jobs_dir=jobs_dir,
    )


def check_proxy_ref(ref: str) -> str:
    """The proxy image ref when it is set and pinned by digest; else PreflightError (one line)."""
    if not ref.strip():
        raise PreflightError(
            f"{PROXY_IMAGE_ENV} is unset: model-agent trials need the digest-pinned inference-proxy image "
            "(workers/proxy, built offline by compose/build.yml; docs/deployment.md)"
        )
    try:
        return check_image_ref(ref)
    except ValueError as exc:
        raise PreflightError(f"{PROXY_IMAGE_ENV}: {exc}") from None


def ensure_proxy_image(ref: str) -> str:
    """Make the pinned proxy image present on this host's engine (pulled by digest when missing).

    It is the worker's own kit, not a task image: never in the pull log, so
    no image budget evicts it. Returns one line for a report; raises
    PreflightError naming the ref when it is unset, unpinned or cannot be had.
    """
    check_proxy_ref(ref)
    try:
        pulled = ensure_kit_image(ref)
    except PullError as exc:
        raise PreflightError(f"{PROXY_IMAGE_ENV}: {exc}") from None
    return f"proxy image {ref} {'pulled' if pulled else 'present'}"
