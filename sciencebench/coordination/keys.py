"""The store's keys: every piece of coordination state has one name.

The table below the imports lists every key, `JobKeys` and `ClusterKeys`
build each (`tests/unit/test_store_keys.py` checks they agree); the Lua
scripts get them by name (`coordination.scripts.store_keys`).
"""

from __future__ import annotations

# Keys (Redis), for a job `J` (the submit's job id, a UUID) and a trial key `K` = `<task id>#<attempt>`:
#
#   sciencebench:jobs                 set of job ids with live state
#   sciencebench:hosts                hash host -> last heartbeat (the store's clock, s)
#   sciencebench:hosts:paused         hash host -> why it takes no trials now
#   sciencebench:hosts:kit            hash host -> HostKit JSON: its agent install, proxy image, roots
#   sciencebench:hosts:images         hash host -> its image-budget line (`report_images`)
#   sciencebench:hosts:holds          hash host -> HostImages JSON: the task images it holds (placement)
#   sciencebench:room:<host>          zset J/K -> expiry (ms, the server's clock): trials holding its capacity
#   sciencebench:room:<host>:requests hash J/K -> "<cpus> <memory_mb>": what each holds (`Slots.take_room`)
#   sciencebench:place:routed         hash J/K -> Routed JSON: the host a trial was placed on, until when
#   sciencebench:place:pulling        hash repository@digest -> Pulling JSON: a host pulling it for placement
#   sciencebench:J:result:K           the trial's TrialRecord JSON
#   sciencebench:J:counted:K          the chord has been told about K
#   sciencebench:J:lease:K            owner id, expires unless renewed
#   sciencebench:J:parking:K          a parked lease on its way to `lease:K` (`lib/park_absent.lua`)
#   sciencebench:J:running            hash K -> Redispatch JSON
#   sciencebench:J:slots              zset K -> slot expiry (ms, the server's clock)
#   sciencebench:J:waiting            list of trial keys waiting for a slot, oldest first
#   sciencebench:J:waiting:payloads   hash K -> the Redispatch JSON to send it with
#   sciencebench:J:held               zset H -> -(expected seconds): trials not sent yet (H = <rank>/<K>)
#   sciencebench:J:held:payloads      hash H -> the Redispatch JSON to send it with
#   sciencebench:J:held:tasks         hash task id -> JSON list of its held H, until the task is measured
#   sciencebench:J:held:probe         set of sent K whose record would measure a held task
#   sciencebench:J:held:meta          hash: window (trials kept in the broker), at (last release, s)
#   sciencebench:J:state              hash K -> TrialStatus JSON
#   sciencebench:J:unfit              hash host -> Unfit JSON: why it cannot serve the job, since when
#   sciencebench:J:cancelled          present when the job is cancelled
#   sciencebench:J:dispatches         set of the job's open chords (dispatch ids; `open_dispatch`)
#   sciencebench:lock:<name>          short-lived mutual exclusion (e.g. one re-dispatch)
#   sciencebench:history              hash <task id>/<task hash>/<agent> -> JSON [[seconds, job id], ...];
#                                     also cost/<...> fields (`coordination.costs`)
#   sciencebench:J:budget             hash: limits, spend, reached_at (`coordination.budget`)
#   sciencebench:J:budget:started     hash K -> when the budget let it start (the store's clock, s)
#   sciencebench:shares               hash J -> Share JSON (`coordination.shares`)
#   sciencebench:shares:weights       hash user:<name> | job:J -> an operator's weight
#   sciencebench:J:share:sent         set of K sent by fair share, not yet started
#   sciencebench:J:requests           hash K -> "<cpus> <memory_mb>": what the trial asks (fair share)
#   sciencebench:gateways             set of gateway authorities ever limited (`coordination.gateways`)
#   sciencebench:gateway:<authority>  hash: limit, ceiling, status, reason, at
#   sciencebench:gateway:<authority>:slots  zset member -> lease expiry (ms, the server's clock)
#   sciencebench:registry:<host>      hash: not_before, status, reason, failures, at (`registries`)
#   sciencebench:mirror-pull:<digest> redis-py lock: a host's first pull of an image through a
#                                     registry mirror (`registries.first_pull`)

PREFIX = "sciencebench"


class ClusterKeys:
    """The keys of the whole cluster's state (no job's), as the table above lists them."""

    jobs = f"{PREFIX}:jobs"
    hosts = f"{PREFIX}:hosts"
    paused = f"{PREFIX}:hosts:paused"
    kit = f"{PREFIX}:hosts:kit"
    images = f"{PREFIX}:hosts:images"
    holds = f"{PREFIX}:hosts:holds"
    routed = f"{PREFIX}:place:routed"
    pulling = f"{PREFIX}:place:pulling"
    history = f"{PREFIX}:history"
    shares = f"{PREFIX}:shares"
    weights = f"{PREFIX}:shares:weights"
    gateways = f"{PREFIX}:gateways"
    # What every job's keys start with, before the job id: the scripts that loop over jobs take it.
    job_prefix = f"{PREFIX}:"

    @staticmethod
    def lock(name: str) -> str:
        """A short-lived mutual exclusion (`Leases.try_lock`)."""
        return f"{PREFIX}:lock:{name}"

    @staticmethod
    def room(host: str) -> str:
        """The trials holding part of a worker host's capacity, with their leases' expiry."""
        return f"{PREFIX}:room:{host}"

    @staticmethod
    def room_requests(host: str) -> str:
        """What each trial holding part of a host's capacity requests."""
        return f"{PREFIX}:room:{host}:requests"

    @staticmethod
    def gateway(authority: str) -> str:
        """A model gateway's limit (`coordination.gateways`)."""
        return f"{PREFIX}:gateway:{authority}"

    @staticmethod
    def registry(host: str) -> str:
        """An image registry that pushed back (`coordination.registries`)."""
        return f"{PREFIX}:registry:{host}"

    @staticmethod
    def mirror_pull(digest: str) -> str:
        """The lock of a first pull of the image `digest` through a mirror (`registries.first_pull`)."""
        return f"{PREFIX}:mirror-pull:{digest}"

    @staticmethod
    def gateway_slots(authority: str) -> str:
        """A model gateway's held slots."""
        return f"{PREFIX}:gateway:{authority}:slots"


class JobKeys:
    """Every key of one job's state, `sciencebench:<job>:...`, as the table above lists them."""

    __slots__ = ("_base", "budget", "budget_started", "cancelled", "dispatches", "held", "held_meta",
                 "held_payloads", "held_probe", "held_tasks", "job", "requests", "running", "share_sent",
                 "slots", "state", "unfit", "waiting", "waiting_payloads")  # fmt: skip

    def __init__(self, job: str) -> None:
        self.job = job
        self._base = base = f"{PREFIX}:{job}"
        self.running = f"{base}:running"
        self.slots = f"{base}:slots"
        self.waiting = f"{base}:waiting"
        self.waiting_payloads = f"{base}:waiting:payloads"
        self.held = f"{base}:held"
        self.held_payloads = f"{base}:held:payloads"
        self.held_tasks = f"{base}:held:tasks"
        self.held_probe = f"{base}:held:probe"
        self.held_meta = f"{base}:held:meta"
        self.state = f"{base}:state"
        self.unfit = f"{base}:unfit"
        self.cancelled = f"{base}:cancelled"
        self.dispatches = f"{base}:dispatches"
        self.budget = f"{base}:budget"
        self.budget_started = f"{base}:budget:started"
        self.share_sent = f"{base}:share:sent"
        self.requests = f"{base}:requests"

    def result(self, key: str) -> str:
        """The trial's record (`key`: its trial key; "" gives the prefix a script completes)."""
        return f"{self._base}:result:{key}"

    def counted(self, key: str) -> str:
        """Present once the chord counted the trial."""
        return f"{self._base}:counted:{key}"

    def lease(self, key: str) -> str:
        """The trial's lease ("" gives the prefix a script completes)."""
        return f"{self._base}:lease:{key}"

    def parking(self, key: str) -> str:
        """A parked lease on its way to `lease(key)` (`lua/lib/park_absent.lua` builds it from the lease)."""
        return f"{self._base}:parking:{key}"

    def pattern(self) -> str:
        """A `SCAN` pattern matching every key of the job."""
        return f"{self._base}:*"


# The cluster's keys by the names the modules import.
JOBS_KEY = ClusterKeys.jobs
HOSTS_KEY = ClusterKeys.hosts
PAUSED_KEY = ClusterKeys.paused
IMAGES_KEY = ClusterKeys.images
KIT_KEY = ClusterKeys.kit
HISTORY_KEY = ClusterKeys.history
SHARES_KEY = ClusterKeys.shares
WEIGHTS_KEY = ClusterKeys.weights
HOLDS_KEY = ClusterKeys.holds
ROUTED_KEY = ClusterKeys.routed
PULLING_KEY = ClusterKeys.pulling
GATEWAYS_KEY = ClusterKeys.gateways


def parking_token(task_id: str) -> str:
    """The token a trial's lease is parked under while its message is on the way: the message may take it."""
    return f"parked:{task_id}"
