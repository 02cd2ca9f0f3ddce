"""The scripted gateway's fault markers: a tagged fault recovers apart from the same mode under other tags.

Several jobs share one gateway in `tests/docker/test_provider_errors.py`; each
recovers its own trials' faults while the others' still fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.model_gateway import Gateway

pytestmark = pytest.mark.unit


def gateway(tmp_path: Path) -> tuple[Gateway, Path]:
    flag = tmp_path / "recovered"
    return Gateway({"key_sha256": "0" * 64, "recovered_flag": str(flag)}), flag


def test_a_tagged_fault_recovers_alone(tmp_path: Path) -> None:
    gw, flag = gateway(tmp_path)
    codex, claude, plain = "[gw-fault:429@codex]", "[gw-fault:429@claude-code]", "[gw-fault:429]"
    assert [gw.fault_for(c, 0) for c in (codex, claude, plain)] == ["429", "429", "429"]
    Path(f"{flag}-429@codex").touch()
    assert [gw.fault_for(c, 0) for c in (codex, claude, plain)] == [None, "429", "429"]
    Path(f"{flag}-429").touch()  # the untagged mode's flag ends only the untagged markers
    assert [gw.fault_for(c, 0) for c in (codex, claude, plain)] == [None, "429", None]
    flag.touch()  # the gateway recovered: every fault is over
    assert gw.fault_for(claude, 0) is None


def test_tagged_modes_keep_their_meaning(tmp_path: Path) -> None:
    gw, flag = gateway(tmp_path)
    after = "[gw-fault:429-after-1@mini-swe-agent]"
    assert (gw.fault_for(after, 0), gw.fault_for(after, 1)) == (None, "429")
    sticky = "[gw-fault:500-sticky@codex]"
    flag.touch()
    Path(f"{flag}-500@codex").touch()
    assert gw.fault_for(sticky, 0) == "500"  # a sticky fault never recovers
    assert gw.fault_for("no marker here", 3) is None
