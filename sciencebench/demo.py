"""A small, self-contained demo selection with real images and real Pier.

Two tasks share one agent image (a git repository with a bug in `add`) and
one verifier image (a clean copy plus `/tests/test.sh`, which applies the
agent's `model.patch` and grades it): task_001's solution fixes the bug
(oracle -> reward 1), task_002's makes a wrong change (oracle -> reward 0).
Images are built on a digest-pinned base image by running a setup script in
a network-less container and committing it, then pushed to a registry so
tasks can pin them by digest. The docker tier of the tests uses the same
selection.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from sciencebench.core.paths import SelectionPaths
from sciencebench.worker.docker.build import commit_image
from sciencebench.worker.docker.engine import connect

PROJECT = "/app/project"

AGENT_SETUP = f"""
set -euo pipefail
mkdir -p {PROJECT} && cd {PROJECT}
cat > calc.sh <<'SH'
#!/usr/bin/env bash
# usage: calc.sh add A B
add() {{ echo $(( $1 - $2 )); }}
"$@"
SH
chmod +x calc.sh
git init -q -b main . && git config user.email demo@sciencebench && git config user.name demo
git add -A && git commit -qm baseline
"""

TEST_SH = """#!/usr/bin/env bash
# Apply the agent's patch to the clean workspace, then grade it.
set -uo pipefail
cd /app/project
mkdir -p /logs/verifier
patch=/logs/artifacts/model.patch
if [ -s "$patch" ]; then git apply "$patch" || echo "patch did not apply"; fi
public=0; private=0
[ "$(./calc.sh add 2 2)" = "4" ] && public=1
[ "$(./calc.sh add 40 2)" = "42" ] && [ "$(./calc.sh add -1 1)" = "0" ] && private=1
reward=$(( public && private ))
echo "public $public/1 private $private/1"
echo "$reward" > /logs/verifier/reward.txt
printf '{"reward": %s, "public": {"passed": %s, "collected": 1}, ' "$reward" "$public" \\
  > /logs/verifier/reward.json
printf '"private": {"passed": %s, "collected": 1}}\\n' "$private" >> /logs/verifier/reward.json
"""

VERIFIER_SETUP = (
    AGENT_SETUP
    + "\nmkdir -p /tests && cat > /tests/test.sh <<'TESTSH'\n"
    + TEST_SH
    + "TESTSH\nchmod +x /tests/test.sh\n"
)

PRE_ARTIFACTS = f"""#!/usr/bin/env bash
# Capture the agent's work against the image's baseline root commit.
set -euo pipefail
mkdir -p /logs/artifacts
cd {PROJECT}
git add -A
git diff --cached --binary "$(git rev-list --max-parents=0 HEAD)" > /logs/artifacts/model.patch
"""

SOLUTIONS = {
    "001": "sed -i 's/\\$(( \\$1 - \\$2 ))/$(( $1 + $2 ))/' calc.sh",
    "002": "sed -i 's/\\$(( \\$1 - \\$2 ))/$(( $1 * $2 ))/' calc.sh",
}


def write_task(root: Path, task_id: str, agent_ref: str, verifier_ref: str, solution: str) -> Path:
    """Write `task_<id>/` of the demo selection under `root`; return its directory."""
    task = SelectionPaths(root).task_dir(task_id)
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text(
        textwrap.dedent(f"""\
        schema_version = "1.3"
        artifacts = ["/logs/artifacts/model.patch"]

        [task]
        name = "sciencebench/demo-{task_id}"

        [agent]
        timeout_sec = 120.0

        [environment]
        docker_image = "{agent_ref}"
        allow_internet = false
        workdir = "{PROJECT}"

        [verifier]
        environment_mode = "separate"
        timeout_sec = 120.0

        [verifier.environment]
        docker_image = "{verifier_ref}"
        allow_internet = false
        workdir = "{PROJECT}"
        """)
    )  # fmt: skip
    (task / "instruction.md").write_text("Fix `add` in calc.sh so that `./calc.sh add 2 2` prints 4.\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {agent_ref}\n")
    # Pier defines the separate verifier environment from tests/.
    (task / "tests" / "Dockerfile").write_text(f"FROM {verifier_ref}\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "pre_artifacts.sh").write_text(PRE_ARTIFACTS)
    (task / "solution" / "solve.sh").write_text(f"#!/usr/bin/env bash\nset -e\ncd {PROJECT}\n{solution}\n")
    for script in (task / "tests" / "test.sh", task / "pre_artifacts.sh", task / "solution" / "solve.sh"):
        script.chmod(0o755)
    return task


def build_demo_selection(root: Path, base_image: str, registry: str) -> Path:
    """Build and push the demo images, then write the two-task selection under `root`."""
    client = connect(timeout_sec=600)
    try:
        agent_ref = commit_image(
            client, base_image, AGENT_SETUP, f"{registry}/sciencebench/demo-agent", PROJECT
        )
        verifier_ref = commit_image(
            client, base_image, VERIFIER_SETUP, f"{registry}/sciencebench/demo-verifier", PROJECT
        )
    finally:
        client.close()
    root.mkdir(parents=True, exist_ok=True)
    for task_id, solution in SOLUTIONS.items():
        write_task(root, task_id, agent_ref, verifier_ref, solution)
    return root
