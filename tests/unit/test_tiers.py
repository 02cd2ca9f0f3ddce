"""tests/tiers.py: every module and test it names exists, so a rename cannot drop a test from a phase."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import tiers

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _exists(nodeid: str) -> bool:
    module, _, test = nodeid.partition("::")
    path = ROOT / module
    if not path.is_file():
        return False
    names = {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)}
    return not test or test in names


def test_every_named_module_and_test_exists() -> None:
    missing = [nodeid for nodeid in [*tiers.GROUPS, *tiers.ALONE] if not _exists(nodeid)]
    assert missing == []


def test_a_module_is_its_own_group_unless_joined() -> None:
    assert tiers.group_of("tests/integration/test_chord.py::test_x[a]") == "tests/integration/test_chord.py"
    real, provider = "tests/docker/test_real_agents.py", "tests/docker/test_provider_errors.py"
    assert tiers.group_of(f"{real}::t") == tiers.group_of(f"{provider}::t[codex]") != real


def test_alone_by_module_or_by_test() -> None:
    assert tiers.is_alone("tests/integration/test_placement.py::anything")
    capped = "tests/integration/test_fault_isolation.py::test_a_capped_job_does_not_hold_workers"
    assert tiers.is_alone(capped) and tiers.is_alone(f"{capped}[param]")
    assert not tiers.is_alone("tests/integration/test_fault_isolation.py::test_other")
