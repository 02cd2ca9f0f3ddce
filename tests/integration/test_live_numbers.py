"""Live spend and ETA, end to end: real Redis, a real worker, fake Pier runs of known durations and costs."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.models import JobSpec, TrialState
from tests.fixtures.cluster import until
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

SLEEP_SEC = 3.0
N_TASKS = 8  # on two slots: four rounds
SPENT = {"n_input_tokens": 900, "n_output_tokens": 40, "cost_usd": 0.01}  # each trial's, as Pier totals it


def _seconds(text: str) -> float:
    """`7s`, `1m05s` -> seconds."""
    match = re.fullmatch(r"(?:(\d+)m)?(\d+)s", text)
    assert match, text
    return int(match.group(1) or 0) * 60 + int(match.group(2))


def test_status_shows_spend_so_far_and_an_eta_near_the_real_remaining_time(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=2)
    path = cluster.selection(
        {f"{i:03d}": {"sleep_sec": SLEEP_SEC, "spend": SPENT} for i in range(1, N_TASKS + 1)}
    )
    submit = subprocess.Popen(
        cluster.submit_argv(path, "live", "--n-concurrent", "2"), env=cluster.env, cwd=cluster.root,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        spec = cluster.jobs_dir / "live" / ".sciencebench" / "job.json"
        until("the job spec", lambda: spec.is_file() or None, 60, interval=0.1)
        job = JobSpec.model_validate_json(spec.read_bytes())
        coord = RedisCoordinator(cluster.redis.url)

        def finished() -> int:
            states = coord.states(job.job_key).values()
            return sum(s.state in (TrialState.DONE, TrialState.FAILED) for s in states)

        until("two trials done", lambda: finished() >= 2 or None, 60, interval=0.1)
        status = cluster.cli("status", "live", "--jobs-dir", str(cluster.jobs_dir))
        after = time.monotonic()
        until("every trial done", lambda: finished() == N_TASKS or None, 120, interval=0.1)
        ended = time.monotonic()
        out, err = submit.communicate(timeout=120)
    finally:
        if submit.poll() is None:
            submit.kill()
    assert status.returncode == 0, status.stderr
    assert submit.returncode == 0, err

    counts = re.search(r"trials: done (\d+), failed 0, running (\d+), waiting (\d+)", status.stdout)
    assert counts, status.stdout
    done, running, waiting = map(int, counts.groups())
    assert done >= 2 and done + running + waiting == N_TASKS and running + waiting > 0
    # Spend so far: the committed records' Pier totals, exactly.
    assert (
        f"spend so far: {900 * done:,} input + {40 * done:,} output tokens, ${0.01 * done:.4f} "
        f"({done} of {done} trial(s) priced)"
    ) in status.stdout
    eta = re.search(
        r"ETA: (\S+) \((\d+) running, (\d+) waiting on (\d+) slot\(s\): live cluster 2 slot", status.stdout
    )
    assert eta, status.stdout
    assert eta.group(4) == "2"
    estimated = _seconds(eta.group(1))
    real_remaining = ended - after  # `status` reads the store at its end, after asking the workers
    assert real_remaining / 1.5 <= estimated <= real_remaining * 1.5, (
        estimated,
        real_remaining,
        status.stdout,
    )

    # The end of `--wait`: its last progress line, and the job's numbers under the table.
    assert f"done {N_TASKS}  failed 0  running 0  waiting 0  tokens 7200/320  $0.08" in err, err
    assert "nop: 8 scored trial(s), 0 with exceptions; mean reward 1.000" in out, out
    assert "spend: 7,200 input + 320 output tokens, $0.0800 (8 of 8 trial(s) priced)" in out, out
    assert re.search(
        r"slot utilisation \d+% \(trials busy .* over 2 slot\(s\); at most 2 ran at once\)", out
    ), out

    # The next submit's dry run: its duration on the live cluster's slots, its cost, both by history.
    dry = cluster.cli("submit", "--path", str(path), "--agent", "nop", "--jobs-dir", str(cluster.jobs_dir),
                      "--job-name", "again", "--n-concurrent", "4", "--skip-pull", "--dry-run")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    expected = re.search(
        r"expected duration: (\S+) on 2 slot\(s\) \(live cluster 2, --n-concurrent 4\); "
        r"8 of 8 trial\(s\) by history",
        dry.stdout,
    )
    assert expected, dry.stdout
    assert 4 * SLEEP_SEC <= _seconds(expected.group(1)) <= 4 * SLEEP_SEC * 1.5, dry.stdout  # four rounds
    assert "expected cost: $0.08 (8 trial(s) by cost history)" in dry.stdout, dry.stdout
