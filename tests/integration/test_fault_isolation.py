"""Job faults stay with the job, host faults with the host; no trial is lost or counted twice.

Real Redis, real `sciencebench worker` processes (the fake Pier as their
Pier), real pulls from the loopback registry, a real tmpfs for a full disk,
libfaketime for a skewed clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.models import JobSpec
from tests.fixtures.services import FAKE_PIER, Worker
from tests.integration.conftest import FAKE_WORKER, LEASE_SECONDS, Cluster

pytestmark = pytest.mark.integration


def _records(cluster: Cluster, job: str, jobs_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    trials = (jobs_dir or cluster.jobs_dir) / job / ".sciencebench" / "trials"
    return {p.stem: json.loads(p.read_text()) for p in sorted(trials.glob("*.json"))}


def _wait_for(predicate: Any, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - start


def _job(cluster: Cluster, name: str, jobs_dir: Path | None = None) -> JobSpec:
    path = (jobs_dir or cluster.jobs_dir) / name / ".sciencebench" / "job.json"
    return JobSpec.model_validate_json(path.read_bytes())


# --- a bad job fails its trials, never a host ------------------------------------------


def test_a_job_for_another_platform_fails_its_trials_and_no_host(cluster: Cluster) -> None:
    cluster.start_workers(2)
    bad = cluster.selection({"001": {"reward": 1.0}, "002": {"reward": 1.0}})
    done = cluster.submit(bad, "arm", "--platform", "linux/arm64")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    records = _records(cluster, "arm")
    assert {r["exception_type"] for r in records.values()} == {"RefusedError"}
    assert all("needs linux/arm64" in r["exception_message"] for r in records.values())
    assert cluster.pier_runs() == []
    # Both hosts still take trials: a healthy job right after runs on both.
    good = cluster.selection({f"{i:03d}": {"sleep_sec": 1.0, "reward": 1.0} for i in range(3, 9)})
    healthy = cluster.submit(good, "healthy")
    assert healthy.returncode == 0, healthy.stderr
    hosts = {r["worker"].split("@")[0] for r in _records(cluster, "healthy").values()}
    assert hosts == {"w0", "w1"}


# --- a host that goes bad pauses itself and comes back ---------------------------------------


class SocketRelay:
    """A unix socket forwarding to the Docker Engine's, that a test can take away and bring back."""

    def __init__(self, path: Path, target: str) -> None:
        self.path, self.target = path, target
        self._server: socket.socket | None = None

    def start(self) -> None:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.path))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.path.unlink(missing_ok=True)

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.target)
            except OSError:
                client.close()
                continue
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@pytest.fixture
def relay(cluster: Cluster) -> Iterator[SocketRelay]:
    target = os.environ["DOCKER_HOST"].removeprefix("unix://")
    relay = SocketRelay(cluster.root / "docker-relay.sock", target)
    relay.start()
    yield relay
    relay.stop()


def test_an_engine_outage_pauses_the_host_which_resumes_by_itself(
    cluster: Cluster, relay: SocketRelay
) -> None:
    env = dict(cluster.env, DOCKER_HOST=f"unix://{relay.path}")
    worker = Worker("flaky", env, cluster.root, concurrency=1, extra=FAKE_WORKER).start()
    cluster.workers.append(worker)
    worker.wait_ready()
    relay.stop()  # the engine goes away under the running worker
    path = cluster.selection({"001": {"reward": 1.0}})
    submit = subprocess.Popen(
        [*cluster.submit_argv(path, "outage")], env=cluster.env, cwd=cluster.root,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    coord = RedisCoordinator(cluster.redis.url)

    def paused() -> bool:
        host = next((h for h in coord.hosts() if h.startswith("flaky@")), None)
        return host is not None and coord.hosts()[host].paused

    _wait_for(paused, 60, "the host to pause")
    status = cluster.cli("status", "outage", "--jobs-dir", str(cluster.jobs_dir))
    assert "paused host flaky@" in status.stdout and "Docker Engine" in status.stdout, status.stdout
    time.sleep(2)
    relay.start()  # the engine is back
    _out, err = submit.communicate(timeout=180)
    assert submit.returncode == 0, err
    assert not paused()
    log = worker.log_path.read_text()
    assert "handed back (host unfit" in log and "host healthy again" in log
    assert len(cluster.pier_runs()) == 1


def test_an_engine_outage_after_a_passed_check_pauses_the_host_not_the_job(
    cluster: Cluster, relay: SocketRelay
) -> None:
    env = dict(cluster.env, DOCKER_HOST=f"unix://{relay.path}")
    worker = Worker("flaky", env, cluster.root, concurrency=2, extra=FAKE_WORKER).start()
    cluster.workers.append(worker)
    worker.wait_ready()
    # One trial and the finalizer: both pool processes have a passed (cached) host check now.
    before = cluster.submit(cluster.selection({"001": {"reward": 1.0, "needs_engine": True}}), "before")
    assert before.returncode == 0, before.stderr
    relay.stop()  # the engine goes away within the check's minute: the trial's run finds out
    behaviour = {"reward": 1.0, "needs_engine": True}
    path = cluster.selection({"002": behaviour, "003": behaviour}, root=cluster.root / "during")
    submit = subprocess.Popen(
        cluster.submit_argv(path, "during"), env=cluster.env, cwd=cluster.root,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    coord = RedisCoordinator(cluster.redis.url)

    def paused() -> bool:
        host = next((h for h in coord.hosts() if h.startswith("flaky@")), None)
        return host is not None and coord.hosts()[host].paused

    _wait_for(paused, 60, "the host to pause")
    assert list(coord.hosts()) == [next(h for h in coord.hosts() if h.startswith("flaky@"))]
    time.sleep(2)
    relay.start()
    _out, err = submit.communicate(timeout=180)
    assert submit.returncode == 0, err  # no trial of the job failed for the host's fault
    records = _records(cluster, "during")
    assert [r["exception_type"] for r in records.values()] == [None, None]
    log = worker.log_path.read_text()
    assert "host unfit after a failed try" in log and "host healthy again" in log


# --- a host that cannot see the job does not swallow its trials ---------------------------------


def test_a_host_that_cannot_see_the_jobs_dir_hands_trials_back(cluster: Cluster) -> None:
    elsewhere = cluster.root / "not-shared"
    elsewhere.mkdir()
    blind = Worker(
        "blind", cluster.env, cluster.root, concurrency=1, extra=FAKE_WORKER, serves=elsewhere
    ).start()
    cluster.workers.append(blind)
    blind.wait_ready()
    (good,) = cluster.start_workers(1)
    path = cluster.selection({f"{i:03d}": {"sleep_sec": 0.5, "reward": 1.0} for i in range(1, 5)})
    # The good host stops taking messages for a moment (still live by its last heartbeat): every trial
    # comes to the blind host first, which must hand it back rather than swallow it.
    assert good.proc is not None
    coord = RedisCoordinator(cluster.env["SCIENCEBENCH_BROKER_URL"])
    _wait_for(
        lambda: any(name.startswith(f"{good.name}@") for name in coord.hosts()),
        30,
        "the good host's heartbeat",
    )
    os.killpg(good.proc.pid, signal.SIGSTOP)
    with subprocess.Popen(cluster.submit_argv(path, "shared"), env=cluster.env, cwd=cluster.root,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as submit:  # fmt: skip
        try:
            # A bound on waiting, not a measurement: a loaded machine starts the submit slowly.
            _wait_for(lambda: "handed back" in blind.log_path.read_text(errors="replace"), 90, "a hand-back")
        finally:
            os.killpg(good.proc.pid, signal.SIGCONT)
        stdout, stderr = submit.communicate(timeout=300)
    assert submit.returncode == 0, stdout + stderr
    records = _records(cluster, "shared")
    assert len(records) == 4 and not any(r["worker"].startswith("blind@") for r in records.values())
    status = cluster.cli("status", "shared", "--jobs-dir", str(cluster.jobs_dir))
    assert "unfit host blind@" in status.stdout and "outside the jobs roots" in status.stdout, status.stdout


def test_a_job_no_live_host_can_serve_is_refused_at_submit(cluster: Cluster) -> None:
    elsewhere = cluster.root / "not-shared"
    elsewhere.mkdir()
    blind = Worker(
        "blind", cluster.env, cluster.root, concurrency=1, extra=FAKE_WORKER, serves=elsewhere
    ).start()
    cluster.workers.append(blind)
    blind.wait_ready()
    path = cluster.selection({"001": {"reward": 1.0}, "002": {"reward": 1.0}})
    done = cluster.submit(path, "nobody")
    # The live host reported its roots: submit refuses at once, in one line, naming them.
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "--jobs-dir" in done.stderr
    assert "no live worker host serves it" in done.stderr and str(elsewhere) in done.stderr
    assert not (cluster.jobs_dir / "nobody").exists()
    assert cluster.pier_runs() == []


def test_a_capped_job_does_not_hold_workers(cluster: Cluster) -> None:
    cluster.start_workers(2, concurrency=2)
    capped = cluster.selection({f"{i:03d}": {"sleep_sec": 4.0} for i in range(1, 5)})
    slow = subprocess.Popen(
        cluster.submit_argv(capped, "capped", "--n-concurrent", "1"), env=cluster.env, cwd=cluster.root,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for(lambda: len(cluster.pier_runs_started()) >= 1, 30, "the capped job to start")
        free = cluster.root / "free-sel"
        quick = cluster.selection({f"{i:03d}": {"sleep_sec": 1.0} for i in range(11, 17)}, root=free)
        started = time.monotonic()
        done = cluster.submit(quick, "free")
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        # Six 1 s trials on the three slots the capped job leaves free: about 2 s, not its 16 s.
        assert took < 12, took
        assert slow.poll() is None, "the capped job should still be running"
    finally:
        slow.wait(timeout=120)
    runs = [r for r in cluster.pier_runs() if r["task"] in {f"task_{i:03d}" for i in range(1, 5)}]
    assert max_overlap(runs) == 1
    # Parked again and again for its slot, each trial waited once; every trial shows done.
    job = _job(cluster, "capped")
    client = redis.Redis.from_url(cluster.redis.url)
    assert client.llen(f"sciencebench:{job.job_key}:waiting") == 0
    states = RedisCoordinator(cluster.redis.url).states(job.job_key)
    assert {str(status.state) for status in states.values()} == {"done"}


def max_overlap(runs: list[dict[str, Any]]) -> int:
    """The most runs that were under way at one moment."""
    events = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    best = current = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def test_the_slot_cap_holds_with_a_clock_120s_ahead(cluster: Cluster) -> None:
    cluster.start_workers(1, concurrency=2)
    skewed = Worker("skewed", cluster.env, cluster.root, concurrency=2, extra=FAKE_WORKER)
    skewed.argv_prefix = ["faketime", "-f", "+120s"]
    cluster.workers.append(skewed.start())
    skewed.wait_ready()
    path = cluster.selection({f"{i:03d}": {"sleep_sec": 2.0} for i in range(1, 7)})
    done = cluster.submit(path, "skew", "--n-concurrent", "2")
    assert done.returncode == 0, done.stderr
    assert max_overlap(cluster.pier_runs()) <= 2
    hosts = {r["worker"].split("@")[0] for r in _records(cluster, "skew").values()}
    assert "skewed" in hosts  # the skewed host took part


# --- a partitioned host that comes back late changes nothing -------------------------------------------


def test_a_paused_host_coming_back_late_is_discarded(cluster: Cluster) -> None:
    first, second = cluster.start_workers(2)
    path = cluster.selection({"001": {"sleep_sec": 4 * LEASE_SECONDS, "reward": 1.0}})
    submit = subprocess.Popen(
        cluster.submit_argv(path, "partition"), env=cluster.env, cwd=cluster.root,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _wait_for(lambda: bool(cluster.pier_runs_started()), 30, "the trial to start")
    job = _job(cluster, "partition")
    owner = RedisCoordinator(cluster.redis.url).states(job.job_key)["001#1"].host
    victim = first if owner.startswith(f"{first.name}@") else second
    assert victim.proc is not None
    os.killpg(victim.proc.pid, signal.SIGSTOP)  # cut off: no renewals, no progress
    time.sleep(3 * LEASE_SECONDS)
    os.killpg(victim.proc.pid, signal.SIGCONT)
    _out, err = submit.communicate(timeout=180)
    assert submit.returncode == 0, err
    records = _records(cluster, "partition")
    assert list(records) == ["001-1"]
    assert not records["001-1"]["worker"].startswith(f"{victim.name}@")
    trial_dirs = [p for p in (cluster.jobs_dir / "partition").iterdir() if p.name.startswith("task_")]
    assert [p.name for p in trial_dirs] == [records["001-1"]["trial_dir"]]
    _wait_for(lambda: "result is discarded" in victim.log_path.read_text(), 60, "the late copy to be dropped")


# --- status ----------------------------------------------------------------------------------------------


def test_status_of_a_running_and_a_finished_job(cluster: Cluster) -> None:
    cluster.start_workers(1)
    path = cluster.selection({"001": {"sleep_sec": 3.0}, "002": {"sleep_sec": 0.1}})
    submit = subprocess.Popen(cluster.submit_argv(path, "watched"), env=cluster.env, cwd=cluster.root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _wait_for(lambda: bool(cluster.pier_runs_started()), 30, "a trial to start")
    running = cluster.cli("status", "watched", "--jobs-dir", str(cluster.jobs_dir))
    assert running.returncode == 0, running.stderr
    assert "running 1" in running.stdout and "queued 1" in running.stdout, running.stdout
    assert submit.wait(timeout=120) == 0
    finished = cluster.cli("status", "watched", "--jobs-dir", str(cluster.jobs_dir))
    assert "done 2" in finished.stdout and "w0@" in finished.stdout, finished.stdout


# --- a full disk is a record, not a traceback -------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    mount = tmp_path_factory.mktemp("tmpfs")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_jobs_dir_that_fills_up_ends_in_records_and_one_line(cluster: Cluster, small_disk: Path) -> None:
    behaviours = {"001": {"sleep_sec": 2.0}, "002": {"sleep_sec": 2.0}}
    path = cluster.selection(behaviours, root=small_disk / "selection")
    jobs = small_disk / "jobs"
    worker = Worker("tiny", cluster.env, cluster.root, concurrency=1, extra=FAKE_WORKER, serves=small_disk)
    cluster.workers.append(worker.start())
    worker.wait_ready()
    argv = [*cluster.submit_argv(path, "full"), "--jobs-dir", str(jobs)]
    submit = subprocess.Popen(argv, env=cluster.env, cwd=cluster.root, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    _wait_for(lambda: (jobs / "full" / ".sciencebench" / "job.json").exists(), 30, "the job to be written")
    filler = small_disk / "filler"
    with filler.open("wb", buffering=0) as handle, contextlib.suppress(OSError):
        while True:  # fill what is left of the disk
            handle.write(b"\0" * 65536)
    _out, err = submit.communicate(timeout=180)
    assert submit.returncode == 1
    assert "Traceback" not in err + worker.log_path.read_text()
    assert "No space left on device" in err, err
    job = _job(cluster, "full", jobs)
    coord = RedisCoordinator(cluster.redis.url)
    stored = [coord.get_result(job.job_key, key) for key in job.trial_keys()]
    assert all(stored), "every trial has a record in the store"
    messages = [json.loads(text)["exception_message"] or "" for text in stored if text]
    assert any("No space left on device" in message for message in messages), messages
    assert FAKE_PIER.exists()


# --- missing is not success; retry waits for the job and sends what is missing ----------------------------


def test_missing_records_fail_summarize_and_retry_sends_only_them(cluster: Cluster) -> None:
    cluster.start_workers(1)
    path = cluster.selection({"001": {"sleep_sec": 3.0, "reward": 1.0}, "002": {"reward": 1.0}})
    submit = subprocess.Popen(cluster.submit_argv(path, "gaps"), env=cluster.env, cwd=cluster.root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    _wait_for(lambda: bool(cluster.pier_runs_started()), 30, "a trial to start")
    early = cluster.cli("retry", "gaps", "--failed", "--jobs-dir", str(cluster.jobs_dir))
    assert early.returncode == 2 and "still running" in early.stderr, early.stderr
    _out, err = submit.communicate(timeout=120)
    assert submit.returncode == 0, err
    job = _job(cluster, "gaps")
    trials = cluster.jobs_dir / "gaps" / ".sciencebench" / "trials"

    (trials / "002-1.json").unlink()  # the store still has it: not missing for retry
    kept = cluster.cli("retry", "gaps", "--failed", "--jobs-dir", str(cluster.jobs_dir))
    assert kept.returncode == 0 and "no errored or missing trials" in kept.stdout, kept.stdout + kept.stderr
    assert (trials / "002-1.json").is_file()

    (trials / "002-1.json").unlink()  # gone from disk and store: missing
    redis.Redis.from_url(cluster.redis.url).delete(f"sciencebench:{job.job_key}:result:002#1")
    summary = cluster.cli("summarize", "--job-name", "gaps", "--jobs-dir", str(cluster.jobs_dir))
    assert summary.returncode == 1 and "002" in summary.stderr, summary.stderr
    runs_before = len(cluster.pier_runs())
    again = cluster.cli("retry", "gaps", "--failed", "--wait", "--jobs-dir", str(cluster.jobs_dir))
    assert again.returncode == 0, again.stderr
    assert [r["task"] for r in cluster.pier_runs()[runs_before:]] == ["task_002"]
    assert cluster.cli("summarize", "--job-name", "gaps", "--jobs-dir", str(cluster.jobs_dir)).returncode == 0
