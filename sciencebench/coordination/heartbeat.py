"""The heartbeat of a running trial: renews its lease (and slot), watches the cancel flag."""

from __future__ import annotations

import logging
import threading

from sciencebench.coordination.models import Room
from sciencebench.coordination.protocol import Coordinator

log = logging.getLogger(__name__)

# A slot refresh never refuses its current holder, whatever the cap.
_ANY_CAP = 1 << 30


class Heartbeat(threading.Thread):
    """Renews a trial's lease, its slot and its part of the host's capacity (`room`) every `ttl_sec / 4`.

    It runs while they are held, until stopped.

    `lost` is set when the lease could not be renewed (another run owns the
    trial now); `cancelled` when the job's cancel flag appears. A broker blip
    is logged and retried until the lease lapses.
    """

    def __init__(
        self, coord: Coordinator, job: str, key: str, owner: str, ttl_sec: float, slot: bool = True,
        room: Room | None = None,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True, name=f"lease {key}")
        self.coord, self.job, self.key, self.owner, self.ttl_sec = coord, job, key, owner, ttl_sec
        self.slot = slot  # False: the trial holds no slot (only its lease is renewed)
        self.room = room  # None: it holds no part of its host's capacity
        self.lost = threading.Event()
        self.cancelled = threading.Event()
        self._stop_event = threading.Event()

    def run(self) -> None:
        """Renew until stopped or lost."""
        interval = max(self.ttl_sec / 4, 0.2)
        while not self._stop_event.wait(interval):
            try:
                if not self.coord.renew(self.job, self.key, self.owner, self.ttl_sec):
                    self.lost.set()
                    return
                if self.slot:
                    self.coord.acquire_slot(self.job, self.key, _ANY_CAP, self.ttl_sec)
                if (room := self.room) is not None:
                    self.coord.take_room(room.host, room.member, room.request, room.capacity, self.ttl_sec)
                if self.coord.is_cancelled(self.job):
                    self.cancelled.set()
            except Exception:  # a broker blip: keep trying until the lease lapses
                log.warning("lease renewal for %s failed; retrying", self.key, exc_info=True)

    def stop(self) -> None:
        """Stop renewing (the caller releases the lease)."""
        self._stop_event.set()

    @property
    def should_stop(self) -> bool:
        """Whether the trial must stop now: the job was cancelled or the lease was lost."""
        return self.cancelled.is_set() or self.lost.is_set()
