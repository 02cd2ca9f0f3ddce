"""Embedded mode: the same trials in this process, no broker.

Like a worker's start, it first removes what crashed trials of this host
state left on the Engine (`worker.runtime.sweep_crashed`).

`--n-concurrent` threads each run `worker.trial.handle` (a Celery worker's
code) on the host's embedded store (`coordination.embedded`) as the job's only
worker (it serves exactly the job's directories and runs the submit's
`--pier-bin`); `coordination.records.finish_job` (the chord finalizer's code)
writes the same three files.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from sciencebench.coordination import embedded
from sciencebench.coordination.keys import JobKeys
from sciencebench.coordination.models import Room
from sciencebench.coordination.protocol import Coordinator
from sciencebench.coordination.records import FinalizerAnswer, finish_job
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.models import JobSpec, TrialSpec
from sciencebench.core.paths import JobPaths
from sciencebench.core.settings import Settings
from sciencebench.login.retry import continue_budget
from sciencebench.worker.context import WorkerContext, docker_runtime
from sciencebench.worker.dispatch import EMBEDDED
from sciencebench.worker.runtime import sweep_crashed
from sciencebench.worker.trial import Answer, handle


def local_settings(settings: Settings, job: JobSpec) -> Settings:
    """This process as the job's only worker: it serves exactly the job's directories and runs its Pier."""
    env_file_roots = (job.env_file.path.parent,) if job.env_file else ()
    return settings.model_copy(
        update={
            "pier_bin": job.pier_bin,
            "jobs_roots": (job.jobs_dir,),
            "selection_roots": (job.selection_path,),
            "env_file_roots": env_file_roots,
        }
    )


def run_local(
    job: JobSpec,
    trials: list[TrialSpec],
    settings: Settings,
    console: Console,
    *,
    again: bool = False,
    limits: tuple[float | None, int | None] = (None, None),
) -> FinalizerAnswer:
    """Run `trials` of `job` with `n_concurrent` threads; return what the finalizer would answer.

    `again`: the job ran here before (the same submit again, `retry --failed`):
    its budget continues (`limits` replace the job's), its earlier run's
    records and leases of these trials go.
    """
    settings = local_settings(settings, job)
    coord = embedded.coordinator(settings.state_dir)
    try:
        return _run(job, trials, settings, console, coord, again, limits)
    finally:
        coord.close()


def _run(job: JobSpec, trials: list[TrialSpec], settings: Settings, console: Console, coord: RedisCoordinator,
         again: bool, limits: tuple[float | None, int | None]) -> FinalizerAnswer:  # fmt: skip
    if again:  # the spend of the trials kept counts
        coord.uncancel(job.job_key)  # an interrupted run, or `cancel`, cancelled it
        if note := continue_budget(coord, job, *limits):
            console.print(note, markup=False, highlight=False)
        _run_afresh(coord, job, [trial.key for trial in trials], settings.hostname)
    elif job.max_cost_usd is not None or job.max_tokens is not None:
        coord.set_budget(job.job_key, job.max_cost_usd, job.max_tokens)
    ctx = WorkerContext(coord=coord, runtime=docker_runtime(settings, coord), settings=settings)
    ctx.runtime.check_host()
    if swept := sweep_crashed(settings):
        console.print(swept, markup=False, highlight=False)
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
        progress = bar.add_task(job.job_name, total=len(trials), failed=0)
        futures = [pool.submit(handle, trial, ctx, EMBEDDED) for trial in trials]
        try:
            for future in futures:
                outcome = future.result()
                failed += not isinstance(outcome, Answer) or outcome.record.errored
                bar.update(progress, advance=1, failed=failed)
        except KeyboardInterrupt:
            _stop(coord, job, pool, futures, console)
            raise
    return finish_job(coord, JobPaths(job.jobs_dir, job.job_name), job.job_name, job.job_id)


def _run_afresh(coord: RedisCoordinator, job: JobSpec, keys: list[str], host: str) -> None:
    """The trials to run again start afresh: the embedded store outlives an interrupted run.

    Its records of them go (a cancelled trial's, say). What a killed run held
    of any trial of the job goes too, which would stay until it lapses: the
    leases, the slots and the parts of this host's capacity (`Slots.free_room`).
    A run killed between a trial's record and its end leaves them to a trial
    that does not run again. This process is the job's only worker.
    """
    job_keys = JobKeys(job.job_key)
    for key in keys:
        coord.clear_result(job.job_key, key)
    every = job.trial_keys()
    coord.patiently(lambda: coord.client.delete(*map(job_keys.lease, every)))
    coord.patiently(lambda: coord.client.zrem(job_keys.slots, *every))
    for key in every:
        coord.free_room(host, Room.member_of(job.job_key, key))


def _stop(coord: Coordinator, job: JobSpec, pool: ThreadPoolExecutor, futures: list[Future[Any]],
          console: Console) -> None:  # fmt: skip
    """Ctrl-C: no trial starts any more, the running ones end as cancelled (their records kept).

    The same submit again continues the job: it runs the cancelled trials and
    those never started. A second Ctrl-C leaves at once.
    """
    coord.cancel(job.job_key)
    pool.shutdown(wait=False, cancel_futures=True)
    running = [f for f in futures if not f.done()]
    line = (f"interrupted: stopping {len(running)} running trial(s) (Ctrl-C again leaves at once); the same "
            "command continues the job")  # fmt: skip
    console.print(line, markup=False, highlight=False, soft_wrap=True)
    wait(running)


def running_here(job: JobSpec, settings: Settings) -> bool:
    """Whether a run of the local job holds a trial's lease in the store (a killed run's lapse).

    False where the embedded store is not running (no run of the job is
    alive then): nothing is started to find out.
    """
    if not embedded.is_running(settings.state_dir):
        return False
    coord = embedded.coordinator(settings.state_dir)
    try:
        leases = [JobKeys(job.job_key).lease(key) for key in job.trial_keys()]
        return bool(coord.patiently(lambda: coord.client.exists(*leases)))
    finally:
        coord.close()
