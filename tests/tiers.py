"""How scripts/test.sh runs the tiers after unit: side by side where tests share nothing, else alone.

The second phase runs integration, reliability and docker tests on several
pytest-xdist workers (`--dist loadscope`, whose scope tests/conftest.py makes
`group_of`). Each test module is one group (its module-scoped fixtures,
workers, images are made once, on one xdist worker); `GROUPS` joins modules
that share a session fixture, so it is made once.
The third phase runs `ALONE` one at a time, with nothing beside them: tests
that measure time against a bound, and tests that act on the whole Engine
(its image store, its networks) where a neighbour would change the answer.
"""

from __future__ import annotations

# Modules that share an expensive session fixture: one xdist group each.
GROUPS = {
    # The agents baked into the demo's image (`baked`, tests/docker/conftest.py): once per session.
    "tests/docker/test_real_agents.py": "baked-agents",
    "tests/docker/test_provider_errors.py": "baked-agents",
}

# Modules (or single tests) that run in the last phase, one at a time, with nothing beside them.
ALONE = {
    "tests/integration/test_placement.py": "placed makespan within 1.10 x pulling everywhere",
    "tests/integration/test_fair_share.py": "a second user's wait against the first user's trial times",
    "tests/integration/test_fault_isolation.py::test_a_capped_job_does_not_hold_workers": "took < 12 s",
    "tests/integration/test_live_numbers.py": "the ETA within 1.5 x the trials' sleep",
    "tests/reliability/test_count_window.py": "a lost count recovered within 6 leases + 10 s",
}


def group_of(nodeid: str) -> str:
    """The xdist group of a test: its module's, or the shared one `GROUPS` names."""
    module = nodeid.split("::", 1)[0]
    return GROUPS.get(module, module)


def is_alone(nodeid: str) -> bool:
    """Whether a test runs in the last phase, alone."""
    test = nodeid.partition("[")[0]  # every parametrization of a test named there
    return test in ALONE or test.split("::", 1)[0] in ALONE
