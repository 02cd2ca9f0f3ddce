"""A job's files byte for byte: batch-run.json, Pier's result.json and config.json, summary.json and .csv.

`tests/fixtures/job_files.py` builds two pinned jobs (trial directories
holding result.json files Pier's own models wrote) and writes their files
as sciencebench does; `tests/fixtures/job_files/` keeps what an earlier run
wrote. A key moved, dropped or renamed, a number formatted otherwise or a
column reordered fails here; Pier's own models fix the key order of its files.
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import pytest
from pier.models.job.config import JobConfig
from pier.models.job.result import JobResult

from sciencebench.core.summary import MODEL_COLUMN, SUMMARY_COLUMNS
from tests.fixtures.job_files import FILES, GOLDEN, SECRET, kept_files, write_job_files

pytestmark = pytest.mark.unit

KEPT = kept_files()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Both jobs' files as the current code writes them."""
    return write_job_files(tmp_path_factory.mktemp("job-files"))


def test_both_jobs_are_kept() -> None:
    assert sorted(KEPT) == ["golden-codex", "golden-nop"]


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("job", sorted(KEPT))
def test_each_file_is_byte_for_byte_what_an_earlier_run_wrote(
    written: dict[str, dict[str, str]], job: str, name: str
) -> None:
    assert written[job][name] == KEPT[job][name]


def _number_or_name(key: str) -> str:
    """A reward value read back as a key (`1` and `1.0` alike: Pier reads both as the number)."""
    try:
        return repr(float(key))
    except ValueError:
        return key


def _key_paths(value: Any, prefix: str = "") -> list[str]:
    """Every key of a JSON value, depth first in file order (`stats.evals.<key>.n_trials`)."""
    paths = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, item in items:
        path = f"{prefix}{_number_or_name(str(key))}"
        paths += [path, *_key_paths(item, f"{path}.")]
    return paths


@pytest.mark.parametrize("job", sorted(KEPT))
def test_piers_files_have_the_keys_of_piers_models_in_their_order(
    written: dict[str, dict[str, str]], job: str
) -> None:
    result = json.loads(written[job]["result.json"])
    as_pier = JobResult.model_validate(result).model_dump(mode="json", exclude={"trial_results"})
    assert _key_paths(result) == _key_paths(as_pier)
    config = json.loads(written[job]["config.json"])
    assert _key_paths(config) == _key_paths(JobConfig.model_validate(config).model_dump(mode="json"))


def test_the_summary_has_the_original_runners_columns_then_the_model(
    written: dict[str, dict[str, str]],
) -> None:
    nop = written["golden-nop"]
    header = next(csv.reader(io.StringIO(nop["summary.csv"])))
    assert header == [*SUMMARY_COLUMNS, MODEL_COLUMN]  # two models
    assert next(csv.reader(io.StringIO(written["golden-codex"]["summary.csv"]))) == SUMMARY_COLUMNS
    summary = json.loads(nop["summary.json"])
    assert list(summary) == [
        "generated_at",
        "jobs_dir",
        "trial_count",
        "missing_trials",
        "flaky_tasks",
        "rows",
        "stats",
    ]
    assert all(list(row) == header for row in summary["rows"])
    # The CSV and the JSON say the same thing.
    rows = list(csv.DictReader(io.StringIO(nop["summary.csv"])))
    assert [{k: str(v) for k, v in row.items()} for row in summary["rows"]] == rows


def test_no_file_holds_a_secret(written: dict[str, dict[str, str]]) -> None:
    texts = [text for files in written.values() for text in files.values()]
    assert not [text for text in texts if SECRET in text]
    assert "<redacted>" in written["golden-codex"]["batch-run.json"]


def test_the_kept_files_are_what_the_fixture_module_writes() -> None:
    # Every kept file is one the test compares: none left over from an older layout.
    kept = sorted(p.relative_to(GOLDEN).as_posix() for p in GOLDEN.rglob("*") if p.is_file())
    assert kept == sorted(f"{job}/{name}" for job in KEPT for name in FILES)
