"""Trial keys: one parser and formatter (`core.keys.TrialKey`), and no other module splits them."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sciencebench.core.keys import TrialKey
from sciencebench.core.wire import trial_shadow
from tests.fixtures.source import package_nodes

pytestmark = pytest.mark.unit


def test_a_key_is_its_task_id_and_attempt() -> None:
    key = TrialKey("002", 3)
    assert str(key) == "002#3"
    assert key.label == "task_002 #3"
    assert key.task_name == "task_002#3"
    assert TrialKey.parse("002#3") == key == ("002", 3)
    assert trial_shadow("j", "002", 3) == "trial j/task_002#3"


@settings(max_examples=40)
@given(st.from_regex(r"[0-9]{1,4}", fullmatch=True), st.integers(min_value=1, max_value=10_000))
def test_parse_reads_back_what_str_wrote(task_id: str, attempt: int) -> None:
    assert TrialKey.parse(str(TrialKey(task_id, attempt))) == (task_id, attempt)


@pytest.mark.parametrize("bad", ["", "002", "#1", "002#", "002#x", "002#-1"])
def test_parse_refuses_what_is_not_a_key(bad: str) -> None:
    with pytest.raises(ValueError, match="not a trial key"):
        TrialKey.parse(bad)


def test_no_other_module_splits_a_key_by_hand() -> None:
    """No `partition("#")`, `split("#")` or `replace("#", ...)` outside core/keys.py."""
    spelled = [
        f"{module}:{getattr(node, 'lineno', '?')}"
        for module, nodes in package_nodes().items()
        if module != "sciencebench/core/keys.py"
        for node in nodes
        if isinstance(node, ast.Call)
        and any(isinstance(a, ast.Constant) and a.value == "#" for a in node.args)
    ]
    assert spelled == []
