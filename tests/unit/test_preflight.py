"""Preflight verdicts (pure) and the Pier/jobs-dir probes with stand-ins."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sciencebench.core import versions
from sciencebench.core.errors import PreflightError
from sciencebench.worker import preflight
from sciencebench.worker.pier import process

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("28.5.2", (28, 5, 2)),
        ("28.5.2+dfsg4", (28, 5, 2)),
        ("28.0.0-rc.1", (28, 0, 0)),
        ("v2.40.3-3", (2, 40, 3)),
        ("2.40.3-3", (2, 40, 3)),
        ("28.0", (28, 0, 0)),
        ("dev", None),
        ("", None),
    ],
)
def test_parse_version(text: str, parsed: tuple[int, int, int] | None) -> None:
    assert versions.parse_version(text) == parsed


@pytest.mark.parametrize("version", ["28.0.0", "28.5.2+dfsg4", "29.1.0", "28.0.0-rc.1"])
def test_engine_version_accepted(version: str) -> None:
    preflight.check_engine_version(version)


def test_engine_version_too_old_says_why() -> None:
    with pytest.raises(PreflightError) as err:
        preflight.check_engine_version("20.10.24")
    assert str(err.value) == (
        "Docker Engine 20.10.24 is too old: Engine >= 28.0 is required for isolated bridge gateway mode"
    )
    with pytest.raises(PreflightError, match=r"27\.5\.1 is too old"):
        preflight.check_engine_version("27.5.1")
    with pytest.raises(PreflightError, match="'dev', which is not a version number"):
        preflight.check_engine_version("dev")


def test_platform() -> None:
    preflight.check_platform("linux", "amd64", "linux/amd64")
    preflight.check_platform("linux", "arm64", "linux/arm64/v8")
    with pytest.raises(PreflightError) as err:
        preflight.check_platform("linux", "arm64", "linux/amd64")
    assert str(err.value) == (
        "Docker Engine runs linux/arm64 but the job needs linux/amd64: run this job on linux/amd64 hosts"
    )
    with pytest.raises(PreflightError, match="not of the form os/arch"):
        preflight.check_platform("linux", "amd64", "amd64")


def test_compose() -> None:
    assert preflight.check_compose("2.40.3-3", None) == "2.40.3-3"
    assert preflight.check_compose("v2.20.0", None) == "v2.20.0"
    with pytest.raises(PreflightError) as err:
        preflight.check_compose(None, "docker: 'compose' is not a docker command.")
    assert str(err.value) == (
        "docker compose v2 is required by Pier but unavailable: docker: 'compose' is not a docker command."
    )
    with pytest.raises(PreflightError, match=r"docker compose 1\.29\.2 is not v2 or later"):
        preflight.check_compose("1.29.2", None)


def test_pier_version_verdict() -> None:
    assert preflight.check_pier_version("0.3.0") == "0.3.0"
    with pytest.raises(PreflightError) as err:
        preflight.check_pier_version("0.2.9")
    assert str(err.value) == (
        "Pier 0.2.9 is installed but sciencebench needs Pier 0.3.0: install datacurve-pier==0.3.0"
    )


def _fake_pier(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "pier"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "_pier_versions", {})


def test_pier_version_is_run_once_with_local_cost_map(tmp_path: Path, fresh_cache: None) -> None:
    calls = tmp_path / "calls"
    pier = _fake_pier(tmp_path, f'echo "$LITELLM_LOCAL_MODEL_COST_MAP $1" >> {calls}\necho 0.3.0\n')
    assert process.pier_version(str(pier)) == "0.3.0"
    assert process.pier_version(str(pier)) == "0.3.0"
    assert calls.read_text() == "True --version\n"


def test_pier_version_failures(tmp_path: Path, fresh_cache: None) -> None:
    with pytest.raises(
        PreflightError, match="Pier is not installed: 'no-such-pier-bin' is not an executable"
    ):
        process.pier_version("no-such-pier-bin")
    broken = _fake_pier(tmp_path, "echo 'ModuleNotFoundError: No module named pier' >&2\nexit 1\n")
    with pytest.raises(PreflightError, match=r"--version` failed \(exit 1\): ModuleNotFoundError"):
        process.pier_version(str(broken))


def test_jobs_dir(tmp_path: Path) -> None:
    target = tmp_path / "new" / "jobs"
    preflight.check_jobs_dir(target)
    assert target.is_dir() and list(target.iterdir()) == []
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(PreflightError, match=f"jobs dir {blocker}/jobs is not writable from this host: "):
        preflight.check_jobs_dir(blocker / "jobs")


def test_report_lines() -> None:
    report = preflight.HostReport("28.5.2", "1.51", "linux/amd64", "2.40.3", "0.3.0", Path("/jobs"))
    assert report.lines() == [
        "Docker Engine 28.5.2 (API 1.51) on linux/amd64",
        "docker compose 2.40.3",
        "Pier 0.3.0",
        "jobs dir /jobs writable",
    ]
