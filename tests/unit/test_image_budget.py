"""The image budget's pure parts: sizes as operators write them, and the hold on a trial's images."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from sciencebench.core.errors import SettingsError
from sciencebench.core.settings import Settings
from sciencebench.core.sizes import format_size, parse_size
from sciencebench.worker.docker import budget

pytestmark = pytest.mark.unit

DIGEST = "sha256:" + "ab" * 32
REF = f"127.0.0.1:5555/sciencebench-test/x@{DIGEST}"


@pytest.mark.parametrize(
    ("text", "size"),
    [("0", 0), ("1000", 1000), ("512M", 512 << 20), ("50G", 50 << 30), ("1.5GiB", 3 << 29), ("2 t", 2 << 40),
     ("64kb", 64 << 10)],
)  # fmt: skip
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "-1G", "12Q", "1e9", "one"])
def test_parse_size_refuses_what_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


def test_format_size() -> None:
    assert [format_size(n) for n in (512, 3 << 19, 5 << 30)] == ["512 B", "1.5 MiB", "5.0 GiB"]


def test_the_budget_setting_takes_sizes_and_refuses_others() -> None:
    assert Settings.from_env({"SCIENCEBENCH_IMAGE_BUDGET": "20G"}).image_budget == 20 << 30
    assert Settings.from_env({}).image_budget == 0
    with pytest.raises(SettingsError, match="SCIENCEBENCH_IMAGE_BUDGET"):
        Settings.from_env({"SCIENCEBENCH_IMAGE_BUDGET": "lots"})


def _exclusive_possible(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_a_held_image_cannot_be_taken_for_eviction_and_is_free_after(tmp_path: Path) -> None:
    lock = tmp_path / budget.IMAGES_DIR / f"{DIGEST.split(':')[1]}.lock"
    with budget.hold_images([REF, REF], tmp_path):
        assert lock.is_file()
        assert not _exclusive_possible(lock)  # what an eviction in another process tries
        with budget.hold_images([REF], tmp_path):  # another trial of the host needs it too: shared
            assert not _exclusive_possible(lock)
    assert _exclusive_possible(lock)


def test_holding_stamps_the_last_use(tmp_path: Path) -> None:
    lock = tmp_path / budget.IMAGES_DIR / f"{DIGEST.split(':')[1]}.lock"
    with budget.hold_images([REF], tmp_path):
        pass
    os.utime(lock, (1_000, 1_000))
    with budget.hold_images([REF], tmp_path):
        pass
    assert lock.stat().st_mtime > 1_000_000
