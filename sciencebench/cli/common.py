"""What every command shares: the consoles, the command group, one-line errors, a job by name, the broker."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console

from sciencebench import __version__
from sciencebench.cli.exitcodes import ExitCode
from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.errors import BrokerUnavailableError, EmbeddedStoreError, InputError, SciencebenchError
from sciencebench.core.models import JobSpec
from sciencebench.core.paths import DEFAULT_JOBS_DIR, JobPaths
from sciencebench.core.settings import DEFAULT_BROKER_URL, STATE_DIR_ENV, Settings, env_name

BROKER_URL_ENV = env_name("broker_url")
err = Console(stderr=True, highlight=False)
out = Console(highlight=False)
# The exit code of a job that stopped on its budget: nothing errored or missing, some trials never started.
EXIT_BUDGET = ExitCode.BUDGET


def _fail(message: str, code: int) -> NoReturn:
    err.print(f"sciencebench: error: {message}", markup=False, soft_wrap=True)
    sys.exit(code)


def handle_errors[**P, R](fn: Callable[P, R]) -> Callable[P, R]:
    """A command whose known errors end it in one line: exit 2 for bad input, 1 for the rest, 130 on ^C.

    The codes are `cli.exitcodes`'; a store's error names that store and what
    sets it (`broker_problem`).
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            _fail(str(exc), ExitCode.BAD_INPUT)
        except BrokerUnavailableError as exc:
            _fail(broker_problem(exc), ExitCode.FAILED)
        except SciencebenchError as exc:
            _fail(str(exc), ExitCode.FAILED)
        except OSError as exc:  # a full disk, a vanished mount: what and where, not a traceback
            where = f": {exc.filename}" if exc.filename else ""
            _fail(f"{exc.strerror or exc.__class__.__name__}{where}", ExitCode.FAILED)
        except KeyboardInterrupt:
            _fail("interrupted", ExitCode.INTERRUPTED)

    return wrapper


def broker_problem(exc: BrokerUnavailableError) -> str:
    """The store's problem (e.g. "broker unreachable: ConnectionError") with where and how to fix it.

    The broker's: its URL as this process was given it, password masked
    (`core.gateways.masked_url`), and the variable that sets it. A `--local`
    job's embedded store's (EmbeddedStoreError): its directory, and what a
    start there needs; no broker is involved.
    """
    from sciencebench.core.gateways import masked_url

    problem = str(exc)
    if isinstance(exc, EmbeddedStoreError):
        return (f"{problem} (in {exc.directory}, its log redis.log there): check that {STATE_DIR_ENV} names "
                "a writable directory of this host and that redis-server can start in it")  # fmt: skip
    url = os.environ.get(BROKER_URL_ENV, "") or DEFAULT_BROKER_URL
    given = "" if os.environ.get(BROKER_URL_ENV) else " (the default)"
    return f"{problem} at {masked_url(url)}{given}; set {BROKER_URL_ENV} to the cluster's Redis"


def require_worker_extra(command: str) -> None:
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


def reach_broker(settings: Settings) -> Coordinator:
    """The cluster's store, reachable (BrokerUnavailableError, one line, when not)."""
    from sciencebench.coordination import connect

    coord = connect(settings)
    coord.ping()
    return coord


def job_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A command's JOB_NAME argument and its --jobs-dir option."""
    fn = click.option("--jobs-dir", type=click.Path(path_type=Path), default=DEFAULT_JOBS_DIR,
                      show_default=True, help="Directory holding the job.")(fn)  # fmt: skip
    return click.argument("job_name")(fn)


def load_job(jobs_dir: Path, job_name: str) -> JobSpec:
    """The JobSpec of job `job_name` in `jobs_dir`; SelectionError (exit 2) when there is none."""
    from sciencebench.core.errors import SelectionError

    paths = JobPaths(jobs_dir.resolve(), job_name)
    if not paths.job_spec.is_file():
        raise SelectionError(f"no job {job_name!r} in {jobs_dir}")
    return JobSpec.model_validate_json(paths.job_spec.read_bytes())


def store_of(job: JobSpec, settings: Settings) -> Coordinator:
    """The store that holds `job`'s state: this host's embedded one for a `--local` job, else the broker."""
    if job.local:
        from sciencebench.coordination import embedded

        return embedded.coordinator(settings.state_dir)
    return reach_broker(settings)
