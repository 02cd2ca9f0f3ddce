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
from sciencebench.core.errors import BrokerUnavailableError, InputError, SciencebenchError
from sciencebench.core.models import JobSpec
from sciencebench.core.paths import DEFAULT_JOBS_DIR, JobPaths
from sciencebench.core.settings import DEFAULT_BROKER_URL, Settings, env_name

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

    The codes are `cli.exitcodes`'; a broker error names the broker's URL
    (password masked) and the variable that sets it.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            _fail(str(exc), ExitCode.BAD_INPUT)
        except BrokerUnavailableError as exc:
            _fail(broker_problem(str(exc)), ExitCode.FAILED)
        except SciencebenchError as exc:
            _fail(str(exc), ExitCode.FAILED)
        except OSError as exc:  # a full disk, a vanished mount: what and where, not a traceback
            where = f": {exc.filename}" if exc.filename else ""
            _fail(f"{exc.strerror or exc.__class__.__name__}{where}", ExitCode.FAILED)
        except KeyboardInterrupt:
            _fail("interrupted", ExitCode.INTERRUPTED)

    return wrapper


def broker_problem(problem: str) -> str:
    """`problem` (the broker's, e.g. "broker unreachable: ConnectionError") with where and how to fix it.

    The URL is the one this process was given, its password masked
    (`core.gateways.masked_url`); the line names the variable that sets it.
    """
    from sciencebench.core.gateways import masked_url

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


def job_on_broker(jobs_dir: Path, job_name: str) -> tuple[JobSpec, Settings, Coordinator]:
    """A job by name, the settings and the cluster's store, reachable: what commands on a job start from."""
    job = load_job(jobs_dir, job_name)
    settings = Settings.from_env()
    return job, settings, reach_broker(settings)
