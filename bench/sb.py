"""Every `sciencebench.*` name the benchmark uses, in one place.

The package layout may move; when it does, only `_WHERE` below changes. Names
are imported on first use (PEP 562 module `__getattr__`), so importing this
module costs nothing and a process pays only for the sciencebench modules it
touches: the timed helper processes (`bench.stock_submit`, `bench.bare_dispatch`
through `bench.noop_app`) import exactly what they imported before.

    from bench.sb import create_app, Settings   # imports sciencebench.celery_app, .config
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sciencebench.celery_app import create_app
    from sciencebench.cli import _persist
    from sciencebench.config import Settings
    from sciencebench.coord import RedisCoordinator
    from sciencebench.demo import build_demo_selection
    from sciencebench.dispatch import dispatch
    from sciencebench.dockerhost import pull_counts, pull_log_path
    from sciencebench.network.environment import IsolatedDockerEnvironment
    from sciencebench.outcome import TrialRecord
    from sciencebench.paths import JobPaths
    from sciencebench.runrecord import build_run_record
    from sciencebench.submit import SubmitOptions, prepare
    from sciencebench.summary import write_summary
    from sciencebench.tasks import FINALIZE_JOB, RUN_TRIAL
    from sciencebench.trial import load_job

# name -> the module that defines it
_WHERE: dict[str, str] = {
    "create_app": "sciencebench.celery_app",
    "_persist": "sciencebench.cli",
    "Settings": "sciencebench.config",
    "RedisCoordinator": "sciencebench.coord",
    "build_demo_selection": "sciencebench.demo",
    "dispatch": "sciencebench.dispatch",
    "pull_counts": "sciencebench.dockerhost",
    "pull_log_path": "sciencebench.dockerhost",
    "IsolatedDockerEnvironment": "sciencebench.network.environment",
    "TrialRecord": "sciencebench.outcome",
    "JobPaths": "sciencebench.paths",
    "build_run_record": "sciencebench.runrecord",
    "SubmitOptions": "sciencebench.submit",
    "prepare": "sciencebench.submit",
    "write_summary": "sciencebench.summary",
    "FINALIZE_JOB": "sciencebench.tasks",
    "RUN_TRIAL": "sciencebench.tasks",
    "load_job": "sciencebench.trial",
}

__all__ = [
    "FINALIZE_JOB",
    "RUN_TRIAL",
    "IsolatedDockerEnvironment",
    "JobPaths",
    "RedisCoordinator",
    "Settings",
    "SubmitOptions",
    "TrialRecord",
    "_persist",
    "build_demo_selection",
    "build_run_record",
    "create_app",
    "dispatch",
    "import_path",
    "load_job",
    "prepare",
    "pull_counts",
    "pull_log_path",
    "write_summary",
]


def import_path(name: str) -> str:
    """`module:name` of one of the names above (how Pier and the docs spell a class)."""
    return f"{_WHERE[name]}:{name}"


def __getattr__(name: str) -> Any:
    """Import `name` from its sciencebench module on first use."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
