"""Planning a job (pure): selection x attempts -> trial specs, in the order they are sent."""

from __future__ import annotations

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
    """Selection x attempts -> trial specs, longest expected first.

    Sending long trials first shortens the tail of a job: the last trial to
    start is a short one. Ties keep selection order, then attempt order.
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
        for attempt in range(1, job.n_attempts + 1):
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
                )
            )
    # sorted() is stable, so equal expectations keep selection and attempt order.
    return sorted(trials, key=lambda trial: -trial.expected_sec)
