"""Send a job's trials as one chord: one `run_trial` per trial, `finalize_job` as its body."""

from __future__ import annotations

import uuid
from typing import Any, cast

from celery import Celery, Signature, chord, group
from celery.result import AsyncResult

from sciencebench.coordination.protocol import Coordinator
from sciencebench.core.models import JobSpec, TrialSpec, TrialState
from sciencebench.core.wire import FINALIZE_JOB, RUN_TRIAL, finalize_shadow, trial_shadow

# Broker operations buffered per Redis round trip while a chord's header is
# published (each trial is one queue push and, with task events on, one
# task-sent event).
PUBLISH_BATCH_OPS = 2000


def dispatch(app: Celery, coord: Coordinator, job: JobSpec, trials: list[TrialSpec]) -> AsyncResult[object]:
    """chord(group(run_trial per trial), finalize_job): longest trials first.

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
    header = [
        app.signature(
            RUN_TRIAL,
            args=(trial.model_dump(mode="json"),),
            options={
                "task_id": str(uuid.uuid4()),
                "shadow": trial_shadow(trial.job_name, trial.task_id, trial.attempt),
                "argsrepr": repr(trial.label),
                "kwargsrepr": "{}",
            },
        )
        for trial in trials
    ]
    coord.set_states(job.job_key, [trial.key for trial in trials], TrialState.QUEUED)
    if trials:
        coord.open_dispatch(job.job_key, dispatch_id)  # closed by its finalizer
    return send_chord(app, header, finalize)


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
    group_id = str(uuid.uuid4())
    body = body.clone()
    body_result: AsyncResult[object] = body.freeze(str(uuid.uuid4()), group_id=group_id)
    amqp = app.amqp
    app.backend.set_chord_size(group_id, len(header))
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
                group_id=group_id, group_index=index, chord=body, shadow=shadow,
                reply_to=app.thread_oid, create_sent_event=app.conf.task_send_sent_event,
                **explicit, **options,
            )  # fmt: skip
            if index:  # the first message declares its queue, as `send_task` does; the rest need not
                options.setdefault("declare", [])
            amqp.send_task_message(producer, name, message, **options)
    return body_result


_REFUSED_OPTIONS = ("countdown", "eta", "expires", "link", "link_error", "chain", "chord", "group_id")
# Options `send_task` hands to the message factory itself rather than to the publisher.
_EXPLICIT_OPTIONS = ("time_limit", "soft_time_limit", "ignore_result")
