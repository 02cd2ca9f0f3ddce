"""The command line: parse, call the library, turn known errors into one line.

Exit codes: 0 success; 1 a job finished with errored trials (or a runtime
failure); 2 bad input, with nothing written and nothing enqueued; 3 a job
stopped on its budget (--max-cost/--max-tokens): no trial errored, some never
started.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from sciencebench import __version__
from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.errors import InputError, JobConflictError, SciencebenchError
from sciencebench.core.images import DEFAULT_PLATFORM
from sciencebench.core.models import JobSpec, TrialSpec, trial_label
from sciencebench.core.paths import DEFAULT_JOBS_DIR, JobPaths
from sciencebench.core.settings import Settings
from sciencebench.core.sizes import parse_size
from sciencebench.login import options
from sciencebench.login.options import SubmitOptions

err = Console(stderr=True, highlight=False)
out = Console(highlight=False)
# `status` lists a host that stopped beating without a goodbye for this long.
GONE_HOST_SHOWN_SEC = 3600.0
# The exit code of a job that stopped on its budget: nothing errored or missing, some trials never started.
EXIT_BUDGET = 3


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
        except OSError as exc:  # a full disk, a vanished mount: what and where, not a traceback
            where = f": {exc.filename}" if exc.filename else ""
            _fail(f"{exc.strerror or exc.__class__.__name__}{where}", 1)
        except KeyboardInterrupt:
            _fail("interrupted", 130)

    return wrapper


def _require_worker_extra(command: str) -> None:
    """Refuse a worker-side command, in one line, where the `worker` extra is not installed."""
    missing = [module for module in ("pier", "docker") if importlib.util.find_spec(module) is None]
    if missing:
        raise SciencebenchError(
            f"{command} runs Pier and Docker on this host: install sciencebench[worker] "
            f"(missing: {', '.join(missing)})"
        )


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
    coord: Coordinator | None = None

    def hosts() -> Cluster:  # asked once the input is known good
        nonlocal coord
        if local:
            return Cluster.this_host(settings)
        coord = _broker(settings)
        return Cluster.live(coord, settings.lease_seconds)

    timeout = None if local else settings.visibility_timeout_sec
    prepared = submitting.prepare(opts, timeout, local=local, hosts=hosts)
    broker = "embedded (in-process)" if local else settings.broker_url
    record = build_run_record(prepared.job, prepared.trials[0], broker, prepared.secret_values)

    if opts.dry_run:
        write_run_record(opts.path, record, prepared.secret_values)
        out.print(f"dry run: {len(prepared.trials)} trial(s) of {len(prepared.selection.task_ids)} "
                  f"task(s); selection sha256 {prepared.selection.sha256}", soft_wrap=True)  # fmt: skip
        out.print("pier command: " + record["pier_command"], markup=False, soft_wrap=True)
        out.print(f"run record: {opts.path / 'batch-run.json'}")
        _print_expected(settings, prepared.job, prepared.trials, coord)
        if coord is not None and not opts.skip_pull:
            _prewarm(settings, prepared.job, err)
        return

    if local:
        _require_worker_extra("submit --local")
        from sciencebench.local import run_local

        prepared = submitting.persist(prepared, record)
        sys.exit(_conclude(prepared.job, run_local(prepared, settings, out)))

    from sciencebench.coordination.celery_app import create_app
    from sciencebench.login.dispatch import dispatch
    from sciencebench.login.follow import follow

    assert coord is not None
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
        sys.exit(_conclude(job, answer, coord))


def _broker(settings: Settings) -> Coordinator:
    """The cluster's store, reachable (BrokerUnavailableError, one line, when not): submit reads its hosts."""
    from sciencebench.coordination.redis import RedisCoordinator

    coord = RedisCoordinator(settings.broker_url)
    coord.ping()
    return coord


def _conclude(job: JobSpec, answer: dict[str, Any], coord: Coordinator | None = None) -> int:
    """Print the summary and what is missing; the exit code: 1 if any trial errored or is missing.

    3 (`EXIT_BUDGET`) when, without either, the job's budget left trials not started.

    When the finalizer could not write the job directory (a host that cannot
    see it), this node writes the records the store holds and the summary.
    """
    from sciencebench.coordination.records import finish_job, forget_agent_env

    paths = JobPaths(job.jobs_dir, job.job_name)
    if coord is not None and (not answer.get("summary_written") or answer.get("missing")):
        if answer.get("problem"):
            err.print(f"finalizer: {answer['problem']}; writing the summary here", markup=False)
        try:
            answer = finish_job(coord, paths, job.job_name, job.job_id)
        except OSError as exc:
            err.print(f"cannot write the summary into {paths.job_dir}: {exc.strerror}", markup=False)
            return 1
    try:
        _print_summary(paths)
        not_started = _print_budget(job, paths, coord)
    except (OSError, ValueError) as exc:
        err.print(f"no summary in {paths.job_dir} ({exc.__class__.__name__})", markup=False)
        return 1
    missing = list(answer.get("missing") or [])
    if coord is not None or not missing:
        forget_agent_env(job)  # the job has ended: its --agent-env values are no longer needed
    if missing:
        shown = ", ".join(f"task_{key.replace('#', ' #')}" for key in missing[:20])
        more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
        err.print(f"missing: {len(missing)} trial(s) have no record: {shown}{more}", markup=False)
    if answer.get("n_errored_trials") or missing:
        return 1
    return EXIT_BUDGET if not_started else 0


def _print_budget(job: JobSpec, paths: JobPaths, coord: Coordinator | None = None) -> int:
    """Under the summary: "budget reached after N trials, M not started" (and when only tokens can be capped).

    Returns M. The records are read only for a job with a budget or trials not started.
    """
    from sciencebench.coordination.budget import budget_lines
    from sciencebench.core.summary import NOT_STARTED, load_records

    rows = json.loads(paths.summary_json.read_text(encoding="utf-8"))["rows"]
    ledger = coord.budget(job.job_key) if coord is not None else None
    capped_cost = job.max_cost_usd is not None or (ledger is not None and ledger.max_cost_usd is not None)
    if not (
        capped_cost or job.max_tokens is not None or any(r["failure_class"] == NOT_STARTED for r in rows)
    ):
        return 0
    lines, not_started = budget_lines(load_records(paths), capped_cost)
    for line in lines:
        out.print(line, markup=False, soft_wrap=True)
    return not_started


def _print_expected(
    settings: Settings, job: JobSpec, trials: list[TrialSpec], coord: Coordinator | None
) -> None:
    """`submit --dry-run`: the expected duration on the live cluster's slots (else --n-concurrent).

    `coord`: the cluster's store (None for `--local`).
    """
    from sciencebench.coordination.costs import cost_estimates
    from sciencebench.coordination.history import estimates
    from sciencebench.login.progress import expected_job, expected_lines, live_slots

    measured: dict[str, float] = {}
    costs: dict[str, float] = {}
    cluster: int | None = None
    why_not = "--local"
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

    coord = _broker(settings)
    prewarm(create_app(settings), coord, job.image_refs, job.platform, console, settings.lease_seconds)


def _print_summary(paths: JobPaths) -> None:
    summary = json.loads(paths.summary_json.read_text(encoding="utf-8"))
    table = Table(title=f"{paths.job_name}: {summary['trial_count']} trial(s)")
    for column in ("task_id", "trial_id", "reward", "failure_class"):
        table.add_column(column)
    for row in summary["rows"]:
        table.add_row(*(str(row[c]) for c in ("task_id", "trial_id", "reward", "failure_class")))
    out.print(table)
    out.print("\n".join(_number_lines(summary)), markup=False, highlight=False, soft_wrap=True)
    out.print(f"results: {paths.summary_csv}")


def _number_lines(summary: dict[str, Any]) -> list[str]:
    """The job's numbers under its table (`core.stats.report_lines`); none from an older summary.json."""
    from sciencebench.core.stats import JobNumbers, report_lines

    stats = summary.get("stats")
    return report_lines(JobNumbers.model_validate(stats)) if isinstance(stats, dict) else []


def _job_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--jobs-dir", type=click.Path(path_type=Path), default=DEFAULT_JOBS_DIR,
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
    """Show a job's counts, each trial's state and host, its budget and its gateways' limits."""
    from sciencebench.coordination.budget import status_line
    from sciencebench.coordination.gateways import gateway_limits
    from sciencebench.coordination.redis import RedisCoordinator

    job = _load(jobs_dir, job_name)
    coord = RedisCoordinator(Settings.from_env().broker_url)
    coord.ping()
    states = coord.states(job.job_key)
    table = Table(title=f"job {job.job_name}" + ("  (cancelled)" if coord.is_cancelled(job.job_key) else ""))
    for column in ("trial", "state", "host"):
        table.add_column(column)
    counts: dict[str, int] = {}
    for key in job.trial_keys():
        status = states.get(key)
        state = str(status.state) if status else "unknown"
        counts[state] = counts.get(state, 0) + 1
        table.add_row(trial_label(key), state, status.host if status else "")
    out.print(table)
    out.print("  ".join(f"{state} {n}" for state, n in sorted(counts.items())))
    _print_live(job, coord)
    from sciencebench.coordination.shares import cluster_slots, share_lines

    for shared in share_lines(coord, cluster_slots(coord, Settings.from_env().lease_seconds), job.job_key):
        out.print(shared, markup=False, soft_wrap=True)
    line = status_line(coord.budget(job.job_key))
    if line:
        out.print(line, markup=False, soft_wrap=True)
    now = coord.now()
    for host, mark in sorted(coord.unfit_hosts(job.job_key).items()):
        out.print(
            f"unfit host {host}: {mark.reason} ({now - mark.at:.0f}s ago)", markup=False, soft_wrap=True
        )
    for limit in gateway_limits(coord).limits():  # every gateway's cluster-wide limit, and why
        why = f"; {limit.reason} ({now - limit.at:.0f}s ago)" if limit.reason else ""
        if limit.status and not limit.reason.startswith("provider error"):
            why = f"; last provider error {limit.status} ({now - limit.error_at:.0f}s ago){why}"
        line = f"gateway {limit.authority}: limit {limit.limit} of {limit.ceiling}, {limit.held} running{why}"
        out.print(line, markup=False, soft_wrap=True)
    lease = Settings.from_env().lease_seconds
    for host, health in sorted(coord.hosts().items()):
        silent = now - health.seen_at
        if silent > GONE_HOST_SHOWN_SEC:
            continue
        if silent > 2 * lease:  # killed without a goodbye: its heartbeat stopped
            out.print(f"gone host {host}: no heartbeat for {silent:.0f}s", markup=False, soft_wrap=True)
        elif health.paused:
            out.print(f"paused host {host}: {health.reason} (seen {silent:.0f}s ago)", markup=False,
                      soft_wrap=True)  # fmt: skip
        if silent <= 2 * lease and health.images:
            out.print(f"host {host}: {health.images}", markup=False, soft_wrap=True)


def _print_live(job: JobSpec, coord: Coordinator) -> None:
    """`status`: the job's trials by where they are, their spend so far and an ETA (`login.progress`)."""
    from sciencebench.login.progress import Watcher, live_slots, status_lines

    slots = live_slots(coord, Settings.from_env().lease_seconds)
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
@_handle_errors
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
    from sciencebench.coordination.redis import RedisCoordinator
    from sciencebench.coordination.shares import cluster_slots, job_field, share_lines, user_field

    settings = Settings.from_env()
    coord = RedisCoordinator(settings.broker_url)
    coord.ping()
    if name is not None:
        if weight is None and not reset:
            raise InputError("share: give a WEIGHT (a number > 0) or --reset")
        field = job_field(_load(jobs_dir, name).job_key) if is_job else user_field(name)
        coord.set_weight(field, None if reset else weight)
        what = f"job {name}" if is_job else f"user {name}"
        out.print(f"{what}: weight {'reset' if reset else f'{weight:g}'}", markup=False)
    lines = share_lines(coord, cluster_slots(coord, settings.lease_seconds))
    out.print("\n".join(lines) if lines else "no job takes part in fair share", markup=False, soft_wrap=True)


@main.command()
@_job_option
@_handle_errors
def cancel(job_name: str, jobs_dir: Path) -> None:
    """Cancel a job: queued trials end at once, running Pier processes are stopped."""
    from sciencebench.coordination.celery_app import create_app
    from sciencebench.coordination.records import forget_agent_env
    from sciencebench.coordination.redis import RedisCoordinator
    from sciencebench.login.dispatch import release_held

    job = _load(jobs_dir, job_name)
    settings = Settings.from_env()
    coord = RedisCoordinator(settings.broker_url)
    coord.ping()
    coord.cancel(job.job_key)
    forget_agent_env(job)  # no trial starts any more; running ones hold their values already
    release_held(create_app(settings), coord, job, settings.lease_seconds)  # held trials end at once too
    out.print(f"job {job.job_name} cancelled; the finalizer writes its summary once trials stop")


@main.command()
@_job_option
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
@_handle_errors
def retry(job_name: str, jobs_dir: Path, failed: bool, wait: bool, force: bool,
          max_cost_usd: float | None, max_tokens: int | None) -> None:  # fmt: skip
    """Re-run a job's errored trials, those with no record and those its budget did not start.

    They run into the same job directory. --max-cost/--max-tokens continue
    with a new budget (with --wait, exit 3 when it stops the job again).
    Refused (exit 2) while the job is still running: its trials would run
    twice.
    """
    from sciencebench.coordination.celery_app import create_app
    from sciencebench.coordination.records import store_records_to_disk
    from sciencebench.coordination.redis import RedisCoordinator
    from sciencebench.login.dispatch import dispatch
    from sciencebench.login.follow import follow
    from sciencebench.login.retry import continue_budget, failed_trials

    limits = options.budget_limits(max_cost_usd, max_tokens)
    job = _load(jobs_dir, job_name)
    settings = Settings.from_env()
    coord = RedisCoordinator(settings.broker_url)
    coord.ping()
    if coord.open_dispatches(job.job_key) and not force:
        raise JobConflictError(
            f"job {job.job_name} is still running (see `sciencebench status {job.job_name}`): wait for it "
            "or cancel it first; --force sends its errored and missing trials again anyway"
        )
    # Records only the store holds (the job directory was full) are not missing.
    store_records_to_disk(coord, job, JobPaths(job.jobs_dir, job.job_name))
    trials = failed_trials(job)
    if not trials:
        out.print(f"job {job.job_name}: no errored or missing trials")
        return
    coord.uncancel(job.job_key)
    # Trials an earlier dispatch still holds back have no record: they are among `trials`. Its chord is
    # given up (--force), so its held copies go; two copies of one trial would each answer one chord.
    coord.release_held(job.job_key, None)
    note = continue_budget(coord, job, *limits)
    for trial in trials:
        coord.clear_result(job.job_key, trial.key)
    final = dispatch(create_app(settings), coord, job, trials)
    out.print(f"job {job.job_name}: {len(trials)} errored, missing or not started trial(s) sent again")
    if note:
        err.print(note, markup=False, soft_wrap=True)
    if wait:
        answer = follow(coord, job, [t.key for t in trials], final, err)
        sys.exit(_conclude(job, answer, coord))


# `summarize` prints every row of a job this small; a bigger one, its counts and
# failures (rendering a table of 10,000 rows took seconds).
SUMMARY_ROWS_SHOWN = 50
FAILURES_SHOWN = 50


@main.command()
@click.option("--jobs-dir", type=click.Path(path_type=Path), default=DEFAULT_JOBS_DIR, show_default=True)
@click.option("--job-name", required=True, help="The job to summarize.")
@click.option("--rows", "all_rows", is_flag=True,
              help=f"Print every trial's row (a job of more than {SUMMARY_ROWS_SHOWN} trials prints "
              "its counts and failures).")  # fmt: skip
@_handle_errors
def summarize(jobs_dir: Path, job_name: str, all_rows: bool) -> None:
    """Rebuild result.json, config.json, summary.json and summary.csv from disk alone.

    Prints each trial's row, or for a big job the counts and the failed
    trials. Exits 1 when a trial errored or has no record yet (listed on
    stderr), 3 when, without either, the job's budget left trials not started.
    """
    from sciencebench.coordination.records import forget_agent_env, missing_trials
    from sciencebench.core.summary import write_summary

    # The job where it was found: a job directory moved or mounted elsewhere is summarized in place.
    job = _load(jobs_dir, job_name).model_copy(update={"jobs_dir": jobs_dir.resolve()})
    paths = JobPaths(job.jobs_dir, job.job_name)
    try:
        summary = write_summary(job)
    except ValueError as exc:  # a record that is not one (another version's, a damaged file)
        raise SciencebenchError(f"cannot summarize {job.job_name}: {exc}") from None
    missing = missing_trials(job, paths)
    if all_rows or len(summary.rows) <= SUMMARY_ROWS_SHOWN:
        _print_summary(paths)
    else:
        _print_counts(paths, summary.result, summary.rows)
    not_started = _print_budget(job, paths)
    if not missing:
        forget_agent_env(job)  # the job has ended: its --agent-env values are no longer needed
    else:
        shown = ", ".join(f"task_{key.replace('#', ' #')}" for key in missing[:20])
        more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
        err.print(f"missing: {len(missing)} trial(s) have no record: {shown}{more}", markup=False)
    if summary.result["stats"]["n_errored_trials"] or missing:
        sys.exit(1)
    sys.exit(EXIT_BUDGET if not_started else 0)


def _print_counts(paths: JobPaths, result: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """A big job's summary: its counts, each eval's metrics, and the trials that failed (plain lines)."""
    stats = result["stats"]
    lines = [
        f"{paths.job_name}: {stats['n_completed_trials']} of {result['n_total_trials']} trial(s) recorded, "
        f"{stats['n_errored_trials']} errored"
    ]
    lines += _number_lines(json.loads(paths.summary_json.read_text(encoding="utf-8")))
    failed = [row for row in rows if row["failure_class"]]
    if failed:
        classes: dict[str, int] = {}
        for row in failed:
            classes[row["failure_class"]] = classes.get(row["failure_class"], 0) + 1
        lines.append(
            f"failed: {len(failed)} trial(s): " + ", ".join(f"{c} {n}" for c, n in sorted(classes.items()))
        )
        for row in failed[:FAILURES_SHOWN]:
            trial_dir = f"{row['task_id']}__{row['trial_id']}" if row["trial_id"] else "(no trial directory)"
            lines.append(f"  {row['task_id']}  {row['failure_class']}  {trial_dir}")
        if len(failed) > FAILURES_SHOWN:
            lines.append(f"  and {len(failed) - FAILURES_SHOWN} more (every row: --rows, or summary.csv)")
    lines.append(f"results: {paths.summary_csv}")
    out.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--concurrency", type=int, default=1, show_default=True,
              help="Trial slots of this host (parallel Pier processes).")  # fmt: skip
@click.option("--hostname", help="Worker name (default: celery's, from this host's name).")
@click.option("--queues", "-Q", help="Comma-separated queues to consume (default: celery).")
@click.option("--loglevel", default="INFO", show_default=True)
@click.option("--platform", default=DEFAULT_PLATFORM, show_default=True,
              help="Platform this host must run (checked at start).")  # fmt: skip
@click.option("--pier-bin", help="The Pier this worker runs for every trial [env: SCIENCEBENCH_PIER_BIN; "
              "default: pier].")  # fmt: skip
@click.option("--jobs-root", "jobs_roots", multiple=True, type=click.Path(path_type=Path),
              help="A jobs directory this worker serves; repeatable "
              "[env: SCIENCEBENCH_JOBS_ROOTS].")  # fmt: skip
@click.option("--selection-root", "selection_roots", multiple=True, type=click.Path(path_type=Path),
              help="A directory of selections this worker serves; repeatable "
              "[env: SCIENCEBENCH_SELECTION_ROOTS].")  # fmt: skip
@click.option("--env-file-root", "env_file_roots", multiple=True, type=click.Path(path_type=Path),
              help="A directory of env files this worker reads; repeatable "
              "[env: SCIENCEBENCH_ENV_FILE_ROOTS].")  # fmt: skip
@click.option("--image-budget", metavar="SIZE",
              help="Disk the task images this host pulls may take, e.g. 200G: least recently used "
              "images not in use are evicted before a pull would exceed it [env: SCIENCEBENCH_IMAGE_BUDGET; "
              "default: no budget].")  # fmt: skip
@click.option("--agent-install", type=click.Choice(["online", "baked"]),
              help="How this host gets agents: online, Pier installs them in its build (a host with "
              "internet, as the original runner's); baked, only baked agent images run "
              "[env: SCIENCEBENCH_AGENT_INSTALL; default: online].")  # fmt: skip
@_handle_errors
def worker(concurrency: int, hostname: str | None, queues: str | None, loglevel: str, platform: str,
           pier_bin: str | None, jobs_roots: tuple[Path, ...], selection_roots: tuple[Path, ...],
           env_file_roots: tuple[Path, ...], image_budget: str | None,
           agent_install: str | None) -> None:  # fmt: skip
    """Run a Celery worker that executes trials on this host.

    The worker runs its own Pier and serves only the jobs directories,
    selections and env files under its roots: every path a job names must
    resolve under one of them. It needs the digest-pinned inference-proxy
    image (SCIENCEBENCH_PROXY_IMAGE), pulled at start, and tells the cluster
    what it brings (agent install, proxy image, roots), which submit checks.
    Late acks, prefetch 1, task events on, a watchdog that re-dispatches
    trials of lost hosts; a host that turns unhealthy pauses and resumes by
    itself.
    """
    _require_worker_extra("worker")
    from sciencebench.worker.main import run_worker, worker_settings

    settings = worker_settings(
        Settings.from_env(),
        pier_bin=pier_bin,
        jobs_roots=tuple(p.absolute() for p in jobs_roots),
        selection_roots=tuple(p.absolute() for p in selection_roots),
        env_file_roots=tuple(p.absolute() for p in env_file_roots),
        image_budget=_size_option("--image-budget", image_budget),
        agent_install=agent_install,
    )
    run_worker(concurrency=concurrency, hostname=hostname, queues=queues, loglevel=loglevel,
               platform=platform, settings=settings)  # fmt: skip


def _size_option(name: str, value: str | None) -> int | None:
    """Bytes of a size option (`200G`), None when not given; InputError for a bad one."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise InputError(f"{name}: {exc}") from None


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
    _require_worker_extra("demo")
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
@click.option("--platform", default=DEFAULT_PLATFORM, show_default=True)
@click.option("--jobs-dir", type=click.Path(path_type=Path), help="Shared jobs directory to check.")
@click.option("--pier-bin", help="The worker's Pier [env: SCIENCEBENCH_PIER_BIN; default: pier].")
@click.option("--broker/--no-broker", default=True, show_default=True, help="Check the broker too.")
@_handle_errors
def preflight(platform: str, jobs_dir: Path | None, pier_bin: str | None, broker: bool) -> None:
    """Check this host can join as a worker: Engine >= 28, platform, compose v2, Pier, jobs dir, broker."""
    _require_worker_extra("preflight")
    from sciencebench.worker.runtime import host_preflight

    pier = pier_bin or Settings.from_env().pier_bin
    for line in host_preflight(platform=platform, jobs_dir=jobs_dir, pier_bin=pier, broker=broker):
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
@click.option("--registry", required=True, metavar="HOST[:PORT]",
              help="Registry to push the baked images to, one the workers pull from (a task image's "
                   "own registry, e.g. docker.io, is rarely one you may push to).")  # fmt: skip
@click.option("--artifacts", type=click.Path(path_type=Path), envvar="SCIENCEBENCH_AGENT_ARTIFACTS",
              help="Directory of fetched artifacts [env: SCIENCEBENCH_AGENT_ARTIFACTS; "
                   "default /var/tmp/sciencebench-agents].")  # fmt: skip
@click.option("--extra-ca", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="PEM CA certificate the agent must trust (a gateway with a private CA).")  # fmt: skip
@_handle_errors
def bake(
    path: Path, agent: str, agent_version: str | None, registry: str,
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
