"""The store's keys: every piece of coordination state has one name.

The table below the imports lists every key; the Lua scripts name the keys
they take alike (`coordination.scripts.store_keys`).
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
#   sciencebench:place:routed         hash J/K -> Routed JSON: the host a trial was placed on, until when
#   sciencebench:place:pulling        hash repository@digest -> Pulling JSON: a host pulling it for placement
#   sciencebench:J:result:K           the trial's TrialRecord JSON
#   sciencebench:J:counted:K          the chord has been told about K
#   sciencebench:J:lease:K            owner id, expires unless renewed
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
#   sciencebench:gateways             set of gateway authorities ever limited (`coordination.gateways`)
#   sciencebench:gateway:<authority>  hash: limit, ceiling, status, reason, at
#   sciencebench:gateway:<authority>:slots  zset member -> lease expiry (ms, the server's clock)

PREFIX = "sciencebench"
JOBS_KEY = f"{PREFIX}:jobs"
HOSTS_KEY = f"{PREFIX}:hosts"
PAUSED_KEY = f"{PREFIX}:hosts:paused"
IMAGES_KEY = f"{PREFIX}:hosts:images"
KIT_KEY = f"{PREFIX}:hosts:kit"
HISTORY_KEY = f"{PREFIX}:history"
SHARES_KEY = f"{PREFIX}:shares"
WEIGHTS_KEY = f"{PREFIX}:shares:weights"
HOLDS_KEY = f"{PREFIX}:hosts:holds"
ROUTED_KEY = f"{PREFIX}:place:routed"
PULLING_KEY = f"{PREFIX}:place:pulling"
GATEWAYS_KEY = f"{PREFIX}:gateways"


def job_key(job: str, *parts: str) -> str:
    """The name of one piece of a job's state: `sciencebench:<job>:<part>:...`."""
    return ":".join((PREFIX, job, *parts))


def gateway_key(authority: str, *parts: str) -> str:
    """A model gateway's limit (`coordination.gateways`): `sciencebench:gateway:<authority>[:part]`."""
    return ":".join((PREFIX, "gateway", authority, *parts))


def parking_token(task_id: str) -> str:
    """The token a trial's lease is parked under while its message is on the way: the message may take it."""
    return f"parked:{task_id}"
