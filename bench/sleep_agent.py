"""A Pier 0.3.0 agent that sleeps for its task's synthetic duration.

The duration is the `sleep_sec` of `<task>/fake.json`, the same file the fake
Pier of the tests reads, so `pier run` and sciencebench workers running the
fake Pier spend the same time per trial. The task directory is the parent of
the environment's `environment_dir` (`<task>/environment`). Passed to Pier as
`--agent-import-path bench.sleep_agent:SleepAgent`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from pier.agents.base import BaseAgent
from pier.environments.base import BaseEnvironment
from pier.models.agent.context import AgentContext


def task_sleep_sec(task_dir: Path) -> float:
    fake = task_dir / "fake.json"
    if not fake.is_file():
        return 0.0
    return float(json.loads(fake.read_text(encoding="utf-8")).get("sleep_sec", 0.0))


class SleepAgent(BaseAgent):
    @staticmethod
    def name() -> str:
        return "bench-sleep"

    def version(self) -> str:
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await asyncio.sleep(task_sleep_sec(Path(environment.environment_dir).parent))
