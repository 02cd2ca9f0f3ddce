"""Process control for the benchmark: a private redis-server, workers, bare Celery workers, submits.

Redis, the `sciencebench worker` processes and their stopping come from the
tests' fixtures (`tests/fixtures/services.py`); the bare Celery worker is the
same fixture worker with another command line. Everything `Harness` starts is
stopped by `Harness.close`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import sb
from sciencebench.coordination import embedded
from tests.fixtures.services import FAKE_PIER, VENV_BIN, RedisServer, Worker

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "bench"
HOST_STATE = Path(os.environ.get("SB_STATE", "/var/tmp/sciencebench-host"))


def load_host_env() -> None:
    """Source the host's env.sh and images.env (docker, registry, SB_BASE_IMAGE) into os.environ."""
    env_sh, images = HOST_STATE / "env.sh", HOST_STATE / "images.env"
    if not env_sh.is_file():
        raise SystemExit(f"{env_sh} missing: run scripts/host-setup.sh and scripts/fixture-images.sh first")
    script = f"source {env_sh}; set -a; [ -f {images} ] && source {images}; set +a; env -0"
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    for item in out.split(b"\0"):
        key, sep, value = item.decode().partition("=")
        if sep and key not in ("_", "SHLVL", "PWD", "OLDPWD"):
            os.environ[key] = value
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    if "SB_BASE_IMAGE" not in os.environ:
        raise SystemExit("SB_BASE_IMAGE unset: run scripts/fixture-images.sh first")


class BareWorker(Worker):
    """A stock `celery worker` of bench.noop_app (prefork, -O fair, -E): the fixture worker, other argv."""

    def argv(self) -> list[str]:
        """`celery -A bench.noop_app worker` with the pool settings sciencebench's workers use."""
        return [sys.executable, "-m", "celery", "-A", "bench.noop_app", "worker", "-P", "prefork",
                f"--concurrency={self.concurrency}", "-O", "fair", "-E", "--loglevel=INFO",
                f"--hostname={self.name}@%h"]  # fmt: skip


def stop_all(workers: list[Worker]) -> None:
    """SIGTERM every worker's group at once (warm shutdown), then wait for each."""
    for worker in workers:
        if worker.proc and worker.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.proc.pid, signal.SIGTERM)
    for worker in workers:
        worker.stop()


@dataclass(frozen=True)
class Submitted:
    """One in-process submit, timed from `prepare` to the finalizer's answer (monotonic seconds)."""

    t0: float
    t1: float
    wall_s: float
    prepare_s: float
    dispatch_s: float
    answer: dict[str, Any]
    n_trials: int


class Harness:
    """The benchmark's processes and files: one private redis, its workers, its work directory."""

    def __init__(self, workdir: Path) -> None:
        self.work = workdir
        self.fake_pier_py = FAKE_PIER
        # What fake jobs name as Pier: the fake, behind a wrapper that logs its true start.
        self.fake_pier = BENCH_DIR / "timed_fake_pier.sh"
        self.pier_start_log = workdir / "pier-starts.log"
        self.venv_bin = VENV_BIN
        self.redis = RedisServer(workdir / "redis")
        self.workers: list[Worker] = []
        self.bare_workers: list[BareWorker] = []
        self.jobs_dir = workdir / "jobs"
        self.state_dir = workdir / "host-state"
        self.fake_log = workdir / "fake-pier.jsonl"
        self.base_image = os.environ["SB_BASE_IMAGE"]
        self.registry = os.environ.get("SCIENCEBENCH_TEST_REGISTRY", "127.0.0.1:5555")
        self.pushed_refs: list[str] = []
        self._apps: dict[str, Any] = {}
        self._docker_worker: Worker | None = None
        self._docker_pier = ""

    # ---- infrastructure

    def env(self, db: int = 0, **extra: str) -> dict[str, str]:
        """Environment of every process the benchmark starts (broker on redis db `db`)."""
        env = dict(os.environ)
        env.update(
            SCIENCEBENCH_BROKER_URL=self.url(db),
            SCIENCEBENCH_STATE_DIR=str(self.state_dir),
            FAKE_PIER_LOG=str(self.fake_log),
            BENCH_PIER_START_LOG=str(self.pier_start_log),
            SCIENCEBENCH_PIER_ENV="FAKE_PIER_LOG:BENCH_PIER_START_LOG",
            LITELLM_LOCAL_MODEL_COST_MAP="True",
            # The hosts it simulates run fake trials that hold nothing: their slots, not the machine's
            # cores and memory, bound them (`worker --cpus`, `--memory`).
            SCIENCEBENCH_CPUS="1024",
            SCIENCEBENCH_MEMORY="4T",
            PATH=f"{self.venv_bin}{os.pathsep}{os.environ['PATH']}",
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        )
        env.pop("SCIENCEBENCH_RESULT_BACKEND", None)
        env.update(extra)
        return env

    def url(self, db: int = 0) -> str:
        """The private redis, database `db`."""
        return f"redis://127.0.0.1:{self.redis.port}/{db}"

    def start(self) -> None:
        """Start the private redis and make the job and state directories."""
        self.redis.start()
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    def start_workers(
        self, count: int, concurrency: int, env: dict[str, str] | None = None, pier_bin: str | None = None
    ) -> list[Worker]:
        """Start `count` sciencebench workers of `concurrency` slots and wait until they are ready.

        They run the fake Pier unless `pier_bin` names another (a worker runs its own Pier).
        """
        extra = ["--pier-bin", pier_bin or str(self.fake_pier)]
        started = [
            Worker(f"w{len(self.workers) + i}", env or self.env(), self.work, concurrency, extra).start()
            for i in range(count)
        ]
        for worker in started:
            worker.wait_ready(timeout=180)
        self.workers += started
        return started

    def stop_workers(self, workers: list[Worker] | None = None) -> None:
        """Stop some (default: all) sciencebench workers, all at once."""
        chosen = list(workers if workers is not None else self.workers)
        stop_all(chosen)
        for worker in chosen:
            self.workers.remove(worker)

    def close(self) -> None:
        """Stop everything this harness started and remove the images it pushed."""
        for worker in [*self.workers, *self.bare_workers]:
            with contextlib.suppress(Exception):
                worker.stop()
        with contextlib.suppress(Exception):
            self.redis.stop()
        for state in (self.state_dir, self.pull_state):  # the embedded stores of its `submit --local`s
            with contextlib.suppress(Exception):
                embedded.stop(state)
        if self.pushed_refs:
            from bench.images import remove_images

            remove_images(self.pushed_refs)

    def app(self, db: int = 0) -> Any:
        """sciencebench's Celery app on redis db `db` (one per db)."""
        url = self.url(db)
        if url not in self._apps:
            self._apps[url] = sb.create_app(sb.Settings.from_env(self.env(db)))
        return self._apps[url]

    # ---- bare Celery workers (the yardstick of item 2)

    def start_bare_workers(self) -> None:
        """2 bare prefork workers x 2 slots of bench.noop_app on redis db 0 (once)."""
        if self.bare_workers:
            return
        env = self.env(BENCH_BROKER_URL=self.url(0), BENCH_NOOP_EVENTS="1")
        self.bare_workers = [BareWorker(f"bare{i}", env, self.work, 2).start() for i in range(2)]
        for worker in self.bare_workers:
            worker.wait_ready(timeout=90)
        self.bare_app().control.ping(timeout=2)

    def stop_bare_workers(self) -> None:
        """Stop the bare workers, all at once."""
        stop_all(list(self.bare_workers))
        self.bare_workers = []

    def bare_app(self) -> Any:
        """The bare no-op Celery app (bench.noop_app) on redis db 0, with events."""
        from bench.noop_app import create_noop_app

        if "bare" not in self._apps:
            self._apps["bare"] = create_noop_app(self.url(0), events=True)
        return self._apps["bare"]

    # ---- docker items

    @property
    def pull_state(self) -> Path:
        """Host state dir of the docker items' worker: its pull log holds only this run's pulls."""
        return self.work / "host-state-docker"

    def docker_worker(self, slots: int, pier_bin: str | None = None) -> Worker:
        """One worker for items 4 and 5: `slots` slots, its own state dir, running `pier_bin` (default: fake).

        A worker runs its own Pier, so item 5's real Pier needs a worker of its own.
        """
        wanted = pier_bin or str(self.fake_pier)
        if (
            self._docker_worker is not None
            and self._docker_worker in self.workers
            and self._docker_pier == wanted
        ):
            return self._docker_worker
        if self.workers:
            self.stop_workers()
        self.pull_state.mkdir(parents=True, exist_ok=True)
        env = self.env(SCIENCEBENCH_STATE_DIR=str(self.pull_state))
        if pier_bin is not None:  # real Pier's trials hold what they ask: the host's own capacity (empty)
            env.update(SCIENCEBENCH_CPUS="", SCIENCEBENCH_MEMORY="")
        self._docker_worker = self.start_workers(1, slots, env=env, pier_bin=wanted)[0]
        self._docker_pier = wanted
        return self._docker_worker

    def has_docker_worker(self) -> bool:
        """Whether the docker items' worker is running."""
        return self._docker_worker is not None and self._docker_worker in self.workers

    # ---- selections and jobs

    def selection(self, name: str, behaviours: dict[str, dict[str, Any]], **kw: Any) -> Path:
        """A selection of fake tasks under the work dir; `behaviours` is each task's fake.json."""
        from tests.fixtures.selection import make_selection

        kw.setdefault("agent_image", self.base_image)
        kw.setdefault("verifier_image", self.base_image)
        path = make_selection(self.work / name, list(behaviours), **kw)
        for task_id, behaviour in behaviours.items():
            (path / f"task_{task_id}" / "fake.json").write_text(json.dumps(behaviour))
        return path

    def submit(
        self,
        path: Path,
        job_name: str,
        *,
        n_concurrent: int,
        n_attempts: int = 1,
        agent: str = "nop",
        task_id: str | None = None,
        db: int = 0,
        timeout: float = 1800,
    ) -> Submitted:
        """What `sciencebench submit --wait` does, in this process; timed to the finalizer's answer."""
        settings = sb.Settings.from_env(self.env(db))
        app = self.app(db)
        coord = sb.RedisCoordinator(settings.broker_url)
        opts = sb.SubmitOptions(
            path=path,
            agent=agent,
            n_concurrent=n_concurrent,
            n_attempts=n_attempts,
            jobs_dir=self.jobs_dir,
            job_name=job_name,
            task_id=task_id,
        )
        t0 = time.monotonic()
        prepared = sb.prepare(opts, hosts=lambda: sb.Cluster.live(coord, settings.lease_seconds))
        record = sb.build_run_record(
            prepared.job, prepared.trials[0], settings.broker_url, prepared.secret_values
        )
        prepared = sb.persist(prepared, record)
        t_dispatch = time.monotonic()
        final = sb.dispatch(app, coord, prepared.job, prepared.trials)
        t_sent = time.monotonic()
        answer = final.get(timeout=timeout, interval=0.05)
        t1 = time.monotonic()
        return Submitted(
            t0=t0,
            t1=t1,
            wall_s=t1 - t0,
            prepare_s=t_dispatch - t0,
            dispatch_s=t_sent - t_dispatch,
            answer=answer,
            n_trials=len(prepared.trials),
        )

    def trials_dir(self, job_name: str) -> Path:
        """Where a job's trial records are written (`<task>-<attempt>.json`)."""
        return self.jobs_dir / job_name / ".sciencebench" / "trials"
