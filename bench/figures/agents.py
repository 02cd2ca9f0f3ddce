"""Item 8: agent-ready images: baking Codex once, baking it again, and Pier's agent setup on the bake.

The demo selection's agent image (freshly built, so a new digest) gets the
pinned Codex CLI baked in with `sciencebench images bake` (the library call
the command makes): install in a network-less container from the host's
artifacts, commit, push by digest. The same bake again finds the image in
the registry and the record and does nothing. Then one real Codex trial
(demo task 001, `submit --local`) runs on the baked image against the
scripted gateway (tests/fixtures/gateway_lab.py) through the trial's proxy;
its record's `agent_setup` stage is Pier's setup of a preinstalled agent.

Needs the artifacts of scripts/agent-artifacts.sh (scripts/test.sh fetches
them; `--agent codex` is enough here).
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import subprocess
import time
from typing import Any

from bench import sb
from bench.harness import Harness
from bench.params import Params
from bench.report import Findings, Outcome

FIX = "cd /app/project && sed -i 's/\\$(( \\$1 - \\$2 ))/$(( $1 + $2 ))/' calc.sh"
SETUP_GOAL_S = 2.0


def measure(h: Harness, p: Params) -> Outcome:
    """bake_s (raw), rebake_s (a no-op), agent_setup_baked_s (goal < 2 s)."""
    from tests.fixtures.gateway_lab import make_ca

    found = Findings()
    with found.kept_on_crash():
        tls = make_ca(sb.default_artifacts() / "test-ca", "gw")
        samples: list[dict[str, Any]] = []
        for i in range(1, p.repeats + 1):  # each repetition bakes a freshly built image (a new digest)
            samples.append(_once(h, tls, i, found))
        found.raw["agents"] = {"samples": samples}
        bakes = [x["bake_s"] for x in samples]
        rebakes = [x["rebake_s"] for x in samples]
        setups = [x["agent_setup_s"] for x in samples]
        found.figure(
            "bake_s",
            statistics.median(bakes),
            detail=f"Codex {samples[0]['version']} into the demo's agent image: {samples[0]['first_bake']} "
            "(install with no network, commit, push by digest)",
            samples=bakes,
        )
        found.figure(
            "rebake_s",
            statistics.median(rebakes),
            goal="no-op",
            met=all(x["second_bake"] == "up to date" for x in samples),
            detail=f"the same bake again: {', '.join(sorted({x['second_bake'] for x in samples}))}",
            samples=rebakes,
        )
        setup = statistics.median(setups)
        found.figure(
            "agent_setup_baked_s",
            setup,
            goal=f"< {SETUP_GOAL_S:g} s",
            met=setup < SETUP_GOAL_S,
            detail="Pier's agent-setup stage of a real Codex trial on the baked image "
            f"(rewards {[x['reward'] for x in samples]})",
            samples=setups,
        )
    return found.outcome()


def _once(h: Harness, tls: Any, i: int, found: Findings) -> dict[str, Any]:
    """One bake, the same bake again, and one real Codex trial on the baked image."""
    from tests.fixtures.gateway_lab import GatewayLab

    demo = sb.build_demo_selection(h.work / f"demo-agents-{i}", h.base_image, h.registry)
    t = time.monotonic()
    (first,) = sb.bake_selection(demo, "codex", registry=h.registry, extra_ca=tls.ca_cert)
    bake_s = time.monotonic() - t
    t = time.monotonic()
    (again,) = sb.bake_selection(demo, "codex", registry=h.registry, extra_ca=tls.ca_cert)
    rebake_s = time.monotonic() - t
    key = f"sk-bench-{secrets.token_hex(12)}"
    env_file = h.work / f"codex-bench-{i}.env"
    env_file.write_text(f"MODEL=gpt-bench\nOPENAI_API_KEY={key}\nCODEX_BASE_URL=https://gw:4443/v1\n")
    env_file.chmod(0o600)
    scripts = [{"name": "fix", "match": "calc.sh", "commands": [FIX], "final": "Fixed."}]
    env = h.env(
        SCIENCEBENCH_PROXY_IMAGE=os.environ["SB_SQUID_IMAGE"], SCIENCEBENCH_STATE_DIR=str(h.pull_state)
    )
    env["SCIENCEBENCH_AGENT_INSTALL"] = "baked"  # an offline host: the baked image only
    h.pull_state.mkdir(parents=True, exist_ok=True)
    job = f"agents-codex-{i}"
    with GatewayLab(
        image=h.base_image,
        root=h.work / f"gateway-{i}",
        selection=demo,
        key=key,
        scripts=scripts,
        tls=tls,
        scratch=h.pull_state / "scratch",
    ):
        proc = subprocess.run(
            [str(h.venv_bin / "sciencebench"), "submit", "--local", "--path", str(demo),
             "--task-id", "001", "--agent", "codex", "--env-file", str(env_file),
             "--jobs-dir", str(h.jobs_dir), "--job-name", job,
             "--gateway", "https://gw:4443"],  # the scripted gateway: a name only the trial's proxy resolves
            env=env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
    record = json.loads((h.trials_dir(job) / "001-1.json").read_text())
    if proc.returncode != 0 or record.get("exception_type"):
        found.errors[f"agents-{i}"] = (
            f"the Codex trial failed: {record.get('exception_type')} {proc.stderr[-300:]}"
        )
    return {
        "bake_s": bake_s,
        "rebake_s": rebake_s,
        "first_bake": first.action,
        "second_bake": again.action,
        "image": first.image.image,
        "version": first.image.version,
        "agent_setup_s": float(record["timings_sec"]["agent_setup"]),
        "trial_timings_sec": record["timings_sec"],
        "reward": record.get("rewards"),
    }
