"""The store's key table (`coordination/keys.py`) and the keys `JobKeys` and `ClusterKeys` build agree."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from sciencebench.coordination import keys, scripts
from sciencebench.coordination.keys import ClusterKeys, JobKeys

pytestmark = pytest.mark.unit

# A table row: `#   sciencebench:...  what it holds`.
ROW = re.compile(r"^#\s+(sciencebench:\S+)\s", re.MULTILINE)
# What the table writes for a job, a trial key and the other names a key is built from.
NAMES = {"job": "J", "key": "K", "name": "<name>", "authority": "<authority>", "host": "<host>",
         "digest": "<digest>"}  # fmt: skip


def _built() -> set[str]:
    """Every key `JobKeys("J")` and `ClusterKeys` build, the table's placeholders for their arguments."""
    built: set[str] = set()
    job = JobKeys(NAMES["job"])
    for owner in (job, ClusterKeys):
        for name, value in inspect.getmembers(owner):
            if name.startswith("_") or name in ("job", "job_prefix", "pattern"):
                continue
            if isinstance(value, str):
                built.add(value)
            elif callable(value):
                (arg,) = inspect.signature(value).parameters
                built.add(value(NAMES[arg]))
    return built


def test_the_key_table_lists_exactly_the_keys_that_are_built() -> None:
    table = set(ROW.findall(Path(inspect.getfile(keys)).read_text(encoding="utf-8")))
    assert table == _built()


def test_every_key_a_script_takes_is_built_by_them() -> None:
    named = scripts.store_keys("J", "K", "<authority>", "<host>")
    assert set(named.values()) <= _built()
    assert JobKeys("J").pattern() == "sciencebench:J:*" and ClusterKeys.job_prefix == "sciencebench:"
