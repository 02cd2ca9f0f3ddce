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
    missing = [
        nodeid for nodeid in [*tiers.LONGEST_FIRST, *tiers.ALONE, *tiers.TOGETHER] if not _exists(nodeid)
    ]
    assert missing == []


def test_the_longest_modules_come_first_the_rest_as_collected() -> None:
    first, second = tiers.LONGEST_FIRST[:2]
    rest = ["tests/integration/test_chord.py::a", "tests/docker/test_e2e_pier.py::b"]
    ordered = sorted([*rest, f"{second}::c", f"{first}::d[x]"], key=tiers.order)
    assert ordered == [f"{first}::d[x]", f"{second}::c", *rest]


def test_alone_by_module_or_by_test() -> None:
    assert tiers.is_alone("tests/integration/test_placement.py::anything")
    capped = "tests/integration/test_fault_isolation.py::test_a_capped_job_does_not_hold_workers"
    assert tiers.is_alone(capped) and tiers.is_alone(f"{capped}[param]")
    assert not tiers.is_alone("tests/integration/test_fault_isolation.py::test_other")


def test_each_module_is_its_own_group_but_those_run_together() -> None:
    assert tiers.group("tests/integration/test_chord.py::a[x]") == "tests/integration/test_chord.py"
    together = [module for module, name in tiers.TOGETHER.items() if name == "real-agents"]
    assert len(together) == 2 and len({tiers.group(f"{module}::t") for module in together}) == 1
