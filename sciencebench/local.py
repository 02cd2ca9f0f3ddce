"""Embedded mode: the same trials in this process, no broker.

`--n-concurrent` threads each run `trial.execute` (the code a Celery worker
runs) against an in-process coordinator; `summary.write_summary` (the code
the chord finalizer runs) writes the same three files.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from sciencebench.coordination.memory import MemoryCoordinator
from sciencebench.core.models import TrialRecord
from sciencebench.core.settings import Settings
from sciencebench.core.summary import write_summary
from sciencebench.login.submit import Prepared
from sciencebench.worker.context import WorkerContext, docker_runtime
from sciencebench.worker.trial import execute


def run_local(prepared: Prepared, settings: Settings, console: Console) -> dict[str, Any]:
    """Run every trial with `n_concurrent` threads; return finalizer counts."""
    job = prepared.job
    ctx = WorkerContext(coord=MemoryCoordinator(), runtime=docker_runtime(settings), settings=settings)
    ctx.runtime.preflight(job)
    failed = 0
    with (
        Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}  failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            console=console,
        ) as bar,  # fmt: skip
        ThreadPoolExecutor(max_workers=job.n_concurrent, thread_name_prefix="trial") as pool,
    ):
        progress = bar.add_task(job.job_name, total=len(prepared.trials), failed=0)
        futures = [pool.submit(execute, trial, ctx, None) for trial in prepared.trials]
        for future in futures:
            record: TrialRecord | None = future.result()
            failed += bool(record is None or record.errored)
            bar.update(progress, advance=1, failed=failed)
    result = write_summary(job)
    return {
        "job_name": job.job_name,
        "n_total_trials": result["n_total_trials"],
        "n_errored_trials": result["stats"]["n_errored_trials"],
    }
