"""`sciencebench submit` (no --wait) with stock Celery dispatch: the "before" of dispatch.py.

    python -m bench.stock_submit --path SEL --n-attempts 10 --jobs-dir J --job-name N

Does what `sciencebench submit` does (validate, write job.json and the run
record, mark the trials queued) and sends the same header signatures with
`chord(group(header))(body)`, as `sciencebench.login.dispatch.dispatch` did before
it published through one batched producer. The benchmark times this process
beside the real `sciencebench submit`, so the effect of that change is
measured in the same run.
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", type=Path, required=True)
    parser.add_argument("--n-attempts", type=int, default=1)
    parser.add_argument("--n-concurrent", type=int, default=1)  # as submit's; the stock chord sends all
    parser.add_argument("--jobs-dir", type=Path, required=True)
    parser.add_argument("--job-name", required=True)
    args = parser.parse_args()

    from celery import chord, group

    from bench.sb import (
        FINALIZE_JOB,
        RUN_TRIAL,
        Cluster,
        RedisCoordinator,
        Settings,
        SubmitOptions,
        build_run_record,
        create_app,
        persist,
        prepare,
    )

    opts = SubmitOptions(
        path=args.path, n_attempts=args.n_attempts, n_concurrent=args.n_concurrent, jobs_dir=args.jobs_dir,
        job_name=args.job_name,
    )  # fmt: skip
    settings = Settings.from_env()
    coord = RedisCoordinator(settings.broker_url)
    coord.ping()
    prepared = prepare(opts, hosts=lambda: Cluster.live(coord, settings.lease_seconds))
    record = build_run_record(prepared.job, prepared.trials[0], settings.broker_url, prepared.secret_values)
    prepared = persist(prepared, record)
    app = create_app(settings)
    job, trials = prepared.job, prepared.trials
    finalize = app.signature(
        FINALIZE_JOB, args=(str(job.jobs_dir), job.job_name, job.job_key), immutable=True
    )
    header = group(
        app.signature(
            RUN_TRIAL,
            args=(trial.model_dump(mode="json"),),
            options={"task_id": str(uuid.uuid4()), "argsrepr": repr(trial.label), "kwargsrepr": "{}"},
        )
        for trial in trials
    )
    coord.set_states(job.job_key, [trial.key for trial in trials], "queued")
    chord(header)(finalize)
    print(f"submitted job {job.job_name}: {len(trials)} trial(s)")


if __name__ == "__main__":
    main()
