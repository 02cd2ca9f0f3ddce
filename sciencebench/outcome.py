"""TrialRecord: what one trial returns to the chord and leaves on disk."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class TrialRecord(BaseModel):
    """The small JSON record of one finished trial (successful or not)."""

    model_config = ConfigDict(frozen=True)

    job_name: str
    task_id: str
    attempt: int
    trial_dir: str | None = None
    rewards: dict[str, float] | None = None
    exception_type: str | None = None
    exception_message: str | None = None
    stage: str | None = None
    timings_sec: dict[str, float] = Field(default_factory=dict)
    worker: str | None = None
    patch_collected: bool | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    tries: int = 1

    @property
    def errored(self) -> bool:
        return self.exception_type is not None

    @property
    def reward(self) -> float | None:
        if not self.rewards:
            return None
        return self.rewards.get("reward", next(iter(self.rewards.values())))
