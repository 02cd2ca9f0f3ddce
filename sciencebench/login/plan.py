"""Planning a job (pure): selection x attempts -> trial specs, in the order they are sent.

expand     selection x attempts -> trials, longest expected first by their timeouts
order      the same, a task's measured seconds (its history: this agent's, else
           other agents' of the same task version, scaled) standing in for its timeouts
schedule   which trials the broker gets now, and which are held back until
           trials of the job end (so a first attempt's measurement can
           order the task's later attempts)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sciencebench.core.models import JobSpec, TrialSpec
from sciencebench.login.agentimages import trial_image_refs
from sciencebench.login.selection import Selection


def expected_trial_seconds(
    agent_timeout_sec: float,
    verifier_timeout_sec: float,
    build_timeout_sec: float,
    agent_multiplier: float | None,
    verifier_multiplier: float | None,
) -> float:
    """The longest a trial may legitimately run: agent + verifier + image build."""
    return (
        agent_timeout_sec * (agent_multiplier or 1.0)
        + verifier_timeout_sec * (verifier_multiplier or 1.0)
        + build_timeout_sec * (verifier_multiplier or 1.0)
    )


def expand(selection: Selection, job: JobSpec, toml_hashes: dict[str, str]) -> list[TrialSpec]:
    """Selection x models x attempts -> trial specs, longest expected first (`order` without history).

    Sending long trials first shortens the tail of a job: the last trial to
    start is a short one. Ties go by attempt, then selection order: every
    task's first attempt before any second one.
    """
    trials = []
    for task_id in selection.task_ids:
        task = selection.tasks[task_id]
        expected = expected_trial_seconds(
            task.agent_timeout_sec,
            task.verifier_timeout_sec,
            task.build_timeout_sec,
            job.agent_timeout_multiplier,
            job.verifier_timeout_multiplier,
        )
        for attempt in range(1, job.trials_per_task + 1):
            trials.append(
                TrialSpec(
                    job_id=job.job_id,
                    job_name=job.job_name,
                    jobs_dir=job.jobs_dir,
                    task_id=task_id,
                    attempt=attempt,
                    task_dir=task.directory,
                    task_toml_sha256=toml_hashes[task_id],
                    image_refs=trial_image_refs(task.image_refs, job.agent_images.get(task_id)),
                    expected_sec=expected,
                    model=job.trial_model(attempt),
                    cpus=task.request.cpus,
                    memory_mb=task.request.memory_mb,
                )
            )
    return order(trials, {})


def expected_seconds(trial: TrialSpec, measured: Mapping[str, float]) -> float:
    """How long a trial should run: its task's measured seconds if known, else its timeouts' bound."""
    return measured.get(trial.task_id, trial.expected_sec)


def order(trials: list[TrialSpec], measured: Mapping[str, float]) -> list[TrialSpec]:
    """The trials longest expected first (`expected_seconds`); ties by attempt, then by task order.

    `measured` is task id -> seconds (`coordination.history.ordering_estimates`:
    this agent's history of the task version, else other agents' of it scaled
    to this agent): where timeouts say little (most tasks share the default),
    what a task took before is the better guide. A task without history keeps its timeouts'
    bound, which is larger than any measurement: it goes early, so a long
    unknown task does not start last, and is measured soonest. Task order is
    the order of first appearance in `trials`.
    """
    position: dict[str, int] = {}
    for trial in trials:
        position.setdefault(trial.task_id, len(position))
    return sorted(trials, key=lambda t: (-expected_seconds(t, measured), t.attempt, position[t.task_id]))


@dataclass(frozen=True)
class Schedule:
    """A job's trials as dispatch sends them: `send` now, in order; `hold` later, longest expected first."""

    send: list[TrialSpec]
    hold: list[TrialSpec]


def schedule(trials: list[TrialSpec], measured: Mapping[str, float], window: int) -> Schedule:
    """Order the trials; hold back all but the first `window` when a measurement can reorder them.

    A broker queue cannot be reordered once sent, and the job's first
    finished attempt of a task says more about its other attempts than any
    timeout. So when a task has several trials here (`--n-attempts` > 1),
    only `window` trials (the job's `--n-concurrent`: more could not run at
    once anyway) go to the broker now; each trial's end sends the held trial
    then expected to run longest (`Slots.next_waiting`), measured by the
    job's own finished trial of its task when there is one. With one trial
    per task nothing could reorder them: all are sent at once.
    """
    ordered = order(trials, measured)
    repeated = len({t.task_id for t in ordered}) < len(ordered)
    if not repeated or len(ordered) <= window:
        return Schedule(send=ordered, hold=[])
    return Schedule(send=ordered[:window], hold=ordered[window:])
