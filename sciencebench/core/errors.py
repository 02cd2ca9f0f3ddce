"""The exception tree, drawn in `SciencebenchError`'s docstring.

Errors a user can fix before anything runs exit the CLI with code 2 and one
line (`InputError`); errors inside a trial (`TrialError`) become part of
that trial's record and never escape a Celery task (the chord finalizer
must always run). Every class says where a trial failed (`stage`) and
whether another try would fail the same (`deterministic`: then
--max-retries does not try it again). Pier records a failure raised inside
it by class name only; `failure_class` finds the class again.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import ClassVar


class Stage(StrEnum):
    """Where a trial failed: a record's `stage` (the strings records and files have always carried)."""

    TRIAL = "trial"
    ADMISSION = "admission"
    PREFLIGHT = "preflight"
    SLOT = "slot"
    WORKSPACE = "workspace"
    SECRETS = "secrets"
    PULL = "pull"
    POLICY = "policy"
    HARNESS = "harness"
    COLLECT = "collect"
    WORKER = "worker"  # nothing foresaw it: the record carries its traceback


class SciencebenchError(Exception):
    """Base of every error sciencebench raises on purpose.

    `stage`: where a trial that met it failed; `deterministic`: another try
    would fail the same (not tried again under --max-retries).

        SciencebenchError
        ├── InputError                  bad input on the login node: exit 2, nothing written
        │   ├── SelectionError          --path / selection.json / --task-id
        │   ├── TaskSpecError           task.toml, image refs, missing task files
        │   ├── ProfileError            --env-file and provider settings
        │   ├── JobConflictError        --job-name already used by another selection
        │   └── SettingsError           a SCIENCEBENCH_* environment variable is invalid
        ├── BrokerUnavailableError      Redis cannot be reached
        │   └── EmbeddedStoreError      this host's embedded store (`submit --local`) did not start or answer
        ├── PreflightError              a worker host cannot run trials now (one line why)
        ├── UnfitError                  a worker host cannot serve one job (cannot see its files)
        └── TrialError                  one trial failed in a named stage
            ├── RefusedError            the job asks for what a worker refuses to do; nothing ran
            ├── WorkspaceError          task dir unreadable / jobs dir unwritable
            ├── SecretsMismatchError    env file changed since submit
            ├── PullError               image pull or digest verification failed
            │   ├── NoRoomError         the image budget cannot fit the trial's images now (handed back)
            │   └── RegistryError       the registry pushed back (429, 5xx, reset, timeout): waited out
            ├── PolicyError             network policy (raised inside Pier): deterministic
            │   ├── PolicyRefused       refused before anything started
            │   ├── PolicyViolation     started containers/networks break the policy
            │   ├── TransferRefused     a copy to the host refused what a container wrote
            │   └── AgentImageMismatch  `agent_image` names another agent's image
            ├── HarnessError            Pier crashed, timed out or could not start
            │   └── HarnessTimeoutError Pier outran the trial's whole budget
            ├── ResourceLimitError      a trial container went past a host limit (its writable layer)
            ├── CollectError            Pier produced no usable trial directory
            │   └── OutputLimitError    the trial's outputs went past a bound (depth, entries, bytes)
            └── Cancelled               the job was cancelled before or while the trial ran

    Elsewhere in the package (each a SciencebenchError too): `bake.recipes.RecipeError`,
    `bake.offline.BakeError`, `bake.command.BakeFailed`, `worker.pier.zygote.ZygoteError`.
    """

    stage: ClassVar[Stage] = Stage.WORKER
    deterministic: ClassVar[bool] = True


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

    deterministic = False


class EmbeddedStoreError(BrokerUnavailableError):
    """This host's embedded store (a `--local` job's, no broker) did not start or does not answer.

    `directory`: where it keeps its socket, data and log (`<state dir>/store`).
    """

    def __init__(self, problem: str, directory: Path) -> None:
        super().__init__(problem)
        self.directory = directory


class PreflightError(SciencebenchError):
    """A worker host is not fit to run trials (the host's fault, not the job's)."""

    stage = Stage.PREFLIGHT
    deterministic = False


class UnfitError(SciencebenchError):
    """This worker host cannot serve one job (its files are not visible here); other hosts may."""

    stage = Stage.ADMISSION


class TrialError(SciencebenchError):
    """A trial failed in a named stage; recorded on the trial, never raised out of a task.

    Deterministic unless its class says otherwise.
    """

    stage = Stage.TRIAL


class RefusedError(TrialError):
    """The job asks for something a worker refuses to do (paths, harness keys, imports)."""

    stage = Stage.ADMISSION


class WorkspaceError(TrialError):
    """The task directory or the job directory is unusable from this worker."""

    stage = Stage.WORKSPACE


class SecretsMismatchError(TrialError):
    """An env file is unreadable here or changed since submit."""

    stage = Stage.SECRETS


class PullError(TrialError):
    """A pinned image could not be pulled or verified."""

    stage = Stage.PULL
    deterministic = False


class NoRoomError(PullError):
    """This host's image budget cannot fit the trial's images while its other trials run.

    Not the job's fault nor the host's: the trial goes back to the queue (another
    host may have room, or this one will when its trials end); the host is not paused.
    """

    deterministic = True


class RegistryError(PullError):
    """The registry, not the trial, failed a pull: 429 `toomanyrequests`, a 5xx, reset, refused, timed out.

    `registry` is its host (`docker.io`), `status` what it answered ("429",
    "503", "reset", "refused", "timeout"), `hint_sec` the wait it asked for
    (Retry-After, or its RateLimit headers), None when it named none; not
    `asked`: the pull was held back, the cluster backing off from the
    registry already (`hint_sec` the rest of that wait). The worker waits and
    tries again whatever --max-retries says, backing off per registry across
    the cluster (`coordination.registries`), up to the registry deadline; a
    trial that reaches it is recorded with `TrialRecord.registry_status`: not
    the model's failure, rerun by `retry --failed`.
    """

    deterministic = True  # its own waits replace --max-retries

    def __init__(
        self, message: str, registry: str, status: str, hint_sec: float | None = None, asked: bool = True
    ) -> None:
        super().__init__(message)
        self.registry, self.status, self.hint_sec, self.asked = registry, status, hint_sec, asked

    def __reduce__(self) -> tuple[type[RegistryError], tuple[str, str, str, float | None, bool]]:
        return (type(self), (str(self), self.registry, self.status, self.hint_sec, self.asked))


class PolicyError(TrialError):
    """The network policy refused the trial or its inspection failed.

    The policy environment (`sciencebench.network`) raises these inside Pier;
    Pier records the class name and message of each in the trial's
    `result.json` (`exception_info`), so messages name every failed check.
    They live here, not beside the environment, so that the worker finds
    them by name (`failure_class`) without importing the environment.
    """

    stage = Stage.POLICY


class PolicyRefused(PolicyError):
    """The trial cannot run under the offline network policy; nothing was started.

    The task allows internet, a gateway URL or the proxy image is unusable, or
    a compose task wants egress.
    """


class PolicyViolation(PolicyError):
    """Inspection found deviations from the policy; `violations` lists each failed check.

    The environment was stopped.
    """

    def __init__(self, violations: Sequence[str]) -> None:
        self.violations = list(violations)
        super().__init__(
            f"network policy inspection failed ({len(self.violations)} check(s)): "
            + "; ".join(self.violations)
        )

    def __reduce__(self) -> tuple[type[PolicyViolation], tuple[list[str]]]:
        # Exceptions pickle through their args; ours takes the list, not the message.
        return (type(self), (self.violations,))


class TransferRefused(PolicyError):
    """A copy between a container and the host refused what the container wrote (a link, a device, ...).

    `refusals` names each refused item (`network.transfer.Refusal`, or a string).
    """

    def __init__(self, refusals: Sequence[object]) -> None:
        self.refusals = list(refusals)
        shown = "; ".join(str(r) for r in self.refusals[:10])
        more = f"; and {len(self.refusals) - 10} more" if len(self.refusals) > 10 else ""
        super().__init__(f"host-side transfer refused {len(self.refusals)} item(s): {shown}{more}")

    def __reduce__(self) -> tuple[type[TransferRefused], tuple[list[object]]]:
        return (type(self), (self.refusals,))


class AgentImageMismatch(PolicyError):
    """The `agent_image` keyword names an image baked for another agent or version."""


class HarnessError(TrialError):
    """Pier crashed, timed out or could not start."""

    stage = Stage.HARNESS
    deterministic = False


class HarnessTimeoutError(HarnessError):
    """Pier outran the trial's whole budget; another try would too (as Pier's own timeouts)."""

    deterministic = True


class ResourceLimitError(TrialError):
    """A trial container went past a limit of its host (`worker --disk-limit`): the trial was ended.

    The same agent on the same task would again: deterministic.
    """

    stage = Stage.HARNESS


class CollectError(TrialError):
    """Pier left no usable trial directory."""

    stage = Stage.COLLECT
    deterministic = False


class OutputLimitError(CollectError):
    """What a trial's containers left went past a bound of its outputs (too deep, too many, too large).

    The same container would again: deterministic.
    """

    deterministic = True


class Cancelled(TrialError):
    """The job was cancelled before or while the trial ran (its record's type: `Cancelled`)."""

    stage = Stage.SLOT


def failure_class(name: str | None) -> type[SciencebenchError] | None:
    """The class of the tree named `name` (as Pier records one raised inside it), else None.

    Only classes of modules imported in this process are found; those Pier
    may record (the policy's) are defined in this module.
    """
    if not name:
        return None
    pending: list[type[SciencebenchError]] = [SciencebenchError]
    while pending:
        cls = pending.pop()
        if cls.__name__ == name:
            return cls
        pending += cls.__subclasses__()
    return None
