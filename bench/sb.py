"""Every `sciencebench.*` name the benchmark uses, in one place.

The package layout may move; when it does, only `_WHERE` below changes. Names
are imported on first use (PEP 562 module `__getattr__`), so importing this
module costs nothing and a process pays only for the sciencebench modules it
touches: the timed helper processes (`bench.stock_submit`, `bench.bare_dispatch`
through `bench.noop_app`) import only what they use.

    from bench.sb import create_app, Settings   # imports coordination.celery_app, core.settings
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sciencebench.bake.command import bake_selection, default_artifacts
    from sciencebench.coordination.celery_app import create_app
    from sciencebench.coordination.protocol import HISTORY_KEY
    from sciencebench.coordination.redis import RedisCoordinator
    from sciencebench.core.models import TrialRecord
    from sciencebench.core.paths import JobPaths
    from sciencebench.core.settings import Settings
    from sciencebench.core.summary import write_summary
    from sciencebench.core.wire import FINALIZE_JOB, RUN_TRIAL
    from sciencebench.demo import build_demo_selection
    from sciencebench.login.cluster import Cluster
    from sciencebench.login.dispatch import dispatch
    from sciencebench.login.options import SubmitOptions
    from sciencebench.login.runrecord import build_run_record
    from sciencebench.login.submit import persist, prepare
    from sciencebench.network.environment import IsolatedDockerEnvironment
    from sciencebench.worker.context import load_job
    from sciencebench.worker.docker.images import pull_counts, pull_log_path

# name -> the module that defines it
_WHERE: dict[str, str] = {
    "create_app": "sciencebench.coordination.celery_app",
    "HISTORY_KEY": "sciencebench.coordination.protocol",
    "persist": "sciencebench.login.submit",
    "Settings": "sciencebench.core.settings",
    "RedisCoordinator": "sciencebench.coordination.redis",
    "build_demo_selection": "sciencebench.demo",
    "bake_selection": "sciencebench.bake.command",
    "default_artifacts": "sciencebench.bake.command",
    "dispatch": "sciencebench.login.dispatch",
    "Cluster": "sciencebench.login.cluster",
    "pull_counts": "sciencebench.worker.docker.images",
    "pull_log_path": "sciencebench.worker.docker.images",
    "IsolatedDockerEnvironment": "sciencebench.network.environment",
    "TrialRecord": "sciencebench.core.models",
    "JobPaths": "sciencebench.core.paths",
    "build_run_record": "sciencebench.login.runrecord",
    "SubmitOptions": "sciencebench.login.options",
    "prepare": "sciencebench.login.submit",
    "write_summary": "sciencebench.core.summary",
    "FINALIZE_JOB": "sciencebench.core.wire",
    "RUN_TRIAL": "sciencebench.core.wire",
    "load_job": "sciencebench.worker.context",
}

__all__ = [
    "FINALIZE_JOB",
    "HISTORY_KEY",
    "RUN_TRIAL",
    "Cluster",
    "IsolatedDockerEnvironment",
    "JobPaths",
    "RedisCoordinator",
    "Settings",
    "SubmitOptions",
    "TrialRecord",
    "bake_selection",
    "build_demo_selection",
    "build_run_record",
    "create_app",
    "default_artifacts",
    "dispatch",
    "import_path",
    "load_job",
    "persist",
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
