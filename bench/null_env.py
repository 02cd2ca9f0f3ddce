"""A Pier 0.3.0 environment with no container: every operation is a no-op.

Used only as the single-host baseline of the scheduling benchmark: with it,
`pier run` spends a trial's time in the agent alone, as the fake Pier does on
workers. Passed to Pier as
`--environment-import-path bench.null_env:NullEnvironment`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pier.environments.base import BaseEnvironment, ExecResult
from pier.environments.capabilities import EnvironmentCapabilities


class NullEnvironment(BaseEnvironment):
    """Starts nothing, runs nothing, copies nothing; every command succeeds."""

    @staticmethod
    def type() -> str:
        return "null"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # Offline tasks (allow_internet = false) need disable_internet; the
        # log directories are "mounted" (the host's own trial directories).
        return EnvironmentCapabilities(disable_internet=True, mounted=True)

    def _validate_definition(self) -> None:
        return None

    async def start(self, force_build: bool) -> None:
        return None

    async def stop(self, delete: bool) -> None:
        return None

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        return None

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        return None

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        return None

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        return None

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
        **_: Any,
    ) -> ExecResult:
        return ExecResult(stdout="", stderr="", return_code=0)
