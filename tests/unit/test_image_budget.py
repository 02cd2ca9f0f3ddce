"""The image budget's pure parts: sizes as operators write them, and the hold on a trial's images."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest

from sciencebench.core.errors import SettingsError
from sciencebench.core.settings import Settings
from sciencebench.core.sizes import format_size, parse_size
from sciencebench.worker.docker import budget, imageholds, images

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
    lock = tmp_path / imageholds.IMAGES_DIR / f"{DIGEST.split(':')[1]}.lock"
    with imageholds.hold_images([REF, REF], tmp_path):
        assert lock.is_file()
        assert not _exclusive_possible(lock)  # what an eviction in another process tries
        with imageholds.hold_images([REF], tmp_path):  # another trial of the host needs it too: shared
            assert not _exclusive_possible(lock)
    assert _exclusive_possible(lock)


def test_holding_stamps_the_last_use(tmp_path: Path) -> None:
    lock = tmp_path / imageholds.IMAGES_DIR / f"{DIGEST.split(':')[1]}.lock"
    with imageholds.hold_images([REF], tmp_path):
        pass
    os.utime(lock, (1_000, 1_000))
    with imageholds.hold_images([REF], tmp_path):
        pass
    assert lock.stat().st_mtime > 1_000_000


class _Usage:
    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def raise_for_status(self) -> None:
        pass

    def json(self) -> dict[str, Any]:
        return {"BuildCache": self.records}


class _Api:
    base_url, api_version = "http+docker://localhost", "1.51"

    def __init__(self, dangling: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
        self.dangling, self.records = dangling, records
        self.asked: list[Any] = []

    def images(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        self.asked.append(filters)
        return self.dangling

    def get(self, url: str, params: dict[str, str]) -> _Usage:
        assert url.endswith("/v1.51/system/df") and params == {"type": "build-cache"}
        return _Usage(self.records)


def test_build_leftovers_are_nameless_build_images_and_unshared_cache_never_a_pinned_image() -> None:
    pinned = {"Id": "sha256:p", "Size": 9, "RepoTags": [], "RepoDigests": [REF]}
    api = _Api(
        dangling=[
            {"Id": "sha256:old", "Size": 5, "RepoTags": [], "RepoDigests": []},
            {
                "Id": "sha256:older",
                "Size": 7,
                "RepoTags": ["<none>:<none>"],
                "RepoDigests": ["<none>@<none>"],
            },
            pinned,  # a task image built by compose and pulled by digest: dangling to the Engine, not to us
        ],
        records=[{"Size": 3, "Shared": False}, {"Size": 11, "Shared": True}, {"Size": 2, "Shared": False}],
    )
    found = budget.build_leftovers(SimpleNamespace(api=api))  # type: ignore[arg-type]
    assert found.images == [("sha256:old", 5), ("sha256:older", 7)]
    assert found.cache == 5 and found.size == 17  # what an image shares is counted with the image
    assert api.asked == [{"dangling": True, "label": budget.COMPOSE_PROJECT_LABEL}]  # compose builds only


def test_pulled_sizes_are_each_digest_s_last_pull_of_known_size(tmp_path: Path) -> None:
    other = "sha256:" + "cd" * 32
    entries: list[dict[str, Any]] = [
        {"ref": REF, "digest": DIGEST, "size": 5},
        {"ref": REF, "digest": DIGEST, "size": 7},  # pulled again after an eviction: the last pull counts
        {"event": "evicted", "ref": REF, "digest": DIGEST, "size": 99, "reason": "over the budget"},
        {"ref": REF, "digest": DIGEST, "size": 0},  # its size could not be read: the one before stands
        {"ref": "x", "digest": other, "size": 3},
        {"event": "pruned", "ref": "build cache", "digest": "", "size": 11, "reason": "over the budget"},
    ]
    assert budget.pulled_sizes(entries) == {DIGEST: 7, other: 3}
    assert budget.pulled_sizes([]) == {}
    log_path = tmp_path / "pulls.jsonl"
    log_path.write_text("".join(json.dumps(entry) + "\n" for entry in entries), encoding="utf-8")
    never = f"127.0.0.1:5555/sciencebench-test/y@sha256:{'ef' * 32}"
    assert budget.expected_sizes([REF, never], log_path) == {REF: 7, never: 0}
    assert budget.expected_sizes([REF], tmp_path / "absent.jsonl") == {REF: 0}


class _AbsentImages:
    def get(self, name: str) -> Any:
        raise docker.errors.ImageNotFound(f"no such image: {name}")


def test_the_pull_lock_ensure_images_holds_is_a_pull_in_progress_to_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = SimpleNamespace(images=_AbsentImages())
    puller = images.ImagePuller(state=tmp_path, client_factory=lambda: client, image_budget=1 << 30)
    sizes = {DIGEST: 123}
    seen: list[int] = []

    def pull(client: Any, ref: str, platform: str, mine: list[str]) -> None:
        seen.append(puller.budget._pulling_elsewhere(sizes, set()))  # another trial's round, meanwhile
        assert puller.budget._pulling_elsewhere(sizes, {DIGEST}) == 0  # the caller's own: skipped

    monkeypatch.setattr(puller, "_pull_within_budget", pull)
    assert puller.budget._pulling_elsewhere(sizes, set()) == 0  # no lock file yet: nobody pulls it
    [status] = puller.ensure_images([REF], "linux/amd64", skip_pull=False)
    assert status.pulled and seen == [123]
    assert imageholds.pull_lock_path(tmp_path, DIGEST).is_file()  # the one path both use
    assert puller.budget._pulling_elsewhere(sizes, set()) == 0  # the pull is over: its lock is free


def test_a_symlink_at_a_pull_lock_is_no_pull_and_its_target_is_never_opened(tmp_path: Path) -> None:
    lock = imageholds.pull_lock_path(tmp_path, DIGEST)
    lock.parent.mkdir(parents=True)
    target = tmp_path / "elsewhere.lock"
    target.touch()
    lock.symlink_to(target)
    dangling = imageholds.pull_lock_path(tmp_path, "sha256:" + "cd" * 32)
    dangling.symlink_to(tmp_path / "never-created")
    image_budget = budget.ImageBudget(1 << 30, tmp_path, tmp_path / "pulls.jsonl")
    fd = os.open(target, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # followed, the symlink would be a pull in progress
        sizes = {DIGEST: 123, "sha256:" + "cd" * 32: 45}
        assert image_budget._pulling_elsewhere(sizes, set()) == 0
    finally:
        os.close(fd)
    assert not (tmp_path / "never-created").exists()
