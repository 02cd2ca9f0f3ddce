"""How scripts/test.sh runs the tiers after unit: side by side where tests share nothing, else alone.

The second phase runs integration, reliability and docker tests on four
pytest-xdist workers, a module to a worker (`--dist loadfile`: its
module-scoped fixtures, workers and images are made once; `TOGETHER`'s
modules, which share a worker session's costly fixtures, go to one worker,
tests/conftest.py's scheduler), the longest modules first (`LONGEST_FIRST`), so
that none of them starts last. The third
phase runs `ALONE` one at a time, with nothing beside them: tests that
measure time against a bound, or look at the whole host (its network
devices), where a neighbour would change the answer.
"""

from __future__ import annotations

# The modules that take longest beside others (seconds in a full run of the second phase), longest
# first: handed out before the rest.
LONGEST_FIRST = (
    "tests/docker/test_real_agents.py",  # the agents baked, 9 real-agent tests: ~400
    "tests/docker/test_provider_errors.py",  # 17 real-agent trials with faults, on the same bake: ~350
    "tests/docker/test_cluster.py",  # worker containers from compose/: ~400
    "tests/reliability/test_worker_kills.py",  # ~130
    "tests/docker/test_build_network.py",  # ~160
    "tests/reliability/test_real_pier.py",  # the 24-trial soak and its audits: ~150
    "tests/docker/test_online_install.py",  # ~80
    "tests/docker/test_hostile_outputs.py",  # ~110
    "tests/docker/test_trial_limits.py",  # a disk fill on a real worker, two tasks raising memory: ~90
    "tests/integration/test_registry_pushback.py",  # two hosts' Engines, a 20-s registry wait: ~60
    "tests/docker/test_pier_memory.py",  # a real worker's two jobs, two submit --local trials: ~65
)

# Modules that run on one xdist worker, one after the other: the provider-error jobs run on the agent
# images the real-agent module baked into that worker's demo selection (on another worker they baked
# all three agents again, beside the first bake: the phase's largest CPU cost twice).
TOGETHER = {
    "tests/docker/test_real_agents.py": "real-agents",
    "tests/docker/test_provider_errors.py": "real-agents",
}

# Modules (or single tests) that run in the last phase, one at a time, with nothing beside them.
_FAULTS = "tests/integration/test_fault_isolation.py::"
_LIMITS = "tests/docker/test_trial_limits.py::"
ALONE = {
    "tests/integration/test_placement.py": "placed makespan within 1.10 x pulling everywhere",
    "tests/integration/test_fair_share.py": "a second user's wait against the first user's trial times",
    f"{_FAULTS}test_a_capped_job_does_not_hold_workers": "took < 12 s",
    f"{_FAULTS}test_a_host_that_cannot_see_the_jobs_dir_hands_trials_back": "its good host paused meanwhile",
    f"{_FAULTS}test_missing_records_fail_summarize_and_retry_sends_only_them": "retry while a 3-s trial runs",
    "tests/integration/test_live_numbers.py": "the ETA within 1.5 x the trials' sleep",
    f"{_LIMITS}test_a_fork_bomb_and_a_memory_hog_stop_beside_a_neighbour": (
        "a fork bomb and a memory hog beside a neighbour trial, its time measured: nothing else beside them"
    ),
    "tests/integration/test_engines.py::test_a_private_engine_leaves_the_session_engines_bridge_alone": (
        "compares the host's network devices before and after"
    ),
    "tests/reliability/test_count_window.py": "a lost count recovered within 6 leases + 10 s",
    "tests/reliability/test_placement_faults.py": "a broker restart and a killed host within submit's 180 s",
}


def order(nodeid: str) -> int:
    """Where a test's module comes in the second phase: `LONGEST_FIRST`'s, then the rest as collected."""
    module = nodeid.split("::", 1)[0]
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


def is_alone(nodeid: str) -> bool:
    """Whether a test runs in the last phase, alone."""
    test = nodeid.partition("[")[0]  # every parametrization of a test named there
    return test in ALONE or test.split("::", 1)[0] in ALONE


def group(nodeid: str) -> str:
    """The unit a worker takes in the second phase: the test's module, or its `TOGETHER` group."""
    module = nodeid.split("::", 1)[0]
    return TOGETHER.get(module, module)
