"""Settings from SCIENCEBENCH_* environment variables layered over defaults, validated.

One `Settings` object (pydantic-settings) serves both sides. A bad value is
a `SettingsError` (an InputError: one line on stderr, exit 2) naming the
variable, never a traceback.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sciencebench.core.errors import SettingsError
from sciencebench.core.gateways import public_url

ENV_PREFIX = "SCIENCEBENCH_"
DEFAULT_BROKER_URL = "redis://localhost:6379/0"
# A floor for the broker's visibility timeout: an unacknowledged message older
# than this is delivered again, so it must outlive the longest trial.
VISIBILITY_TIMEOUT_FLOOR_SEC = 6 * 3600
RESULT_EXPIRES_SEC = 14 * 24 * 3600
STATE_DIR_ENV = f"{ENV_PREFIX}STATE_DIR"
# A fixed host-local directory shared by every worker process of a host (not a temp file).
DEFAULT_STATE_DIR = Path("/var/tmp/sciencebench")  # noqa: S108


class Settings(BaseSettings):
    """The deployment's settings; each field is `SCIENCEBENCH_<FIELD NAME>`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_ignore_empty=True, frozen=True, extra="ignore"
    )

    broker_url: str = DEFAULT_BROKER_URL
    # Empty means: the broker URL.
    result_backend: str = ""
    # A lost host's trial is dispatched again within two lease periods.
    lease_seconds: float = Field(default=60.0, gt=0, le=24 * 3600)
    # At least the floor; 0 (or unset) means the floor.
    visibility_timeout: int = Field(default=0, ge=0)
    state_dir: Path = DEFAULT_STATE_DIR
    hostname: str = Field(default_factory=socket.gethostname, min_length=1)
    # Start Pier from a zygote that imported it once (see worker/pier/zygote.py).
    warm_pier: bool = True

    @field_validator("broker_url")
    @classmethod
    def _broker_is_redis(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://", "sentinel://")):
            raise ValueError("must be a redis://, rediss://, unix:// or sentinel:// URL")
        return value

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from `env` (default: the process environment).

        Raises SettingsError naming the first bad variable; its value is not
        echoed (a broker URL holds a password).
        """
        try:
            if env is None:
                return cls()
            values: dict[str, Any] = {
                key.removeprefix(ENV_PREFIX).lower(): value
                for key, value in env.items()
                if key.startswith(ENV_PREFIX) and value != ""
            }
            return cls.model_validate(values)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else ""
            message = str(error["msg"]).removeprefix("Value error, ")
            raise SettingsError(f"{ENV_PREFIX}{field.upper()}: {message}") from None

    @property
    def backend_url(self) -> str:
        """The result backend: `SCIENCEBENCH_RESULT_BACKEND`, else the broker."""
        return self.result_backend or self.broker_url

    @property
    def visibility_timeout_sec(self) -> int:
        """The broker's visibility timeout: the configured one, at least the floor."""
        return max(self.visibility_timeout, VISIBILITY_TIMEOUT_FLOOR_SEC)

    @property
    def public_broker_url(self) -> str:
        """The broker URL without its password, fit to print or record."""
        return public_url(self.broker_url)


def state_dir_from_env() -> Path:
    """The host state directory alone, for processes that hold no Settings (Pier's plugins)."""
    configured = os.environ.get(STATE_DIR_ENV, "").strip()
    return Path(configured) if configured else DEFAULT_STATE_DIR


def required_visibility_timeout(longest_trial_sec: float) -> int:
    """Visibility timeout a job needs: 1.5x its longest trial, at least the floor."""
    return max(int(longest_trial_sec * 1.5), VISIBILITY_TIMEOUT_FLOOR_SEC)
