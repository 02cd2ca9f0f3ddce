"""selection.py: which tasks a submit runs, in which order, and their hash."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from sciencebench.core.errors import InputError, SelectionError, TaskSpecError
from sciencebench.login.selection import load_selection, parse_task_id_filter, selection_sha256
from tests.fixtures.selection import (
    DEFAULT_AGENT_IMAGE,
    DEFAULT_VERIFIER_IMAGE,
    make_selection,
    make_task,
)

pytestmark = pytest.mark.unit

# sha256(json.dumps({"task_ids": ["002", "005"]}, sort_keys=True)), computed once
# with the original runner's formula and pinned here.
SHA_002_005 = "0bf1341706f5de2f6c82676ff391855b9dd606e4c435484e0eff1dbee3516810"


def original_hash(ids: list[str]) -> str:
    """The original runner's formula, written out independently of sciencebench."""
    return hashlib.sha256(json.dumps({"task_ids": ids}, sort_keys=True).encode()).hexdigest()


# --- where the ids come from -------------------------------------------------


def test_ids_come_from_selection_json_in_listed_order(tmp_path: Path) -> None:
    path = make_selection(tmp_path / "sel", ["007", "002", "005"])
    selection = load_selection(path)
    assert selection.task_ids == ["007", "002", "005"]
    assert selection.allow_restricted_licenses is False


def test_selection_json_can_list_fewer_ids_than_directories(tmp_path: Path) -> None:
    path = make_selection(tmp_path / "sel", ["002", "005", "006"], listed_ids=["006", "002"])
    assert load_selection(path).task_ids == ["006", "002"]


def test_allow_restricted_licenses_is_read_from_selection_json(tmp_path: Path) -> None:
    path = make_selection(tmp_path / "sel", ["002"], allow_restricted_licenses=True)
    assert load_selection(path).allow_restricted_licenses is True


def test_without_selection_json_ids_are_directory_names_sorted(tmp_path: Path) -> None:
    path = make_selection(tmp_path / "sel", ["101", "002", "010"], selection_json=False)
    # Not task directories: ignored.
    (path / "notes").mkdir()
    (path / "task_12").mkdir()
    (path / "task_abc").mkdir()
    (path / "task_003.txt").write_text("not a directory")
    selection = load_selection(path)
    assert selection.task_ids == ["002", "010", "101"]
    assert selection.allow_restricted_licenses is None  # the selection says nothing: null, as the original
    assert sorted(selection.tasks) == ["002", "010", "101"]
    assert selection.tasks["010"].name == "task_010"


def test_selection_path_is_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_selection(tmp_path / "sel", ["002"])
    monkeypatch.chdir(tmp_path)
    selection = load_selection(Path("sel"))
    assert selection.path == (tmp_path / "sel").resolve()
    assert selection.path.is_absolute()


# --- --task-id -----------------------------------------------------------------


def test_task_id_filter_single_and_inclusive_ranges() -> None:
    assert parse_task_id_filter("002,005-007") == ["002", "005", "006", "007"]
    assert parse_task_id_filter("010-010") == ["010"]
    assert parse_task_id_filter(" 002 , 004 ") == ["002", "004"]


def test_task_id_filter_keeps_the_width_of_the_token() -> None:
    assert parse_task_id_filter("098-101") == ["098", "099", "100", "101"]
    assert parse_task_id_filter("8-10") == ["8", "9", "10"]
    assert parse_task_id_filter("0009-0011") == ["0009", "0010", "0011"]


def test_task_id_filter_drops_duplicates_keeping_first_position() -> None:
    assert parse_task_id_filter("005,002-005,002") == ["005", "002", "003", "004"]


@pytest.mark.parametrize(
    "text",
    ["", ",", "002,", "002,,005", "abc", "002-", "-005", "002-005-007", "002:005", "2.5", "task_002", "0x10"],
)
def test_task_id_filter_bad_syntax_is_a_selection_error(text: str) -> None:
    with pytest.raises(SelectionError, match="--task-id"):
        parse_task_id_filter(text)


def test_task_id_filter_descending_range_is_refused() -> None:
    with pytest.raises(SelectionError, match="descending range '007-005'"):
        parse_task_id_filter("002,007-005")


def test_task_id_filter_with_an_absurd_number_is_an_input_error_not_a_crash() -> None:
    # int() refuses strings of more than 4300 digits with a ValueError, which
    # would escape the CLI as a traceback.
    with pytest.raises(SelectionError):
        parse_task_id_filter("1-" + "9" * 5000)


def test_task_id_filter_with_a_huge_range_fails_fast() -> None:
    # A typo such as 002-2000000000 must not build a list of two billion ids.
    started = time.monotonic()
    with pytest.raises(SelectionError):
        parse_task_id_filter("002-2000000000")
    assert time.monotonic() - started < 1.0


def test_task_id_filter_narrows_in_selection_order(tmp_path: Path) -> None:
    path = make_selection(tmp_path / "sel", ["007", "002", "005", "006"])
    selection = load_selection(path, "005-007,002")
    assert selection.task_ids == ["007", "002", "005", "006"]
    selection = load_selection(path, "006,002")
    assert selection.task_ids == ["002", "006"]
    assert sorted(selection.tasks) == ["002", "006"]


def test_task_id_filter_unknown_id(tmp_path: Path) -> None:
    path = make_selection(tmp_path / "sel", ["002", "005"])
    with pytest.raises(SelectionError, match="unknown task id 003"):
        load_selection(path, "002-003")


def test_task_id_filter_width_matters(tmp_path: Path) -> None:
    path = make_selection(tmp_path / "sel", ["002"])
    with pytest.raises(SelectionError, match="unknown task id 2 "):
        load_selection(path, "2")


def test_task_id_filter_only_checks_named_tasks(tmp_path: Path) -> None:
    # A broken task outside the filter does not stop a run of the others.
    path = make_selection(tmp_path / "sel", ["002", "005"])
    (path / "task_005" / "pre_artifacts.sh").unlink()
    assert load_selection(path, "002").task_ids == ["002"]
    with pytest.raises(TaskSpecError, match=r"pre_artifacts\.sh"):
        load_selection(path)


# --- unusable paths --------------------------------------------------------------


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(SelectionError, match="no such directory"):
        load_selection(tmp_path / "nope")


def test_path_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(SelectionError, match="not a directory"):
        load_selection(file)


def test_not_a_selection_directory(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "README.md").write_text("hello")
    with pytest.raises(SelectionError, match="not a materialized selection"):
        load_selection(tmp_path)


def test_empty_selection_json(tmp_path: Path) -> None:
    make_selection(tmp_path, ["002"], listed_ids=[])
    with pytest.raises(SelectionError, match="not a materialized selection"):
        load_selection(tmp_path)


def test_listed_id_without_directory(tmp_path: Path) -> None:
    path = make_selection(tmp_path / "sel", ["002"], listed_ids=["002", "005"])
    with pytest.raises(SelectionError, match=r"task 005 is listed but task_005/ is missing"):
        load_selection(path)


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{",
        "[]",
        '{"task_ids": "002"}',
        '{"task_ids": [2]}',
        '{"allow_restricted_licenses": "maybe", "task_ids": ["002"]}',
        '{"allow_restricted_licenses": false}',
    ],
)
def test_unusable_selection_json(tmp_path: Path, content: str) -> None:
    make_selection(tmp_path, ["002"], selection_json=False)
    (tmp_path / "selection.json").write_text(content)
    with pytest.raises(SelectionError, match=r"selection\.json: unusable"):
        load_selection(tmp_path)


@pytest.mark.parametrize("bad_id", ["002/", "002/.", "../sel/task_002", "2", "abc", "002 ", "٠٠٢"])
def test_listed_ids_must_be_task_numbers(tmp_path: Path, bad_id: str) -> None:
    # "002/" and "002/." name the real task_002 directory, and would then flow
    # into trial names and record file names.
    path = make_selection(tmp_path / "sel", ["002"], listed_ids=[bad_id])
    with pytest.raises(SelectionError, match="is not a number"):
        load_selection(path)


def test_duplicate_listed_ids_are_refused(tmp_path: Path) -> None:
    path = make_selection(tmp_path / "sel", ["002"], listed_ids=["002", "002"])
    with pytest.raises(InputError, match="duplicate"):
        load_selection(path)


# --- hash --------------------------------------------------------------------------


def test_selection_hash_pinned_value() -> None:
    assert selection_sha256(["002", "005"]) == SHA_002_005
    assert original_hash(["002", "005"]) == SHA_002_005


@pytest.mark.parametrize(
    "ids", [["002"], ["002", "005", "006", "007"], ["101", "002"], [f"{i:03d}" for i in range(2, 102)]]
)
def test_selection_hash_matches_the_original_formula(ids: list[str]) -> None:
    assert selection_sha256(ids) == original_hash(ids)


def test_selection_hash_depends_on_order() -> None:
    assert selection_sha256(["005", "002"]) != SHA_002_005


def test_selection_sha256_of_a_loaded_selection(tmp_path: Path) -> None:
    path = make_selection(tmp_path / "sel", ["002", "005", "006"])
    assert load_selection(path, "002,005").sha256 == SHA_002_005
    assert load_selection(path).sha256 == original_hash(["002", "005", "006"])


# --- images --------------------------------------------------------------------


def test_image_refs_deduplicated_in_first_use_order(tmp_path: Path) -> None:
    shared_verifier = DEFAULT_VERIFIER_IMAGE
    other_agent = "docker.io/example/agent-b:v2@sha256:" + "c3" * 32
    path = make_selection(
        tmp_path / "sel",
        ["005", "002", "003"],
        agent_image={"005": other_agent},
        verifier_image={"005": shared_verifier, "003": shared_verifier},
    )
    selection = load_selection(path)
    # 005 -> other_agent, shared_verifier; 002 -> default agent; 003 -> (both seen).
    assert selection.image_refs == [other_agent, shared_verifier, DEFAULT_AGENT_IMAGE]


def test_image_refs_of_a_shared_mode_selection(tmp_path: Path) -> None:
    path = make_selection(tmp_path / "sel", ["002", "005"])
    assert load_selection(path).image_refs == [DEFAULT_AGENT_IMAGE]


def test_tasks_keep_their_own_specs(tmp_path: Path) -> None:
    make_task(tmp_path, "002", agent_timeout_sec=5400.0)
    make_task(tmp_path, "005", agent_timeout_sec=60.0)
    selection = load_selection(tmp_path)
    assert selection.tasks["002"].agent_timeout_sec == 5400.0
    assert selection.tasks["005"].agent_timeout_sec == 60.0
    assert selection.tasks["002"].directory == (tmp_path / "task_002").resolve()
