"""Settings from SCIENCEBENCH_* environment variables layered over defaults."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BROKER_URL = "redis://localhost:6379/0"
# A floor for the broker's visibility timeout: an unacknowledged message older
# than this is delivered again, so it must outlive the longest trial.
VISIBILITY_TIMEOUT_FLOOR_SEC = 6 * 3600
RESULT_EXPIRES_SEC = 14 * 24 * 3600
_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    broker_url: str
    result_backend: str
    lease_seconds: float
    visibility_timeout_sec: int
    state_dir: Path
    hostname: str
    # Start Pier from a zygote that imported it once (see zygote.py).
    warm_pier: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        broker = env.get("SCIENCEBENCH_BROKER_URL", DEFAULT_BROKER_URL)
        return cls(
            broker_url=broker,
            result_backend=env.get("SCIENCEBENCH_RESULT_BACKEND", broker),
            lease_seconds=float(env.get("SCIENCEBENCH_LEASE_SECONDS", "60")),
            visibility_timeout_sec=max(
                int(env.get("SCIENCEBENCH_VISIBILITY_TIMEOUT", "0") or 0),
                VISIBILITY_TIMEOUT_FLOOR_SEC,
            ),
            state_dir=Path(env.get("SCIENCEBENCH_STATE_DIR", "/var/tmp/sciencebench")),  # noqa: S108 host-local locks, not temp files,
            hostname=env.get("SCIENCEBENCH_HOSTNAME", socket.gethostname()),
            warm_pier=env.get("SCIENCEBENCH_WARM_PIER", "1").strip().lower() not in _OFF,
        )


def required_visibility_timeout(longest_trial_sec: float) -> int:
    """Visibility timeout a job needs: 1.5x its longest trial, at least the floor."""
    return max(int(longest_trial_sec * 1.5), VISIBILITY_TIMEOUT_FLOOR_SEC)
