"""The exception tree.

Errors a user can fix before anything runs exit the CLI with code 2 and one
line; errors inside a trial become part of that trial's record and never
escape a Celery task (the chord finalizer must always run).

    SciencebenchError
    ├── InputError                  bad input on the login node: exit 2, nothing written
    │   ├── SelectionError          --path / selection.json / --task-id
    │   ├── TaskSpecError           task.toml, image refs, missing task files
    │   ├── ProfileError            --env-file and provider settings
    │   ├── JobConflictError        --job-name already used by another selection
    │   └── SettingsError           a SCIENCEBENCH_* environment variable is invalid
    ├── BrokerUnavailableError      Redis cannot be reached
    ├── PreflightError              a worker host cannot run trials now (one line why)
    ├── UnfitError                  a worker host cannot serve one job (cannot see its files)
    └── TrialError                  one trial failed in a named stage
        ├── RefusedError            the job asks for what a worker refuses to do; nothing ran
        ├── WorkspaceError          task dir unreadable / jobs dir unwritable
        ├── SecretsMismatchError    env file changed since submit
        ├── PullError               image pull or digest verification failed
        │   └── NoRoomError         the image budget cannot fit the trial's images now (handed back)
        ├── PolicyError             network policy refused or inspection failed
        ├── HarnessError            Pier crashed, timed out or was cancelled
        └── CollectError            Pier produced no usable trial directory
"""


class SciencebenchError(Exception):
    """Base of every error sciencebench raises on purpose."""


class InputError(SciencebenchError):
    """Bad input on the login node; the CLI prints one line and exits 2."""


class SelectionError(InputError):
    """The selection directory, selection.json or --task-id is unusable."""


class TaskSpecError(InputError):
    """A task directory or its task.toml is not acceptable."""


class ProfileError(InputError):
    """An env file or provider setting is unusable."""


class JobConflictError(InputError):
    """A job name is already used by a different selection or configuration."""


class SettingsError(InputError):
    """A SCIENCEBENCH_* environment variable has a value that cannot be used."""


class BrokerUnavailableError(SciencebenchError):
    """The broker cannot be reached."""


class PreflightError(SciencebenchError):
    """A worker host is not fit to run trials."""


class UnfitError(SciencebenchError):
    """This worker host cannot serve one job (its files are not visible here); other hosts may."""


class TrialError(SciencebenchError):
    """A trial failed in a named stage; recorded on the trial, never raised out of a task.

    `retryable`: another try (under --max-retries) may succeed.
    """

    stage = "trial"
    retryable = False


class RefusedError(TrialError):
    """The job asks for something a worker refuses to do (paths, harness keys, imports)."""

    stage = "admission"


class WorkspaceError(TrialError):
    """The task directory or the job directory is unusable from this worker."""

    stage = "workspace"


class SecretsMismatchError(TrialError):
    """An env file is unreadable here or changed since submit."""

    stage = "secrets"


class PullError(TrialError):
    """A pinned image could not be pulled or verified."""

    stage = "pull"
    retryable = True


class NoRoomError(PullError):
    """This host's image budget cannot fit the trial's images while its other trials run.

    Not the job's fault nor the host's: the trial goes back to the queue (another
    host may have room, or this one will when its trials end); the host is not paused.
    """

    retryable = False


class PolicyError(TrialError):
    """The network policy refused the trial or its inspection failed."""

    stage = "policy"


class HarnessError(TrialError):
    """Pier crashed, timed out or could not start."""

    stage = "harness"
    retryable = True


class HarnessTimeoutError(HarnessError):
    """Pier outran the trial's whole budget; another try would too (as Pier's own timeouts)."""

    retryable = False


class CollectError(TrialError):
    """Pier left no usable trial directory."""

    stage = "collect"
    retryable = True
