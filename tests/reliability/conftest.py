"""Reliability tier: the fixtures of the integration and docker tiers, reused.

Importing a fixture function into a conftest registers it for this directory
(pytest collects fixtures from a conftest module's namespace). Session-scoped
fixtures of `tests/conftest.py` (`redis_server`, `state_dir`, `base_image`)
are shared with every other tier as they are.

The figures the tests measure are collected in `FIGURES` and printed at the
end of the run; with SCIENCEBENCH_RELIABILITY_REPORT=<file> they are also
written there as JSON (docs/reliability.md is filled from that file).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.docker.conftest import demo_selection, docker_client, registry  # noqa: F401
from tests.fixtures.engines import engines, kit_image, published  # noqa: F401  (one Engine per host)
from tests.integration.conftest import Cluster, cluster  # noqa: F401
from tests.reliability.support import FIGURES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FIGURES:
        return
    terminalreporter.section("reliability figures")
    for name, value in FIGURES.items():
        terminalreporter.write_line(f"{name}: {json.dumps(value, default=str)}")
    target = os.environ.get("SCIENCEBENCH_RELIABILITY_REPORT")
    if target:
        Path(target).write_text(json.dumps(FIGURES, indent=2, default=str) + "\n")
        terminalreporter.write_line(f"written to {target}")
