"""The board and fair share over Redis: trial states, worker hosts, the shares of the cluster's slots."""

from __future__ import annotations

import time
from typing import Any, override

from redis.typing import EncodableT

from sciencebench.coordination import scripts, shares
from sciencebench.coordination.keys import SHARES_KEY, WEIGHTS_KEY, ClusterKeys, JobKeys
from sciencebench.coordination.protocol import (
    HOSTS_KEY,
    IMAGES_KEY,
    KIT_KEY,
    PAUSED_KEY,
    Board,
    HostKit,
    HostStatus,
)
from sciencebench.coordination.redis.base import OUTAGE_SEC, RedisBase
from sciencebench.coordination.shares import Shares
from sciencebench.core.capacity import Request
from sciencebench.core.models import TrialState, TrialStatus


class RedisBoard(RedisBase, Board, Shares):
    """`Board` and `Shares` (`coordination.shares`: the script `lua/share_choose.lua`)."""

    def __init__(self, url: str, outage_sec: float = OUTAGE_SEC) -> None:
        super().__init__(url, outage_sec)
        self._choose_share_script = scripts.Registered(self._redis, scripts.SHARE_CHOOSE)

    @override
    def register_share(self, job: str, share: shares.Share) -> None:
        """The job's Share in `sciencebench:shares` (`HSET`)."""
        self.patiently(lambda: self._redis.hset(SHARES_KEY, job, share.model_dump_json()))

    @override
    def set_weight(self, field: str, weight: float | None) -> None:
        """An operator's weight (`HSET`), or none (`HDEL`)."""
        if weight is None:
            self.patiently(lambda: self._redis.hdel(WEIGHTS_KEY, field))
        else:
            self.patiently(lambda: self._redis.hset(WEIGHTS_KEY, field, repr(float(weight))))

    @override
    def share_table(self) -> tuple[dict[str, shares.Share], dict[str, float]]:
        """Every registered job and the operator's weights (two `HGETALL`)."""
        table = {job: shares.Share.model_validate_json(v) for job, v in self._hash(SHARES_KEY).items()}
        return table, {field: float(v) for field, v in self._hash(WEIGHTS_KEY).items()}

    @override
    def share_load(self, job: str) -> shares.Load:
        """The job's slots, sent set, held and parked trials (one pipeline)."""

        keys = JobKeys(job)

        def look() -> list[Any]:
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.zcard(keys.slots)
                pipe.scard(keys.share_sent)
                pipe.zcard(keys.held)
                pipe.llen(keys.waiting)
                return list(pipe.execute())

        running, sent, held, waiting = self.patiently(look)
        return shares.Load(running=int(running), sent=int(sent), waiting=int(held) + int(waiting))

    @override
    def choose_share(self, capacity: int, total: Request | None = None) -> str | None:
        """`shares.choose` in one script (`lua/share_choose.lua`)."""
        cpus, memory = (repr(float(total.cpus)), total.memory_mb) if total is not None else ("0", 0)
        args: list[str | int] = [capacity, ClusterKeys.job_prefix, cpus, memory]
        value = self.patiently(lambda: self._choose_share_script("", "", args))
        return str(value) if value else None

    @override
    def share_sent(self, job: str, key: str) -> None:
        """Add the trial to the job's sent set (`SADD`)."""
        self.patiently(lambda: self._redis.sadd(JobKeys(job).share_sent, key))

    @override
    def share_started(self, job: str, key: str) -> None:
        """Take the trial off the job's sent set (`SREM`)."""
        self.patiently(lambda: self._redis.srem(JobKeys(job).share_sent, key))

    @override
    def set_state(self, job: str, key: str, state: TrialState, host: str) -> None:
        """Show one trial as `state` on `host`."""
        value = TrialStatus(state=state, host=host, at=time.time()).model_dump_json()
        self.patiently(lambda: self._redis.hset(JobKeys(job).state, key, value))

    @override
    def set_states(self, job: str, keys: list[str], state: TrialState) -> None:
        """Show many trials as `state` (no host), in one round trip."""
        if keys:
            value = TrialStatus(state=state, at=time.time()).model_dump_json()
            mapping: dict[EncodableT, EncodableT] = dict.fromkeys(keys, value)
            self.patiently(lambda: self._redis.hset(JobKeys(job).state, mapping=mapping))

    @override
    def states(self, job: str) -> dict[str, TrialStatus]:
        """Every trial's status by trial key."""
        raw = self._hash(JobKeys(job).state)
        return {key: TrialStatus.model_validate_json(value) for key, value in raw.items()}

    @override
    def beat(self, host: str) -> None:
        """A worker host's heartbeat, stamped with the server's clock."""
        self.patiently(lambda: self._redis.hset(HOSTS_KEY, host, repr(self.now())))

    @override
    def pause_host(self, host: str, reason: str) -> None:
        """The host takes no trials now, and why."""
        self.patiently(lambda: self._redis.hset(PAUSED_KEY, host, reason))

    @override
    def resume_host(self, host: str) -> None:
        """The host takes trials again."""
        self.patiently(lambda: self._redis.hdel(PAUSED_KEY, host))

    @override
    def report_images(self, host: str, line: str) -> None:
        """The host's image-budget line."""
        self.patiently(lambda: self._redis.hset(IMAGES_KEY, host, line))

    @override
    def describe_host(self, host: str, kit: HostKit) -> None:
        """What the host brings to a job."""
        self.patiently(lambda: self._redis.hset(KIT_KEY, host, kit.model_dump_json()))

    @override
    def forget_host(self, host: str) -> None:
        """A worker host stopped on purpose."""
        keys = (HOSTS_KEY, PAUSED_KEY, IMAGES_KEY, KIT_KEY)
        self.patiently(lambda: [self._redis.hdel(key, host) for key in keys])

    @override
    def hosts(self) -> dict[str, HostStatus]:
        """Every worker host that beat and was not forgotten."""
        paused, images, kits = self._hash(PAUSED_KEY), self._hash(IMAGES_KEY), self._hash(KIT_KEY)
        return {
            host: HostStatus(
                seen_at=float(seen),
                paused=host in paused,
                reason=paused.get(host, ""),
                images=images.get(host, ""),
                kit=_kit(kits.get(host)),
            )
            for host, seen in self._hash(HOSTS_KEY).items()
        }


def _kit(raw: str | None) -> HostKit | None:
    """A stored HostKit; None when absent or not one (a host reporting what this version cannot read)."""
    if raw is None:
        return None
    try:
        return HostKit.model_validate_json(raw)
    except ValueError:
        return None
