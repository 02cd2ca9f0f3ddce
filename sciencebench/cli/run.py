"""`submit` and `demo`: validate a selection, record it, then run it here or dispatch it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from sciencebench.cli.common import err, handle_errors, main, out, reach_broker, require_worker_extra
from sciencebench.cli.results import conclude
from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.errors import BrokerUnavailableError
from sciencebench.core.gateways import masked_url
from sciencebench.core.models import JobSpec, TrialSpec
from sciencebench.core.paths import JobPaths, SelectionPaths
from sciencebench.core.settings import DEMO_BASE_IMAGE_ENV, DEMO_REGISTRY_ENV, Settings
from sciencebench.login import options
from sciencebench.login.options import SubmitOptions

if TYPE_CHECKING:
    from sciencebench.login.runrecord import RunRecord
    from sciencebench.login.submit import Prepared


@main.command()
@options.click_options
@click.option("--local", is_flag=True,
              help="Run in this process with --n-concurrent slots; no broker needed.")  # fmt: skip
@click.option("--wait", is_flag=True, help="Follow the job with a live progress bar until it ends.")
@handle_errors
def submit(local: bool, wait: bool, **raw: Any) -> None:
    """Validate a selection and run every trial (task x attempt) of it.

    The same submit again (same --job-name, selection and options) continues
    its job: trials with a final record are kept, the rest run.

    Exits 0 when every trial finished without error, 1 when any errored
    (with --wait or --local), 2 on bad input (nothing written or enqueued),
    3 when the job stopped on its --max-cost/--max-tokens budget (nothing
    errored; the trials it did not start are listed as `not_started`).
    """
    run_submit(options.from_cli(raw), local=local, wait=wait)


def run_submit(opts: SubmitOptions, *, local: bool, wait: bool) -> None:
    """`submit`: validate, record, then run here (`local`) or dispatch (and follow with `wait`).

    Exits the process with the job's exit code when it waited for the job.
    """
    from sciencebench.login import submit as submitting
    from sciencebench.login.cluster import Cluster
    from sciencebench.login.runrecord import build_run_record, write_run_record

    settings = Settings.from_env()
    if local and opts.gateways:  # this host's user is its operator: the gateways allowed besides its setting
        from sciencebench.core.gateways import parse_gateway_list

        allowed = (*settings.gateways, *parse_gateway_list(opts.gateways, "--gateway"))
        settings = settings.model_copy(update={"gateways": allowed})
    coord: Coordinator | None = None

    def hosts() -> Cluster:  # asked once the input is known good
        nonlocal coord
        if local:
            return Cluster.this_host(settings)
        try:
            coord = reach_broker(settings)
        except BrokerUnavailableError as exc:
            if not opts.dry_run:
                raise
            return Cluster.unknown(f"{exc} at {masked_url(settings.broker_url)}")
        return Cluster.live(coord, settings.lease_seconds)

    timeout = None if local else settings.visibility_timeout_sec
    prepared = submitting.prepare(opts, timeout, local=local, hosts=hosts)
    broker = "embedded (in-process)" if local else settings.broker_url
    record = build_run_record(prepared.job, prepared.first_trial, broker, prepared.secret_values)

    if opts.dry_run:
        unchecked = list(prepared.unchecked)
        if coord is None and not opts.skip_pull:  # no worker pre-warms them: their registries are asked
            from sciencebench.login.registries import check_images

            unchecked += filter(None, [check_images(prepared.job.image_refs).line()])
        write_run_record(opts.path, record, prepared.secret_values)
        out.print(f"dry run: {len(prepared.trials)} trial(s) of {len(prepared.selection.task_ids)} "
                  f"task(s); selection sha256 {prepared.selection.sha256}", soft_wrap=True)  # fmt: skip
        out.print("pier command: " + record.pier_command, markup=False, soft_wrap=True)
        out.print(f"run record: {SelectionPaths(opts.path).run_record}")
        _print_expected(settings, prepared.job, prepared.trials, coord, "--local" if local else "no broker")
        if unchecked:
            out.print("dry run: not checked here: " + "; ".join(unchecked), markup=False, soft_wrap=True)
        if coord is not None and not opts.skip_pull:
            _prewarm(settings, prepared.job, err)
        return

    if prepared.resumed:
        kept = len(prepared.job.trial_keys()) - len(prepared.trials)
        out.print(f"job [bold]{prepared.job.job_name}[/] continues: {kept} trial(s) with a final record "
                  f"kept, {len(prepared.trials)} to run")  # fmt: skip
    if local:
        require_worker_extra("submit --local")
        from sciencebench.coordination.embedded import check_embedded
        from sciencebench.local import run_local

        check_embedded(settings.state_dir)  # before the job is written

        prepared = submitting.persist(prepared, record)
        sys.exit(conclude(prepared.job, run_local(prepared, settings, out)))

    from sciencebench.coordination.celery_app import create_app
    from sciencebench.login.dispatch import dispatch
    from sciencebench.login.follow import follow

    assert coord is not None
    if prepared.resumed:
        _resume(settings, coord, prepared, record, wait)
        return
    app = create_app(settings)
    with submitting.persisted(prepared, record) as prepared:  # undone if sending fails
        if opts.prepull and not opts.skip_pull:
            _prewarm(settings, prepared.job, err)
        if prepared.job.max_cost_usd is not None or prepared.job.max_tokens is not None:
            coord.set_budget(prepared.job.job_key, prepared.job.max_cost_usd, prepared.job.max_tokens)
        final = dispatch(app, coord, prepared.job, prepared.trials)
    job = prepared.job
    out.print(f"submitted job [bold]{job.job_name}[/]: {len(prepared.trials)} trial(s) -> {job.job_dir}")
    out.print(f"follow it:  sciencebench status {job.job_name} --jobs-dir {job.jobs_dir}")
    if wait:
        answer = follow(coord, job, [t.key for t in prepared.trials], final, err)
        sys.exit(conclude(job, answer, coord))


def _resume(
    settings: Settings, coord: Coordinator, prepared: Prepared, record: RunRecord, wait: bool
) -> None:
    """The same submit again, on the cluster: the job's trials with no final record are sent as `retry` sends.

    Refused while the job is still running. Exits the process with the job's
    exit code when it waits; with nothing left to run, says so.
    """
    from sciencebench.coordination.records import store_records_to_disk
    from sciencebench.login import submit as submitting
    from sciencebench.login.follow import follow
    from sciencebench.login.resume import unfinished_trials
    from sciencebench.login.retry import check_not_running, resend

    job = prepared.job
    check_not_running(coord, job)
    with submitting.persisted(prepared, record) as prepared:  # undone if sending fails
        store_records_to_disk(coord, job, JobPaths(job.jobs_dir, job.job_name))
        trials = unfinished_trials(job, prepared.trials)
        if not trials:
            out.print(f"job {job.job_name}: every trial has its final record; `sciencebench summarize "
                      f"{job.job_name}` shows it, `sciencebench retry {job.job_name} --failed` runs the "
                      "errored ones again")  # fmt: skip
            return
        sent = resend(settings, coord, job, trials, None, None)
    if sent.note:
        err.print(sent.note, markup=False, soft_wrap=True)
    out.print(f"follow it:  sciencebench status {job.job_name} --jobs-dir {job.jobs_dir}")
    if wait:
        answer = follow(coord, job, [t.key for t in sent.trials], sent.final, err)
        sys.exit(conclude(job, answer, coord))


def _print_expected(
    settings: Settings, job: JobSpec, trials: list[TrialSpec], coord: Coordinator | None, why_not: str
) -> None:
    """`submit --dry-run`: the expected duration on the live cluster's slots (else --n-concurrent).

    `coord`: the cluster's store (None for `--local` or with no broker: `why_not` says which).
    """
    from sciencebench.coordination.costs import cost_estimates
    from sciencebench.coordination.history import estimates
    from sciencebench.login.progress import expected_job, expected_lines, live_slots

    measured: dict[str, float] = {}
    costs: dict[str, float] = {}
    cluster: int | None = None
    if coord is not None:
        why_not = "no live host reported its slots"
        measured, costs = estimates(coord, job), cost_estimates(coord, job)
        cluster = live_slots(coord, settings.lease_seconds)
    slots = min(job.n_concurrent, cluster) if cluster else job.n_concurrent
    expected = expected_job(trials, measured, slots, costs)
    lines = expected_lines(expected, job.n_concurrent, cluster, why_not)
    out.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


def _prewarm(settings: Settings, job: JobSpec, console: Console) -> None:
    """The live worker hosts pull the job's images, each image one host (`--prepull`, a dry run)."""
    from sciencebench.coordination.celery_app import create_app
    from sciencebench.login.prewarm import prewarm

    coord = reach_broker(settings)
    prewarm(create_app(settings), coord, job.image_refs, job.platform, console, settings.lease_seconds,
            placement=job.placement)  # fmt: skip


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
    envvar=DEMO_BASE_IMAGE_ENV,
    required=True,
    help="Digest-pinned Debian image with bash and git [env: SCIENCEBENCH_DEMO_BASE_IMAGE].",
)
@click.option(
    "--registry",
    envvar=DEMO_REGISTRY_ENV,
    required=True,
    help="Registry (host:port) to push the demo images to [env: SCIENCEBENCH_DEMO_REGISTRY].",
)
@click.option("--agent", default="oracle", show_default=True, help="Harness to run (oracle needs no model).")
@handle_errors
def demo(workdir: Path, base_image: str, registry: str, agent: str) -> None:
    """Build a two-task demo selection and run it here with real Pier (embedded mode).

    task_001's solution fixes the bug (oracle reward 1), task_002's does not
    (reward 0). Needs Docker Engine >= 28 and Pier on this host.
    """
    require_worker_extra("demo")
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
