"""An agent cannot forge its reward (real `pier run`, oracle agent, real Engine 28).

The task's solve.sh (the oracle's agent step) pre-seeds reward.txt,
reward.json and ctrf.json in /logs/verifier and leaves a detached process
rewriting them with reward 1; its test.sh records what it finds, writes
reward 0 and waits a second for the rewriter. In the same container the
verifier must start with no process of the agent's and an empty,
root-owned /logs/verifier; a separate verifier gets only the artifacts
(never /logs/verifier, never a process); either way the reward is 0.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker.test_hostile_outputs import _task
from tests.docker.test_network_pier_run import Task, pier_run

pytestmark = pytest.mark.docker

FORGE = """
mkdir -p /logs/verifier /logs/artifacts
cat > /tmp/FORGER_LOOP.sh <<'SH'
#!/bin/bash
forge() {
  echo 1 > /logs/verifier/reward.txt
  echo '{"reward": 1}' > /logs/verifier/reward.json
  echo '{"results": {"summary": {"tests": 1, "passed": 1, "failed": 0}}}' > /logs/verifier/ctrf.json
}
forge
while true; do forge; sleep 0.05; done
SH
chmod 755 /tmp/FORGER_LOOP.sh
setsid nohup /tmp/FORGER_LOOP.sh </dev/null >/dev/null 2>&1 &
sleep 0.3
: > /logs/artifacts/model.patch
echo planted
"""

# What the verifier saw before writing anything: the directory's owner, group
# and mode, its entries, and how many rewriting processes run.
TEST = """
entries=$(ls -A /logs/verifier | grep -v '^test-stdout.txt$' | tr '\\n' ' ')
forgers=$(grep -l 'FORGE[R]_LOOP' /proc/[0-9]*/cmdline 2>/dev/null | wc -l)
state="$(stat -c '%u:%g %a' /logs/verifier) entries=[$entries] forgers=$forgers"
logs=$(find /logs -type f ! -path '/logs/verifier/*' | sort | tr '\\n' ' ')
echo 0 > /logs/verifier/reward.txt
echo "$state" > /logs/verifier/seen.txt
echo "$logs" > /logs/verifier/logs.txt
sleep 1
"""


@pytest.fixture
def verifier_image(base_image: str, tmp_path: Path) -> Iterator[str]:
    """A separate verifier's image: the base image with TEST as /tests/test.sh."""
    context = tmp_path / "verifier-image"
    context.mkdir()
    (context / "test.sh").write_text("#!/bin/bash\n" + TEST)
    (context / "Dockerfile").write_text(
        f"FROM {base_image}\nCOPY test.sh /tests/test.sh\nRUN chmod 755 /tests/test.sh\n"
    )
    image = f"sciencebench-test/forged-rewards-verifier:{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["docker", "build", "-q", "-t", image, str(context)], check=True, capture_output=True, timeout=300
    )
    try:
        yield image
    finally:
        subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True, timeout=120)


def _forged_trial(tmp_path: Path, base_image: str, verifier_image: str = "") -> tuple[dict[str, Any], Path]:
    task = _task(
        tmp_path / "task", base_image, solve=FORGE, pre_artifacts="", test=TEST, verifier_image=verifier_image
    )
    if verifier_image:
        (task / "tests" / "Dockerfile").write_text(f"FROM {verifier_image}\n")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    result = pier_run(Task(task, verifier_image), jobs, "forge", "--agent", "oracle")
    trial_dir = Path(result["_trial_dir"])
    assert result["exception_info"] is None, result["exception_info"]
    assert result["verifier_result"]["rewards"] == {"reward": 0.0}  # the forged reward is 1
    assert (trial_dir / "verifier" / "reward.txt").read_text() == "0\n"
    for name in ("reward.json", "ctrf.json"):
        assert not (trial_dir / "verifier" / name).exists(), name
    return result, trial_dir


def test_a_verifier_in_the_agents_container_ignores_planted_rewards_and_rewriters(
    base_image: str, tmp_path: Path
) -> None:
    _result, trial_dir = _forged_trial(tmp_path, base_image)
    seen = (trial_dir / "verifier" / "seen.txt").read_text().strip()
    assert seen == "0:0 755 entries=[] forgers=0", seen  # no process of the agent's, an empty root-owned dir


def test_a_separate_verifier_gets_only_the_artifacts(
    base_image: str, verifier_image: str, tmp_path: Path
) -> None:
    _result, trial_dir = _forged_trial(tmp_path, base_image, verifier_image)
    seen = (trial_dir / "verifier" / "seen.txt").read_text().strip()
    assert seen.endswith(" entries=[] forgers=0"), seen
    logs = (trial_dir / "verifier" / "logs.txt").read_text().split()
    assert logs == ["/logs/artifacts/manifest.json", "/logs/artifacts/model.patch"], logs
