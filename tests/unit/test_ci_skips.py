"""tests/conftest.py: in CI a skipped test fails the run unless listed; failed tests are named for a rerun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SKIPPING = """
import pytest

pytestmark = pytest.mark.unit


def test_skips() -> None:
    pytest.skip("the service is not on this machine")


@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure() -> None:
    raise AssertionError
"""


def _run(tmp_path: Path, ci: str | None, **extra: str) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_skipping.py"
    test.write_text(SKIPPING)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": ci} if ci else {}) | extra
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest", "-c", os.devnull,
         "--rootdir", str(tmp_path), "-rA", str(test)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_skip_fails_in_ci(tmp_path: Path) -> None:
    run = _run(tmp_path, "true")
    assert run.returncode == 1, run.stdout
    assert "1 failed, 1 xfailed" in run.stdout
    assert "skipped in CI, and not on tests/conftest.py's MAY_SKIP_IN_CI" in run.stdout
    assert "the service is not on this machine" in run.stdout


def test_a_skip_is_a_skip_elsewhere(tmp_path: Path) -> None:
    run = _run(tmp_path, None)
    assert run.returncode == 0, run.stdout
    assert "1 skipped, 1 xfailed" in run.stdout


def test_the_failed_tests_are_named_for_scripts_test_sh(tmp_path: Path) -> None:
    failed = tmp_path / "failed"
    run = _run(tmp_path, "true", SCIENCEBENCH_FAILED_TESTS=str(failed))
    assert run.returncode == 1, run.stdout
    # Once per failed report (a test may fail in more than one phase): scripts/test.sh sorts them unique.
    assert set(failed.read_text().splitlines()) == {"test_skipping.py::test_skips"}
