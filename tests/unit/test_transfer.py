"""The strict extractor and tar builder (`network.extract`, `network.tarbuild`), over tars made here.

Each hostile member (a link, a hard link, a device, a FIFO, `..`, an
absolute name, a setuid bit, an over-large file, a link already on the host
side) is refused and named, and nothing is written through it. The last test
pins the file-transfer methods of Pier 0.3.0's environments: a Pier upgrade
that adds one fails here until the policy environment covers it.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pier.environments.base import BaseEnvironment
from pier.environments.docker.docker import DockerEnvironment

from sciencebench.core.errors import TransferRefused
from sciencebench.core.piertrial import TRANSFER_REFUSALS as TRANSFER_REFUSALS_NAME
from sciencebench.network.environment import IsolatedDockerEnvironment
from sciencebench.network.extract import extract, extract_file
from sciencebench.network.refusals import record_refusals
from sciencebench.network.tarbuild import build_tar
from sciencebench.network.transfer import ChunkReader, Refusal, open_dir, trial_relative
from sciencebench.worker.pier.layout import TRANSFER_REFUSED, read_transfer_refusals, read_trial_outcome

pytestmark = pytest.mark.unit


def _member(
    name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **fields: object
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    buffer.seek(0)
    return buffer


@pytest.fixture
def dest(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    target = tmp_path / "trial" / "artifacts"
    target.mkdir(parents=True)
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    yield target, fd
    os.close(fd)


def _reasons(result_refusals: list[object]) -> str:
    return "\n".join(str(r) for r in result_refusals)


def test_regular_files_and_directories_are_written_and_the_prefix_stripped(dest: tuple[Path, int]) -> None:
    target, fd = dest
    stream = _tar(
        _member("artifacts", tarfile.DIRTYPE),
        _member("artifacts/sub", tarfile.DIRTYPE),
        _member("artifacts/sub/a.txt", data=b"alpha"),
        _member("artifacts/run.sh", data=b"#!/bin/sh\n", mode=0o700),
    )
    result = extract(stream, fd, strip="artifacts")
    assert result.refusals == [] and result.files == 2 and result.bytes == 15
    assert (target / "sub" / "a.txt").read_bytes() == b"alpha"
    assert stat.S_IMODE((target / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "sub" / "a.txt").stat().st_mode) == 0o644


def test_links_devices_fifos_are_refused_and_named(dest: tuple[Path, int], tmp_path: Path) -> None:
    target, fd = dest
    stream = _tar(
        _member("artifacts", tarfile.DIRTYPE),
        _member("artifacts/model.patch", tarfile.SYMTYPE, linkname=str(tmp_path)),
        _member("artifacts/a", data=b"one"),
        _member("artifacts/b", tarfile.LNKTYPE, linkname="artifacts/a"),
        _member("artifacts/null", tarfile.CHRTYPE, devmajor=1, devminor=3),
        _member("artifacts/disk", tarfile.BLKTYPE, devmajor=8, devminor=0),
        _member("artifacts/fifo", tarfile.FIFOTYPE),
    )
    result = extract(stream, fd, strip="artifacts")
    text = _reasons(result.refusals)
    expected = ("model.patch: symbolic link", "b: hard link", "null: character device", "disk: block device")
    for item in (*expected, "fifo: FIFO"):
        assert item in text, text
    assert sorted(os.listdir(target)) == ["a"]


def test_absolute_names_and_dotdot_are_refused(dest: tuple[Path, int], tmp_path: Path) -> None:
    _, fd = dest
    stream = _tar(
        _member("/etc/passwd", data=b"x"),
        _member("../escape.txt", data=b"x"),
        _member("sub/../../escape.txt", data=b"x"),
    )
    result = extract(stream, fd)
    text = _reasons(result.refusals)
    assert "/etc/passwd: absolute name" in text and text.count("name with '..'") == 2, text
    assert not (tmp_path / "trial" / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()


def test_setuid_setgid_sticky_bits_are_masked(dest: tuple[Path, int]) -> None:
    target, fd = dest
    stream = _tar(
        _member("suid", data=b"x", mode=0o6755),
        _member("sticky", tarfile.DIRTYPE, mode=0o1777),
    )
    assert extract(stream, fd).refusals == []
    assert stat.S_IMODE((target / "suid").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "sticky").stat().st_mode) == 0o755


def test_the_size_bound_stops_extraction(dest: tuple[Path, int]) -> None:
    target, fd = dest
    stream = _tar(_member("a", data=b"x" * 600), _member("b", data=b"y" * 600), _member("c", data=b"z"))
    result = extract(stream, fd, max_bytes=1000)
    assert "b: over the 1000 byte bound" in _reasons(result.refusals)
    assert sorted(os.listdir(target)) == ["a"]


def test_the_member_count_bound_stops_extraction(dest: tuple[Path, int]) -> None:
    target, fd = dest
    stream = _tar(*[_member(f"f{i}", data=b"x") for i in range(5)])
    result = extract(stream, fd, max_members=3)
    assert "more than 3 members" in _reasons(result.refusals)
    assert len(os.listdir(target)) == 3


def test_an_existing_host_symlink_in_the_target_path_is_never_followed(
    dest: tuple[Path, int], tmp_path: Path
) -> None:
    target, fd = dest
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (target / "dir").symlink_to(outside)
    (target / "file").symlink_to(victim)
    stream = _tar(_member("dir/planted.txt", data=b"evil"), _member("file", data=b"evil"))
    result = extract(stream, fd)
    text = _reasons(result.refusals)
    assert "dir/planted.txt: host path refused (ELOOP)" in text or "ENOTDIR" in text, text
    assert "file: host path refused (ELOOP)" in text, text
    assert os.listdir(outside) == [] and victim.read_text() == "keep"


def test_an_existing_hard_linked_host_file_is_not_truncated(dest: tuple[Path, int], tmp_path: Path) -> None:
    target, fd = dest
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.link(victim, target / "file")
    result = extract(_tar(_member("file", data=b"evil")), fd)
    assert "file: host path refused" in _reasons(result.refusals)
    assert victim.read_text() == "keep"


def test_open_dir_refuses_a_link_on_the_way(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError):
            open_dir(root, ["link", "new"])
        assert not (tmp_path / "real" / "new").exists()
    finally:
        os.close(root)


def test_archived_path_that_is_a_link_is_refused_whole(dest: tuple[Path, int]) -> None:
    _, fd = dest
    with pytest.raises(TransferRefused, match="artifacts: symbolic link"):
        extract(_tar(_member("artifacts", tarfile.SYMTYPE, linkname="/etc")), fd, strip="artifacts")


def test_extract_file_writes_exactly_one_regular_file(dest: tuple[Path, int]) -> None:
    target, fd = dest
    extract_file(_tar(_member("oracle.txt", data=b"out")), fd, "copy.txt")
    assert (target / "copy.txt").read_bytes() == b"out"
    with pytest.raises(TransferRefused, match="symbolic link"):
        extract_file(_tar(_member("x", tarfile.SYMTYPE, linkname="/etc/passwd")), fd, "x")
    with pytest.raises(TransferRefused, match="FIFO"):
        extract_file(_tar(_member("x", tarfile.FIFOTYPE)), fd, "x")
    with pytest.raises(TransferRefused, match="byte bound"):
        extract_file(_tar(_member("x", data=b"12345")), fd, "x", max_bytes=4)
    assert not os.path.lexists(target / "x")


def test_chunk_reader_streams_an_archive_in_pieces(dest: tuple[Path, int]) -> None:
    target, fd = dest
    data = _tar(_member("a", data=b"q" * 5000)).getvalue()
    chunks = [data[i : i + 7] for i in range(0, len(data), 7)]
    extract(io.BufferedReader(ChunkReader(chunks)), fd)
    assert (target / "a").read_bytes() == b"q" * 5000


def test_trial_relative_keeps_downloads_in_the_trial_log_directories(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    trial.mkdir()
    assert trial_relative(trial, trial / "artifacts" / "model.patch") == ["artifacts", "model.patch"]
    for target in (tmp_path / "elsewhere", trial, trial / "result.json", trial / "agent" / ".." / ".." / "x"):
        with pytest.raises(TransferRefused):
            trial_relative(trial, target)


def test_build_tar_skips_links_and_special_files_and_masks_modes(tmp_path: Path) -> None:
    source = tmp_path / "artifacts"
    (source / "sub").mkdir(parents=True)
    (source / "model.patch").write_text("diff")
    (source / "tool").write_text("#!/bin/sh\n")
    (source / "tool").chmod(0o4755)
    (source / "sub" / "x").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("canary")
    (source / "linked").symlink_to(outside)
    (source / "linked-file").symlink_to(outside / "canary.txt")
    os.mkfifo(source / "fifo")
    archive, result = build_tar(source, ["logs", "artifacts"])
    with archive, tarfile.open(fileobj=archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["logs", "logs/artifacts", "logs/artifacts/model.patch", "logs/artifacts/sub",
                               "logs/artifacts/sub/x", "logs/artifacts/tool"]  # fmt: skip
    assert members["logs/artifacts/tool"].mode == 0o755 and members["logs/artifacts/tool"].uid == 0
    text = _reasons(result.refusals)
    assert (
        "linked: symbolic link" in text and "linked-file: symbolic link" in text and "fifo: special" in text
    )


def test_build_tar_refuses_a_source_that_is_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(TransferRefused):
        build_tar(tmp_path / "link")
    (tmp_path / "f").write_text("x")
    (tmp_path / "flink").symlink_to(tmp_path / "f")
    with pytest.raises(TransferRefused):
        build_tar(tmp_path / "flink", file_name="f")
    (tmp_path / "real" / "a").write_text("ab")
    with pytest.raises(TransferRefused, match="byte bound"):
        build_tar(tmp_path / "real", max_bytes=1)


def test_refusals_reach_the_trial_record(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "result.json").write_text('{"verifier_result": {"rewards": {"reward": 1.0}}}')
    record_refusals(
        trial,
        "download",
        "/logs/artifacts",
        str(trial / "artifacts"),
        [Refusal("model.patch", "symbolic link")],
    )
    record_refusals(trial, "download", "/logs/agent", str(trial / "agent"), [Refusal("fifo", "FIFO")])
    assert len(read_transfer_refusals(trial)) == 2
    outcome = read_trial_outcome(trial)
    assert outcome.exception_type == TRANSFER_REFUSED and outcome.rewards == {"reward": 1.0}
    assert outcome.exception_message is not None and "model.patch: symbolic link" in outcome.exception_message


def test_the_refusals_file_is_not_written_through_a_link(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    trial.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (trial / "transfer-refusals.json").symlink_to(victim)
    with pytest.raises(OSError):
        record_refusals(trial, "download", "/x", "y", [Refusal("a", "b")])
    assert victim.read_text() == "keep"


# Pier 0.3.0's file-transfer surface. The policy environment overrides each one; a Pier
# upgrade that adds or renames one fails this test until it is covered and added here.
PIER_TRANSFER_METHODS = {
    "download_dir", "download_dir_with_exclusions", "download_file", "prepare_logs_for_host",
    "upload_dir", "upload_file", "_chown_to_host_user", "_default_log_mounts", "_write_mounts_compose_file",
}  # fmt: skip
# Pier calls it only when there are mounts: the policy environment has none (tested below).
NOT_CALLED_WITHOUT_MOUNTS = {"_write_mounts_compose_file"}
_TRANSFER_WORDS = ("upload", "download", "mount", "chown", "logs_for_host", "copy", "archive", "transfer")


def test_every_pier_file_transfer_method_is_overridden() -> None:
    names = {
        name
        for cls in (BaseEnvironment, DockerEnvironment)
        for name, _ in inspect.getmembers(cls, inspect.isfunction)
        if any(word in name for word in _TRANSFER_WORDS) and name in vars(cls)
    }
    assert names == PIER_TRANSFER_METHODS
    for name in names - NOT_CALLED_WITHOUT_MOUNTS:
        # Defined by the policy environment's own classes (its layers), not inherited from Pier.
        owner = next(cls for cls in IsolatedDockerEnvironment.__mro__ if name in vars(cls))
        assert owner.__module__.startswith("sciencebench.network."), (name, owner)


def test_the_policy_environment_mounts_nothing_even_when_pier_passes_mounts(tmp_path: Path) -> None:
    from tests.unit.test_network_environment import make_env

    verifier_mount = {
        "type": "bind",
        "source": str(tmp_path / "trial" / "verifier"),
        "target": "/logs/verifier",
    }
    for kwargs in ({}, {"mounts_json": [verifier_mount]}):
        env = make_env(tmp_path, allowlist=None, **kwargs)
        assert env._mounts_json == [] and env._default_log_mounts() == []
        assert env.capabilities.mounted is False and env.capabilities.disable_internet is True


def test_refusals_come_first_in_a_message_pier_already_wrote(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    trial.mkdir()
    pier_error = {
        "exception_type": "RewardFileNotFoundError",
        "exception_message": "No reward file " + "x" * 3000,
    }
    (trial / "result.json").write_text(json.dumps({"exception_info": pier_error}))
    record_refusals(trial, "download", "/logs/verifier", "verifier", [Refusal("reward.txt", "symbolic link")])
    outcome = read_trial_outcome(trial)
    assert outcome.exception_type == "RewardFileNotFoundError"  # Pier's type is kept (not retried)
    assert outcome.exception_message is not None and len(outcome.exception_message) == 2000
    assert outcome.exception_message.startswith("host-side transfer refused 1 item(s)")
    assert "reward.txt: symbolic link" in outcome.exception_message


def test_a_trial_without_refusals_reads_as_before(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "result.json").write_text('{"verifier_result": {"rewards": {"reward": 0.5}}}')
    outcome = read_trial_outcome(trial)
    assert outcome.exception_type is None and outcome.exception_message is None
    assert outcome.transfer_refusals == () and outcome.rewards == {"reward": 0.5}


def test_a_symlinked_refusals_file_is_not_read_by_the_worker(tmp_path: Path) -> None:
    """The worker reads `transfer-refusals.json` through no link: a planted one names nothing."""
    trial = tmp_path / "trial"
    trial.mkdir()
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"refusals": [{"direction": "download", "source": "/x", "reason": "r"}]}))
    (trial / TRANSFER_REFUSALS_NAME).symlink_to(planted)
    assert read_transfer_refusals(trial) == ()
    (trial / TRANSFER_REFUSALS_NAME).unlink()
    os.mkfifo(trial / TRANSFER_REFUSALS_NAME)  # a FIFO neither blocks the reader nor counts
    assert read_transfer_refusals(trial) == ()
    (trial / TRANSFER_REFUSALS_NAME).unlink()
    linked = tmp_path / "linked-trial"
    linked.symlink_to(trial)  # nor is a trial directory followed
    record_refusals(trial, "download", "/logs/agent", str(trial / "agent"), [Refusal("fifo", "FIFO")])
    assert len(read_transfer_refusals(trial)) == 1
    assert read_transfer_refusals(linked) == ()
