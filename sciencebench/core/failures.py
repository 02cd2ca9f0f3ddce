"""A trial's record, and the one way a failure becomes one.

`failure_record` is the record of a trial that failed with an exception of
ours or an unforeseen one: its type, its message cut to `MESSAGE_MAX_CHARS`,
its stage (the exception class's unless named) and, for an unforeseen one
(stage `worker`), the end of its traceback (`TRACEBACK_MAX_CHARS`).
`recorded_failure` reads a failure Pier recorded by class name: its stage and
whether another try would fail the same.
"""

from __future__ import annotations

import traceback
from datetime import UTC, datetime
from typing import Any

from sciencebench.core.errors import SciencebenchError, Stage, failure_class
from sciencebench.core.models import TrialRecord, TrialSpec
from sciencebench.core.pierjob import CANCELLED_TYPES, PIER_NOT_RETRIED

# The longest exception message a record keeps (its start), and the longest traceback (its end).
MESSAGE_MAX_CHARS = 2000
TRACEBACK_MAX_CHARS = 8000


def trial_record(spec: TrialSpec, *, worker: str, started: datetime, **fields: Any) -> TrialRecord:
    """A record of `spec` run by `worker`, started at `started`, finished now."""
    return TrialRecord(
        job_id=spec.job_id,
        job_name=spec.job_name,
        task_id=spec.task_id,
        attempt=spec.attempt,
        model=spec.model,
        worker=worker,
        started_at=started,
        finished_at=datetime.now(UTC),
        **fields,
    )


def failure_record(
    spec: TrialSpec, exc: BaseException, stage: Stage | None = None, *, worker: str, started: datetime,
    **fields: Any,
) -> TrialRecord:  # fmt: skip
    """The record of `spec` failed with `exc` in `stage` (default: the stage of `exc`'s class)."""
    if stage is None:
        stage = exc.stage if isinstance(exc, SciencebenchError) else Stage.WORKER
    if stage is Stage.WORKER:
        fields["exception_traceback"] = "".join(traceback.format_exception(exc))[-TRACEBACK_MAX_CHARS:]
    return trial_record(
        spec, worker=worker, started=started, exception_type=type(exc).__name__,
        exception_message=str(exc)[:MESSAGE_MAX_CHARS], stage=stage, **fields,
    )  # fmt: skip


def recorded_failure(exception_type: str) -> tuple[Stage, bool]:
    """The stage of a failure Pier recorded by class name, and whether another try would fail the same.

    One of ours (raised inside Pier: the network policy's) says both by its
    class; one of Pier's is a harness failure, deterministic when Pier itself
    would not retry it (`core.pierjob.PIER_NOT_RETRIED`) or its run was cancelled.
    """
    cls = failure_class(exception_type)
    if cls is not None:
        stage = cls.stage if cls.stage is not Stage.WORKER else Stage.HARNESS
        return stage, cls.deterministic
    return Stage.HARNESS, exception_type in PIER_NOT_RETRIED or exception_type in CANCELLED_TYPES
