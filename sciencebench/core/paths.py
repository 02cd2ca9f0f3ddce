"""The jobs layout: one frozen paths object.

    <jobs-dir>/<job-name>/
    ├── result.json                  Pier JobResult shape, written by the finalizer
    ├── summary.json                 {generated_at, jobs_dir, trial_count, rows}
    ├── summary.csv                  one row per trial directory
    ├── task_002__a1b2c3d/           a trial directory exactly as Pier writes it
    │   ├── result.json, config.json, trial.log, agent/, artifacts/
    │   ├── verifier/{reward.txt, reward.json, ctrf.json, test-stdout.txt}
    │   └── network-policy-<session>.json
    └── .sciencebench/
        ├── job.json                 the JobSpec of the submit
        ├── trials/002-1.json        the latest TrialRecord of task 002, attempt 1
        ├── scratch/<id>-<attempt>.<owner>/  private Pier job directories of running trials
        └── superseded/              trial directories replaced by a later run

Scratch lives inside the job directory so that moving a finished trial into
place is a rename on one filesystem: a trial directory is either absent or
complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Where jobs go unless --jobs-dir says otherwise (relative to the working directory).
DEFAULT_JOBS_DIR = Path("jobs")


@dataclass(frozen=True)
class JobPaths:
    """The paths of one job under its jobs directory (see the module docstring)."""

    jobs_dir: Path
    job_name: str

    @property
    def job_dir(self) -> Path:
        """`<jobs dir>/<job name>`."""
        return self.jobs_dir / self.job_name

    @property
    def result_json(self) -> Path:
        """The job's `result.json` (Pier's JobResult shape)."""
        return self.job_dir / "result.json"

    @property
    def summary_json(self) -> Path:
        """`summary.json`."""
        return self.job_dir / "summary.json"

    @property
    def summary_csv(self) -> Path:
        """`summary.csv`."""
        return self.job_dir / "summary.csv"

    @property
    def meta_dir(self) -> Path:
        """The job's own sciencebench files: `.sciencebench/`."""
        return self.job_dir / ".sciencebench"

    @property
    def job_spec(self) -> Path:
        """The job's JobSpec: `.sciencebench/job.json`."""
        return self.meta_dir / "job.json"

    @property
    def trials_dir(self) -> Path:
        """Where trial records go: `.sciencebench/trials/`."""
        return self.meta_dir / "trials"

    @property
    def scratch_dir(self) -> Path:
        """Private Pier job directories of running trials."""
        return self.meta_dir / "scratch"

    def trial_record(self, task_id: str, attempt: int) -> Path:
        """The record of one trial: `.sciencebench/trials/<task id>-<attempt>.json`."""
        return self.trials_dir / f"{task_id}-{attempt}.json"


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write a file so readers see the old content or the new, never a part.

    The temporary file sits beside the target (same filesystem) and is
    fsynced before the rename.
    """
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
