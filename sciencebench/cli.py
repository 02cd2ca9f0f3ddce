"""The command line: parse, call the library, turn known errors into one line.

Exit codes: 0 success; 1 a job finished with errored trials (or a runtime
failure); 2 bad input, with nothing written and nothing enqueued.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from sciencebench import __version__
from sciencebench.core.errors import InputError, SciencebenchError
from sciencebench.core.models import JobSpec
from sciencebench.core.paths import JobPaths
from sciencebench.core.settings import Settings
from sciencebench.login import options
from sciencebench.login.options import SubmitOptions

err = Console(stderr=True, highlight=False)
out = Console(highlight=False)


def _fail(message: str, code: int) -> NoReturn:
    err.print(f"sciencebench: error: {message}", markup=False, soft_wrap=True)
    sys.exit(code)


def _handle_errors[**P, R](fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            _fail(str(exc), 2)
        except SciencebenchError as exc:
            _fail(str(exc), 1)
        except KeyboardInterrupt:
            _fail("interrupted", 130)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="sciencebench")
def main() -> None:
    """Run SWE-bench-science task selections with Pier across worker hosts.

    `submit` validates a materialized selection and sends one Celery task per
    trial (task x attempt) to the Redis broker; workers run Pier; a chord
    finalizer writes result.json, summary.json and summary.csv. Broker:
    SCIENCEBENCH_BROKER_URL (default redis://localhost:6379/0).
    """


@main.command()
@options.click_options
@click.option("--local", is_flag=True,
              help="Run in this process with --n-concurrent slots; no broker needed.")  # fmt: skip
@click.option("--wait", is_flag=True, help="Follow the job with a live progress bar until it ends.")
@_handle_errors
def submit(local: bool, wait: bool, **raw: Any) -> None:
    """Validate a selection and run every trial (task x attempt) of it.

    Exits 0 when every trial finished without error, 1 when any errored
    (with --wait or --local), 2 on bad input (nothing written or enqueued).
    """
    run_submit(options.from_cli(raw), local=local, wait=wait)


def run_submit(opts: SubmitOptions, *, local: bool, wait: bool) -> None:
    """`submit`: validate, record, then run here (`local`) or dispatch (and follow with `wait`).

    Exits the process with the job's exit code when it waited for the job.
    """
    from sciencebench.login import submit as submitting
    from sciencebench.login.runrecord import build_run_record, write_run_record

    settings = Settings.from_env()
    prepared = submitting.prepare(opts, None if local else settings.visibility_timeout_sec)
    broker = "embedded (in-process)" if local else settings.broker_url
    record = build_run_record(prepared.job, prepared.trials[0], broker, prepared.secret_values)

    if opts.dry_run:
        write_run_record(opts.path, record, prepared.secret_values)
        out.print(f"dry run: {len(prepared.trials)} trial(s) of {len(prepared.selection.task_ids)} "
                  f"task(s); selection sha256 {prepared.selection.sha256}", soft_wrap=True)  # fmt: skip
        out.print("pier command: " + " ".join(record["pier_command"]), markup=False, soft_wrap=True)
        out.print(f"run record: {opts.path / 'batch-run.json'}")
        if not (local or opts.skip_pull):
            _prewarm(settings, prepared.job, err)
        return

    if local:
        from sciencebench.local import run_local

        prepared = _persist(prepared, record)
        summary = run_local(prepared, settings, out)
        _print_summary(JobPaths(prepared.job.jobs_dir, prepared.job.job_name))
        sys.exit(1 if summary["n_errored_trials"] else 0)

    from sciencebench.coordination.celery_app import create_app
    from sciencebench.coordination.redis import RedisCoordinator
    from sciencebench.login.dispatch import dispatch
    from sciencebench.login.follow import follow

    coord = RedisCoordinator(settings.broker_url)
    coord.ping()
    prepared = _persist(prepared, record)
    app = create_app(settings)
    final = dispatch(app, coord, prepared.job, prepared.trials)
    job = prepared.job
    out.print(f"submitted job [bold]{job.job_name}[/]: {len(prepared.trials)} trial(s) -> {job.job_dir}")
    out.print(f"follow it:  sciencebench status {job.job_name} --jobs-dir {job.jobs_dir}")
    if wait:
        answer = follow(coord, job, [t.key for t in prepared.trials], final, err)
        _print_summary(JobPaths(job.jobs_dir, job.job_name))
        sys.exit(1 if answer["n_errored_trials"] else 0)


def _prewarm(settings: Settings, job: JobSpec, console: Console) -> None:
    """With a reachable broker, every live worker host pulls the job's images."""
    from sciencebench.coordination.celery_app import create_app
    from sciencebench.coordination.redis import RedisCoordinator
    from sciencebench.core.errors import BrokerUnavailableError
    from sciencebench.login.prewarm import prewarm

    try:
        RedisCoordinator(settings.broker_url).ping()
    except BrokerUnavailableError:
        console.print("pre-warm: broker not reachable; images not pulled")
        return
    prewarm(create_app(settings), job.image_refs, job.platform, console)


def _persist(prepared: Any, record: dict[str, Any]) -> Any:
    """Write what workers read (job.json, --agent-env file) and the run record."""
    from sciencebench.login import submit as submitting
    from sciencebench.login.runrecord import write_run_record

    prepared = submitting.write_agent_env_file(prepared)
    submitting.write_job_spec(prepared.job)
    write_run_record(prepared.selection.path, record, prepared.secret_values)
    return prepared


def _print_summary(paths: JobPaths) -> None:
    summary = json.loads(paths.summary_json.read_text(encoding="utf-8"))
    table = Table(title=f"{paths.job_name}: {summary['trial_count']} trial(s)")
    for column in ("task_id", "trial_id", "reward", "failure_class"):
        table.add_column(column)
    for row in summary["rows"]:
        table.add_row(*(str(row[c]) for c in ("task_id", "trial_id", "reward", "failure_class")))
    out.print(table)
    out.print(f"results: {paths.summary_csv}")


def _job_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--jobs-dir", type=click.Path(path_type=Path), default=Path("jobs"),
                      show_default=True, help="Directory holding the job.")(fn)  # fmt: skip
    return click.argument("job_name")(fn)


def _load(jobs_dir: Path, job_name: str) -> JobSpec:
    from sciencebench.core.errors import SelectionError

    paths = JobPaths(jobs_dir.resolve(), job_name)
    if not paths.job_spec.is_file():
        raise SelectionError(f"no job {job_name!r} in {jobs_dir}")
    return JobSpec.model_validate_json(paths.job_spec.read_bytes())


@main.command()
@_job_option
@_handle_errors
def status(job_name: str, jobs_dir: Path) -> None:
    """Show a job's counts and each trial's state and host."""
    from sciencebench.coordination.redis import RedisCoordinator

    job = _load(jobs_dir, job_name)
    coord = RedisCoordinator(Settings.from_env().broker_url)
    coord.ping()
    states = coord.states(job.job_name)
    table = Table(title=f"job {job.job_name}" + ("  (cancelled)" if coord.is_cancelled(job.job_name) else ""))
    for column in ("trial", "state", "host"):
        table.add_column(column)
    counts: dict[str, int] = {}
    for task_id in job.task_ids:
        for attempt in range(1, job.n_attempts + 1):
            status = states.get(f"{task_id}#{attempt}")
            state = str(status.state) if status else "unknown"
            counts[state] = counts.get(state, 0) + 1
            table.add_row(f"task_{task_id} #{attempt}", state, status.host if status else "")
    out.print(table)
    out.print("  ".join(f"{state} {n}" for state, n in sorted(counts.items())))


@main.command()
@_job_option
@_handle_errors
def cancel(job_name: str, jobs_dir: Path) -> None:
    """Cancel a job: queued trials end at once, running Pier processes are stopped."""
    from sciencebench.coordination.redis import RedisCoordinator

    job = _load(jobs_dir, job_name)
    coord = RedisCoordinator(Settings.from_env().broker_url)
    coord.ping()
    coord.cancel(job.job_name)
    out.print(f"job {job.job_name} cancelled; the finalizer writes its summary once trials stop")


@main.command()
@_job_option
@click.option("--failed", is_flag=True, required=True, help="Re-run only the errored trials.")
@click.option("--wait", is_flag=True, help="Follow the retry until it ends.")
@_handle_errors
def retry(job_name: str, jobs_dir: Path, failed: bool, wait: bool) -> None:
    """Re-run a job's errored trials into the same job directory."""
    from sciencebench.coordination.celery_app import create_app
    from sciencebench.coordination.redis import RedisCoordinator
    from sciencebench.login.dispatch import dispatch
    from sciencebench.login.follow import follow
    from sciencebench.login.retry import failed_trials

    job = _load(jobs_dir, job_name)
    settings = Settings.from_env()
    coord = RedisCoordinator(settings.broker_url)
    coord.ping()
    trials = failed_trials(job)
    if not trials:
        out.print(f"job {job.job_name}: no errored trials")
        return
    coord.uncancel(job.job_name)
    for trial in trials:
        coord.clear_result(job.job_name, trial.key)
    final = dispatch(create_app(settings), coord, job, trials)
    out.print(f"job {job.job_name}: {len(trials)} errored trial(s) sent again")
    if wait:
        answer = follow(coord, job, [t.key for t in trials], final, err)
        _print_summary(JobPaths(job.jobs_dir, job.job_name))
        sys.exit(1 if answer["n_errored_trials"] else 0)


@main.command()
@click.option("--jobs-dir", type=click.Path(path_type=Path), default=Path("jobs"), show_default=True)
@click.option("--job-name", required=True, help="The job to summarize.")
@_handle_errors
def summarize(jobs_dir: Path, job_name: str) -> None:
    """Rebuild result.json, summary.json and summary.csv from disk alone."""
    from sciencebench.core.summary import write_summary

    job = _load(jobs_dir, job_name)
    result = write_summary(job)
    _print_summary(JobPaths(job.jobs_dir, job.job_name))
    sys.exit(1 if result["stats"]["n_errored_trials"] else 0)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--concurrency", type=int, default=1, show_default=True,
              help="Trial slots of this host (parallel Pier processes).")  # fmt: skip
@click.option("--hostname", help="Worker name (default: celery's, from this host's name).")
@click.option("--queues", "-Q", help="Comma-separated queues to consume (default: celery).")
@click.option("--loglevel", default="INFO", show_default=True)
@click.option("--platform", default="linux/amd64", show_default=True,
              help="Platform this host must run (checked at start).")  # fmt: skip
@click.option("--pier-bin", default="pier", show_default=True, help="Pier executable checked at start.")
@_handle_errors
def worker(concurrency: int, hostname: str | None, queues: str | None, loglevel: str,
           platform: str, pier_bin: str) -> None:  # fmt: skip
    """Run a Celery worker that executes trials on this host.

    Late acks, prefetch 1, task events on, and a watchdog that re-dispatches
    trials of lost hosts. A host that fails preflight consumes no trials.
    """
    from sciencebench.worker.main import run_worker

    run_worker(concurrency=concurrency, hostname=hostname, queues=queues, loglevel=loglevel,
               platform=platform, pier_bin=pier_bin)  # fmt: skip


@main.command()
@click.option(
    "--dir",
    "workdir",
    type=click.Path(path_type=Path),
    default=Path(".demo"),
    show_default=True,
    help="Where the demo selection and its jobs go.",
)
@click.option(
    "--base-image",
    envvar="SCIENCEBENCH_DEMO_BASE_IMAGE",
    required=True,
    help="Digest-pinned Debian image with bash and git [env: SCIENCEBENCH_DEMO_BASE_IMAGE].",
)
@click.option(
    "--registry",
    envvar="SCIENCEBENCH_DEMO_REGISTRY",
    required=True,
    help="Registry (host:port) to push the demo images to [env: SCIENCEBENCH_DEMO_REGISTRY].",
)
@click.option("--agent", default="oracle", show_default=True, help="Harness to run (oracle needs no model).")
@_handle_errors
def demo(workdir: Path, base_image: str, registry: str, agent: str) -> None:
    """Build a two-task demo selection and run it here with real Pier (embedded mode).

    task_001's solution fixes the bug (oracle reward 1), task_002's does not
    (reward 0). Needs Docker Engine >= 28 and Pier on this host.
    """
    from sciencebench.demo import build_demo_selection
    from sciencebench.login.submit import default_job_name

    out.print(f"building demo images on {base_image} and pushing them to {registry} ...", soft_wrap=True)
    selection = build_demo_selection(workdir.resolve() / "selection", base_image, registry)
    job_name = default_job_name(f"demo-{agent}")
    out.print(f"running {selection} with --agent {agent} as job {job_name}", soft_wrap=True)
    demo_options = SubmitOptions(
        path=selection, agent=agent, n_concurrent=2, jobs_dir=workdir.resolve() / "jobs", job_name=job_name
    )
    run_submit(demo_options, local=True, wait=False)


@main.command()
@click.option("--platform", default="linux/amd64", show_default=True)
@click.option("--jobs-dir", type=click.Path(path_type=Path), help="Shared jobs directory to check.")
@click.option("--pier-bin", default="pier", show_default=True)
@click.option("--broker/--no-broker", default=True, show_default=True, help="Check the broker too.")
@_handle_errors
def preflight(platform: str, jobs_dir: Path | None, pier_bin: str, broker: bool) -> None:
    """Check this host can join as a worker: Engine >= 28, platform, compose v2, Pier, jobs dir, broker."""
    from sciencebench.worker.runtime import host_preflight

    for line in host_preflight(platform=platform, jobs_dir=jobs_dir, pier_bin=pier_bin, broker=broker):
        out.print(line, markup=False)


@main.group()
def images() -> None:
    """Agent-ready images: task images with a harness preinstalled, for offline workers.

    Pier installs codex, claude-code and mini-swe-agent by downloading them
    inside an image build, which offline workers cannot do. `bake` builds the
    selection's task images with the agent preinstalled from artifacts fetched
    on this host (scripts/agent-artifacts.sh), pushes them by digest and
    records them in <selection>/.sciencebench/agent-images.json, which
    `submit` checks and workers run.
    """


@images.command()
@click.option("--path", required=True, type=click.Path(path_type=Path), help="Materialized task selection.")
@click.option("--agent", required=True, type=click.Choice(["codex", "claude-code", "mini-swe-agent"]),
              help="Harness to preinstall.")  # fmt: skip
@click.option("--agent-version", help="Version to bake (default: the pinned one).")
@click.option("--registry", help="Registry host[:port] to push to (default: each task image's registry).")
@click.option("--artifacts", type=click.Path(path_type=Path), envvar="SCIENCEBENCH_AGENT_ARTIFACTS",
              help="Directory of fetched artifacts [env: SCIENCEBENCH_AGENT_ARTIFACTS; "
                   "default /var/tmp/sciencebench-agents].")  # fmt: skip
@click.option("--extra-ca", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="PEM CA certificate the agent must trust (a gateway with a private CA).")  # fmt: skip
@_handle_errors
def bake(
    path: Path, agent: str, agent_version: str | None, registry: str | None,
    artifacts: Path | None, extra_ca: Path | None,
) -> None:  # fmt: skip
    """Bake --agent into every agent image of the selection; a no-op for what is already baked.

    Exits 0 when every image is baked and recorded, 1 when the engine or the
    registry fails, 2 on bad input (selection, agent, missing artifacts).
    """
    from sciencebench.bake import bake_selection
    from sciencebench.core.agentimages import agent_images_path

    results = bake_selection(
        path, agent, agent_version, registry=registry, artifacts=artifacts, extra_ca=extra_ca,
        log=lambda line: err.print(line, markup=False, soft_wrap=True),
    )  # fmt: skip
    table = Table(title=f"{agent}: {len(results)} image(s)")
    for column in ("task image", "baked image", "action", "seconds"):
        table.add_column(column)
    for result in results:
        table.add_row(result.image.base_image, result.image.image, result.action, f"{result.seconds:.1f}")
    out.print(table)
    out.print(f"recorded in {agent_images_path(path.resolve())}", soft_wrap=True)
