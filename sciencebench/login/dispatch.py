"""Send a job's trials as one chord: one `run_trial` per trial, `finalize_job` as its body."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, cast

from celery import Celery, Signature, chord, group
from celery.result import AsyncResult

from sciencebench.coordination.history import ordering_estimates
from sciencebench.coordination.protocol import Coordinator, Held
from sciencebench.coordination.shares import Share, cluster_slots, fill
from sciencebench.coordination.watchdog import send_again
from sciencebench.core.capacity import DEFAULT_CPUS, DEFAULT_MEMORY_MB
from sciencebench.core.models import JobSpec, Redispatch, TrialSpec, TrialState
from sciencebench.core.settings import Settings
from sciencebench.core.wire import FINALIZE_JOB, finalize_shadow, run_trial_message
from sciencebench.login.plan import Schedule, expected_seconds, order, schedule

log = logging.getLogger(__name__)

# Broker operations buffered per Redis round trip while a chord's header is
# published (each trial is one queue push and, with task events on, one
# task-sent event).
PUBLISH_BATCH_OPS = 2000


def dispatch(
    app: Celery, coord: Coordinator, job: JobSpec, trials: list[TrialSpec], lease_seconds: float | None = None
) -> AsyncResult[object]:
    """chord(group(run_trial per trial), finalize_job): longest expected trials first.

    Under fair share (`coordination.shares`: the worker hosts report their
    slots) every trial is held in the store and only what free slots the job
    may take now is sent (`shares.fill`); each trial's end sends the next
    trial of the job furthest below its share. Without reported slots (older
    workers) a job is sent as follows.

    Trials are ordered by what their tasks measured before (the store's
    history for these task versions and this agent, else other agents' of the
    same versions: `coordination.history.ordering_estimates`), else by their
    timeouts (`login.plan.order`). When a task has several trials, only the job's
    `--n-concurrent` go to the broker now and the rest are held in the store
    (`login.plan.schedule`, `Slots.hold`): each trial's end sends the one then
    expected to run longest, measured by the job's first finished trial of its
    task. Held trials are chord members like the rest (the chord's size counts
    them); the watchdog sends them should every wake-up be lost.

    The chord is open (`JobControl.open_dispatch`) until its finalizer runs,
    so `retry --failed` knows whether the job's trials are still on their way.

    Each message carries a Celery `shadow` name (`trial <job>/task_<id>#<attempt>`,
    the body `finalize <job>`), which Flower, its search and worker logs show
    instead of the task name; its arguments show as the trial's label only.
    """
    dispatch_id = uuid.uuid4().hex
    finalize = app.signature(
        FINALIZE_JOB, args=(str(job.jobs_dir), job.job_name, job.job_key, dispatch_id), immutable=True,
        options={"shadow": finalize_shadow(job.job_name)},
    )  # fmt: skip
    measured = ordering_estimates(coord, job)
    lease = lease_seconds if lease_seconds is not None else Settings.from_env().lease_seconds
    # Fair share counts each of its trials as holding the largest request among them (`core.capacity`).
    share = Share(user=job.user or "unknown", weight=job.weight, cap=job.n_concurrent, name=job.job_name,
                  at=coord.now(), placement=job.placement,
                  cpus=max((t.cpus for t in trials), default=DEFAULT_CPUS),
                  memory_mb=max((t.memory_mb for t in trials), default=DEFAULT_MEMORY_MB))  # fmt: skip
    coord.register_share(job.job_key, share)
    shared = cluster_slots(coord, lease) > 0
    plan = (
        Schedule(send=[], hold=order(trials, measured))
        if shared
        else schedule(trials, measured, job.n_concurrent)
    )
    ordered = plan.send + plan.hold
    messages = [run_trial_message(trial, str(uuid.uuid4())) for trial in ordered]
    header = [app.signature(m.name, args=m.args, options=m.options) for m in messages]
    coord.set_states(job.job_key, [trial.key for trial in ordered], TrialState.QUEUED)
    if ordered:
        coord.open_dispatch(job.job_key, dispatch_id)  # closed by its finalizer
    if not plan.hold:
        return send_chord(app, header, finalize)
    frozen = freeze_chord(app, finalize, len(header))
    chord_body = json.loads(json.dumps(frozen.body))  # as a worker reads it from a message
    held = []
    for index in range(len(plan.send), len(ordered)):
        trial = ordered[index]
        payload = Redispatch(
            task_id=str(header[index].options["task_id"]), trial=trial, chord=chord_body,
            group_id=frozen.group_id, group_index=index,
        )  # fmt: skip
        held.append(Held(payload=payload, expected_sec=expected_seconds(trial, measured)))
    coord.hold(job.job_key, held, [trial.key for trial in plan.send], job.n_concurrent)
    try:
        publish_header(app, frozen, header[: len(plan.send)])
    except BaseException:
        with contextlib.suppress(Exception):
            coord.release_held(job.job_key, None)  # dropped: nothing is left to send them
        raise
    if shared:
        try:
            fill(app, coord, lease)
        except Exception:  # they wait in the store: the next trial's end or watchdog scan sends them
            log.warning("job %s: could not send its first trials now", job.job_name, exc_info=True)
    return frozen.result


def release_held(app: Celery, coord: Coordinator, job: JobSpec, lease_seconds: float) -> int:
    """Send every held trial of the job now (e.g. once it is cancelled: they end at once); the count.

    Each is taken with a running entry and a lease parked for `lease_seconds`:
    those this process could not send (interrupted, the broker gone) the
    watchdog sends once their park lapses.
    """
    payloads = coord.release_held(job.job_key, lease_seconds)
    for payload in payloads:
        send_again(app, coord, payload)
    return len(payloads)


@dataclass(frozen=True)
class FrozenChord:
    """A chord whose body is frozen and whose size is stored: header messages may now be sent."""

    group_id: str
    body: Signature[Any]
    result: AsyncResult[object]


def freeze_chord(app: Celery, body: Signature[Any], size: int) -> FrozenChord:
    """Freeze the chord body into a new group and store the chord's size (`size` header tasks)."""
    group_id = str(uuid.uuid4())
    body = body.clone()
    result: AsyncResult[object] = body.freeze(str(uuid.uuid4()), group_id=group_id)
    app.backend.set_chord_size(group_id, size)
    return FrozenChord(group_id=group_id, body=body, result=result)


def send_chord(app: Celery, header: list[Signature[Any]], body: Signature[Any]) -> AsyncResult[object]:
    """`chord(header)(body)` for a flat header, published in Redis pipelines.

    Celery's chord on a Redis result backend is: the body frozen into the
    header's group, the chord size stored under the group id, and one task
    message per header task naming the group, its index and the body; each
    header task that returns counts itself and the last one sends the body.
    This builds exactly those messages with Celery's own message factory
    (`app.amqp.create_task_message`, the options `send_task` would give it)
    and sends them with Celery's own sender (`app.amqp.send_task_message`,
    which routes and emits the task-sent event), through one producer inside
    kombu's `Producer.batch()`: queue pushes and events go out in pipelines
    of `PUBLISH_BATCH_OPS` commands instead of one round trip each.

    Left out is client-side bookkeeping a submit never uses: a result
    subscription per header task (`backend.on_task_call`, and the barrier of
    a `GroupResult`), a SUBSCRIBE and an UNSUBSCRIBE round trip each; so the
    returned body result has no `parent` GroupResult. The chord size is
    stored before the first message goes out. Header signatures may carry a
    `task_id` and message options (`shadow`, `argsrepr`, routing);
    countdowns, expiry and links are refused.
    """
    if not header:
        empty: AsyncResult[object] = chord(group([], app=app))(body)  # Celery runs the body at once
        return empty
    frozen = freeze_chord(app, body, len(header))
    publish_header(app, frozen, header)
    return frozen.result


def publish_header(app: Celery, frozen: FrozenChord, header: list[Signature[Any]]) -> None:
    """Send header tasks of a frozen chord, each as its member at its index in `header` (see `send_chord`)."""
    amqp = app.amqp
    with app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_BATCH_OPS):
        for index, sig in enumerate(header):
            name = sig.task
            assert name is not None, "a chord header task needs a name"
            task_type = app.tasks.get(name)
            args, kwargs = tuple(sig.args), dict(sig.kwargs)
            # As `Task.apply_async` and `send_task`: the task's own execution
            # options, then the signature's.
            defaults: dict[str, Any] = getattr(task_type, "_get_exec_options", dict)()
            options = {**{k: v for k, v in defaults.items() if v is not None}, **sig.options}
            refused = [key for key in _REFUSED_OPTIONS if options.get(key) is not None]
            if refused:
                raise ValueError(f"send_chord: header task option(s) {refused} are not supported")
            shadow = options.pop("shadow", None)
            if task_type is not None:
                options.setdefault("ignore_result", task_type.ignore_result)
                shadow = shadow or cast(Any, task_type).shadow_name(args, kwargs, options)
            task_id = options.pop("task_id", None) or str(uuid.uuid4())
            explicit = {key: options.pop(key, None) for key in _EXPLICIT_OPTIONS}
            options = amqp.router.route(options, name, args, kwargs, cast(Any, task_type))
            message = amqp.create_task_message(
                task_id, name, args, kwargs,
                group_id=frozen.group_id, group_index=index, chord=frozen.body, shadow=shadow,
                reply_to=app.thread_oid, create_sent_event=app.conf.task_send_sent_event,
                **explicit, **options,
            )  # fmt: skip
            if index:  # the first message declares its queue, as `send_task` does; the rest need not
                options.setdefault("declare", [])
            amqp.send_task_message(producer, name, message, **options)


_REFUSED_OPTIONS = ("countdown", "eta", "expires", "link", "link_error", "chain", "chord", "group_id")
# Options `send_task` hands to the message factory itself rather than to the publisher.
_EXPLICIT_OPTIONS = ("time_limit", "soft_time_limit", "ignore_result")
