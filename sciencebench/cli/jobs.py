"""Commands on a running job: `status`, `share`, `cancel`, `retry`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click
from rich.table import Table

from sciencebench.cli.common import (
    broker_problem,
    err,
    handle_errors,
    job_option,
    load_job,
    main,
    out,
    reach_broker,
    require_worker_extra,
    store_of,
)
from sciencebench.cli.results import conclude, status_from_files
from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.errors import BrokerUnavailableError, InputError, JobConflictError
from sciencebench.core.gateways import masked_url
from sciencebench.core.keys import TrialKey
from sciencebench.core.models import JobSpec
from sciencebench.core.paths import DEFAULT_JOBS_DIR, JobPaths
from sciencebench.core.settings import Settings
from sciencebench.login import options

# `status` lists a host that stopped beating without a goodbye for this long.
GONE_HOST_SHOWN_SEC = 3600.0


@main.command()
@job_option
@handle_errors
def status(job_name: str, jobs_dir: Path) -> None:
    """Show a job's counts, each trial's state and host, its budget, its gateways' and registries' state."""
    from sciencebench.coordination.budget import status_line
    from sciencebench.coordination.gateways import GatewayLimits
    from sciencebench.coordination.registries import RedisRegistryMarks
    from sciencebench.coordination.shares import cluster_slots, share_lines
    from sciencebench.core.capacity import NOTHING, in_use
    from sciencebench.login.cluster import is_live

    job = load_job(jobs_dir, job_name)
    paths = JobPaths(jobs_dir.resolve(), job_name)  # where it was found, as `summarize` reads it
    settings = Settings.from_env()
    if _ended_here(job, paths, settings):
        status_from_files(job, paths, "it has ended and this host's embedded store is not running")
        return
    try:
        coord = store_of(job, settings)
    except BrokerUnavailableError as exc:  # a job that has ended answers from its files without one
        if not status_from_files(job, paths, broker_problem(exc)):
            raise
        return
    states = coord.states(job.job_key)
    if not states:  # the store never knew the job, or has forgotten it (its keys expire after it ends)
        store = (
            "this host's embedded store" if job.local else f"the broker at {masked_url(settings.broker_url)}"
        )
        unknown = f"{store} does not know it"
        if not status_from_files(job, paths, unknown):
            raise InputError(
                f"job {job.job_name}: {unknown} and {paths.job_dir} holds no trial record or summary"
            )
        return
    table = Table(title=f"job {job.job_name}" + ("  (cancelled)" if coord.is_cancelled(job.job_key) else ""))
    for column in ("trial", "state", "host"):
        table.add_column(column)
    counts: dict[str, int] = {}
    for key in job.trial_keys():
        status = states.get(key)
        state = str(status.state) if status else "unknown"
        counts[state] = counts.get(state, 0) + 1
        table.add_row(TrialKey.parse(key).label, state, status.host if status else "")
    out.print(table)
    out.print("  ".join(f"{state} {n}" for state, n in sorted(counts.items())))
    _print_live(job, coord, settings.lease_seconds)
    for shared in share_lines(coord, cluster_slots(coord, settings.lease_seconds), job.job_key):
        out.print(shared, markup=False, soft_wrap=True)
    line = status_line(coord.budget(job.job_key))
    if line:
        out.print(line, markup=False, soft_wrap=True)
    now = coord.now()
    for host, mark in sorted(coord.unfit_hosts(job.job_key).items()):
        out.print(
            f"unfit host {host}: {mark.reason} ({now - mark.at:.0f}s ago)", markup=False, soft_wrap=True
        )
    for limit in GatewayLimits(coord).limits():  # every gateway's cluster-wide limit, and why
        why = f"; {limit.reason} ({now - limit.at:.0f}s ago)" if limit.reason else ""
        if limit.status and not limit.reason.startswith("provider error"):
            why = f"; last provider error {limit.status} ({now - limit.error_at:.0f}s ago){why}"
        line = f"gateway {limit.authority}: limit {limit.limit} of {limit.ceiling}, {limit.held} running{why}"
        out.print(line, markup=False, soft_wrap=True)
    for registry in RedisRegistryMarks(coord).states():  # every registry the cluster backs off from now
        if registry.wait_sec(now) > 0:
            out.print(registry.line(now), markup=False, soft_wrap=True)
    hosts = coord.hosts()
    used = coord.room_used(sorted(hosts))
    for host, health in sorted(hosts.items()):
        silent = now - health.seen_at
        if silent > GONE_HOST_SHOWN_SEC:
            continue
        live = is_live(health, now, settings.lease_seconds)
        if live and health.kit is not None and (capacity := health.kit.capacity) is not None:
            taken, trials = used.get(host, (NOTHING, 0))
            out.print(f"host {host}: {in_use(taken, capacity, trials)}", markup=False, soft_wrap=True)
        if not live:  # killed without a goodbye: its heartbeat stopped
            out.print(f"gone host {host}: no heartbeat for {silent:.0f}s", markup=False, soft_wrap=True)
        elif health.paused:
            out.print(f"paused host {host}: {health.reason} (seen {silent:.0f}s ago)", markup=False,
                      soft_wrap=True)  # fmt: skip
        if live and health.images:
            out.print(f"host {host}: {health.images}", markup=False, soft_wrap=True)


def _ended_here(job: JobSpec, paths: JobPaths, settings: Settings) -> bool:
    """Whether `job` ran `--local` and has ended, and its embedded store is not running.

    Then its files say all there is (its summary, or every trial's record) and
    no run of it is alive (a run keeps the store up): `status` and `cancel`
    answer without starting a redis-server. A job not ended starts it.
    """
    from sciencebench.coordination import embedded
    from sciencebench.coordination.records import missing_trials

    if not job.local or embedded.is_running(settings.state_dir):
        return False
    return paths.summary_json.is_file() or not missing_trials(job, paths)


def _print_live(job: JobSpec, coord: Coordinator, lease_seconds: float) -> None:
    """`status`: the job's trials by where they are, their spend so far and an ETA (`login.progress`)."""
    from sciencebench.login.progress import Watcher, live_slots, status_lines

    slots = live_slots(coord, lease_seconds)
    live = Watcher(coord, job, job.trial_keys()).poll(slots)
    out.print("\n".join(status_lines(live, job.n_concurrent)), markup=False, highlight=False, soft_wrap=True)


@main.command()
@click.argument("name", required=False)
@click.argument("weight", type=click.FloatRange(min=0, min_open=True), required=False)
@click.option("--job", "is_job", is_flag=True, help="NAME is a job (in --jobs-dir), not a user.")
@click.option("--jobs-dir", type=click.Path(path_type=Path), default=DEFAULT_JOBS_DIR, show_default=True,
              help="Directory holding the job (with --job).")  # fmt: skip
@click.option(
    "--reset", is_flag=True, help="Forget NAME's weight set here (back to 1, or the job's --weight)."
)
@handle_errors
def share(name: str | None, weight: float | None, is_job: bool, jobs_dir: Path, reset: bool) -> None:
    """Show fair share, or set a user's (or with --job, a job's) WEIGHT.

    Free slots of the cluster go first to the submitting user with the fewest
    running trials per unit of weight, then to that user's job with the
    fewest per unit of weight (default 1 per user; a job's is its submit's
    --weight). `sciencebench share alice 2` gives user alice twice the slots
    of a user of weight 1; `sciencebench share --job codex-small 3` gives
    that job three times the slots of the same user's jobs of weight 1.
    Without NAME: one line per job taking part. Takes effect at the next
    free slot; running trials are never stopped.
    """
    from sciencebench.coordination.shares import cluster_slots, job_field, share_lines, user_field

    settings = Settings.from_env()
    coord = reach_broker(settings)
    if name is not None:
        if weight is None and not reset:
            raise InputError("share: give a WEIGHT (a number > 0) or --reset")
        field = job_field(load_job(jobs_dir, name).job_key) if is_job else user_field(name)
        coord.set_weight(field, None if reset else weight)
        what = f"job {name}" if is_job else f"user {name}"
        out.print(f"{what}: weight {'reset' if reset else f'{weight:g}'}", markup=False)
    lines = share_lines(coord, cluster_slots(coord, settings.lease_seconds))
    out.print("\n".join(lines) if lines else "no job takes part in fair share", markup=False, soft_wrap=True)


@main.command()
@job_option
@handle_errors
def cancel(job_name: str, jobs_dir: Path) -> None:
    """Cancel a job: queued trials end at once, running Pier processes are stopped."""
    from sciencebench.coordination.celery_app import create_app
    from sciencebench.coordination.records import forget_agent_env
    from sciencebench.login.dispatch import release_held

    job, settings = load_job(jobs_dir, job_name), Settings.from_env()
    if _ended_here(job, JobPaths(jobs_dir.resolve(), job_name), settings):
        out.print(f"job {job.job_name} has ended: nothing to cancel")
        return
    coord = store_of(job, settings)
    coord.cancel(job.job_key)
    if job.local:  # its `submit --local` sees the flag at its trials' next heartbeat and ends them
        out.print(f"job {job.job_name} cancelled; its local run stops its trials and writes the summary")
        return
    forget_agent_env(job)  # no trial starts any more; running ones hold their values already
    release_held(create_app(settings), coord, job, settings.lease_seconds)  # held trials end at once too
    out.print(f"job {job.job_name} cancelled; the finalizer writes its summary once trials stop")


@main.command()
@job_option
@click.option("--failed", is_flag=True, required=True,
              help="Re-run the errored trials, those with no record and those not started.")  # fmt: skip
@click.option("--wait", is_flag=True, help="Follow the retry until it ends.")
@click.option("--max-cost", "max_cost_usd", type=float, metavar="USD",
              help="Continue with this budget: the job's total in USD, spend so far included "
              "(default: the job's current one).")  # fmt: skip
@click.option("--max-tokens", type=int, metavar="N",
              help="Continue with this budget in tokens, as --max-cost.")  # fmt: skip
@click.option("--force", is_flag=True,
              help="Send them even though the job's trials have not all answered yet (a trial's message "
              "was lost for good); the earlier --wait may then never return, and neither may this one's "
              "if a message of the earlier dispatch is still queued (cancel the job first).")  # fmt: skip
@handle_errors
def retry(job_name: str, jobs_dir: Path, failed: bool, wait: bool, force: bool,
          max_cost_usd: float | None, max_tokens: int | None) -> None:  # fmt: skip
    """Re-run a job's errored trials, those with no record and those its budget did not start.

    They run into the same job directory. --max-cost/--max-tokens continue
    with a new budget (with --wait, exit 3 when it stops the job again).
    Refused (exit 2) while the job is still running: its trials would run
    twice.
    """
    from sciencebench.login.follow import follow
    from sciencebench.login.retry import retry_failed

    limits = options.budget_limits(max_cost_usd, max_tokens)
    job, settings = load_job(jobs_dir, job_name), Settings.from_env()
    if job.local:
        _retry_here(job, settings, limits, force)
    coord = store_of(job, settings)
    sent = retry_failed(settings, coord, job, *limits, force=force)
    if sent is None:
        out.print(f"job {job.job_name}: no errored or missing trials")
        return
    out.print(f"job {job.job_name}: {len(sent.trials)} errored, missing or not started trial(s) sent again")
    if sent.note:
        err.print(sent.note, markup=False, soft_wrap=True)
    if wait:
        answer = follow(coord, job, [t.key for t in sent.trials], sent.final, err)
        sys.exit(conclude(job, answer, coord))


def _retry_here(job: JobSpec, settings: Settings, limits: tuple[float | None, int | None],
                force: bool) -> NoReturn:  # fmt: skip
    """`retry --failed` of a `--local` job: its trials run again here, as `submit --local` runs them.

    Exits with the job's exit code (0 at once when nothing needs a retry: no
    redis-server is started for that).
    """
    from sciencebench.local import run_local, running_here
    from sciencebench.login.retry import failed_trials

    if not force and running_here(job, settings):
        raise JobConflictError(
            f"job {job.job_name} is still running here (a trial holds its lease): wait for it or cancel it "
            "first; --force runs its errored and missing trials anyway"
        )
    trials = failed_trials(job)
    if not trials:
        out.print(f"job {job.job_name}: no errored or missing trials")
        sys.exit(0)
    require_worker_extra("retry of a --local job")
    out.print(f"job {job.job_name}: {len(trials)} errored, missing or not started trial(s) run again here")
    sys.exit(conclude(job, run_local(job, trials, settings, out, again=True, limits=limits)))
