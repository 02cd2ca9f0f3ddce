"""The store's Lua files name their keys as `coordination.scripts` does, and ship in the package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sciencebench.coordination import scripts

pytestmark = pytest.mark.unit

HEADER = re.compile(r"^-- KEYS\[(\d+)\] (\w+)", re.MULTILINE)
USED = re.compile(r"KEYS\[(\d+)\]")


@pytest.mark.parametrize("script", scripts.ALL, ids=lambda s: s.name)
def test_a_scripts_header_names_its_keys_in_order(script: scripts.Script) -> None:
    text = (scripts.LUA / f"{script.name}.lua").read_text(encoding="utf-8")
    named = HEADER.findall(text)
    assert [int(i) for i, _ in named] == list(range(1, len(named) + 1))  # KEYS[1..n], no gap
    assert tuple(name for _, name in named) == script.keys
    assert {int(i) for i in USED.findall(text)} <= set(range(1, len(named) + 1))  # no unnamed key used
    assert set(script.keys) <= set(scripts.store_keys("J", "001#1"))  # each name has its Redis key


def test_every_lua_file_is_a_script_or_a_function_one_uses() -> None:
    lua = Path(str(scripts.LUA))
    assert {p.stem for p in lua.glob("*.lua")} == {s.name for s in scripts.ALL}
    assert {p.stem for p in (lua / "lib").glob("*.lua")} == {u for s in scripts.ALL for u in s.uses}


def test_a_call_passes_the_keys_in_the_scripts_order() -> None:
    assert scripts.FINISH.key_list("J", "001#1") == [
        "sciencebench:J:lease:001#1", "sciencebench:J:running", "sciencebench:J:slots",
    ]  # fmt: skip
