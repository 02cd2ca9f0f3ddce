"""A real multi-host cluster, deployed the way docs/deployment.md says (issue 16).

The control plane comes from compose/control-plane.yml (Redis with its
password and AOF, Flower with basic auth) and two worker hosts from
compose/worker-host.yml, each its own compose project: its own hostname,
state volume and network namespace, reaching Redis over the control plane's
Docker network, driving this machine's Engine through its socket, running as
an unprivileged account. The jobs and selection directories are bind-mounted
at identical paths. This process is the login node: it submits to Redis's
published loopback port. Real Pier runs the demo selection (oracle: task_001
reward 1, task_002 reward 0). Images: scripts/cluster-images.sh.
"""

from __future__ import annotations

import csv
import json
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import pytest

from sciencebench.demo import build_demo_selection
from sciencebench.login.selection import load_selection
from tests.fixtures.cluster import (
    OWNER_LABEL,
    REPO,
    ClusterImages,
    ControlPlane,
    Login,
    SharedPaths,
    WorkerHost,
    docker_socket,
    owner_id,
    run,
    until,
)

pytestmark = pytest.mark.docker

LEASE_SECONDS = 10
# The workers' account: owner group of the shared directories, not root.
WORKER_UID = WORKER_GID = 10123
# Oracle rewards of the demo selection.
REWARDS = {"001": 1.0, "002": 0.0}


@dataclass
class Deployment:
    control: ControlPlane
    shared: SharedPaths
    login: Login
    selection: Path
    images: ClusterImages
    workdir: Path
    prefix: str
    hosts: dict[str, WorkerHost] = field(default_factory=dict)

    def host_values(self, hostname: str, **overrides: str) -> dict[str, str]:
        """A worker host's env file (compose/example.env's worker section)."""
        socket = docker_socket()
        values = {
            "SCIENCEBENCH_WORKER_IMAGE": self.images.worker,
            "SCIENCEBENCH_BROKER_URL": self.control.internal_broker_url,
            "SCIENCEBENCH_LEASE_SECONDS": str(LEASE_SECONDS),
            "SCIENCEBENCH_HOSTNAME": hostname,
            "SCIENCEBENCH_CONCURRENCY": "2",
            "SCIENCEBENCH_JOBS_DIR": str(self.shared.jobs),
            "SCIENCEBENCH_SELECTIONS_DIR": str(self.shared.selections),
            "SCIENCEBENCH_ENV_FILES_DIR": str(self.shared.profiles),
            "SCIENCEBENCH_UID": str(WORKER_UID),
            "SCIENCEBENCH_GID": str(WORKER_GID),
            "SCIENCEBENCH_DOCKER_SOCKET": str(socket),
            "SCIENCEBENCH_REGISTRY_AUTH_DIR": str(self.workdir / "registry-auth"),
            "SCIENCEBENCH_PROXY_IMAGE": self.images.proxy,
            "SCIENCEBENCH_STOP_GRACE_PERIOD": "30s",
            "SCIENCEBENCH_CONTROL_PLANE_NETWORK": self.control.network,
            # Each host's own, as on separate machines: a worker sharing a scratch with another would
            # end that one's dead runs (`worker.recovery`), which this file's hosts are not to do.
            "SCIENCEBENCH_SCRATCH_DIR": str(self.workdir / f"scratch-{hostname}"),
        }
        values.update(overrides)
        return values

    def add_host(self, key: str, **overrides: str) -> WorkerHost:
        hostname = f"{self.prefix}-{key}"
        host = WorkerHost(
            f"{self.prefix}-{key}", hostname, self.workdir, self.host_values(hostname, **overrides)
        )
        self.hosts[key] = host
        return host.up()

    def submit_and_wait(
        self, job: str, *extra: str, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        proc = self.login.submit(self.selection, job, *extra)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def records(self, job: str) -> dict[str, dict[str, object]]:
        """The job's trial records (`.sciencebench/trials/<id>-<attempt>.json`) by file stem."""
        trials = self.shared.jobs / job / ".sciencebench" / "trials"
        return {path.stem: json.loads(path.read_text()) for path in sorted(trials.glob("*.json"))}


def _summary_rows(job_dir: Path) -> list[dict[str, str]]:
    with (job_dir / "summary.csv").open() as handle:
        return list(csv.DictReader(handle))


def _remove_local(client: docker.DockerClient, refs: list[str]) -> None:
    """Remove our freshly built task images from the Engine so the workers must pull them."""
    for ref in refs:
        try:
            image = client.images.get(ref.split(":latest@")[0] + "@" + ref.split("@")[1])
        except docker.errors.ImageNotFound:
            continue
        client.images.remove(image.id, force=True)


def _remove_trial_leftovers(client: docker.DockerClient, hostnames: list[str]) -> None:
    """Containers and networks the hosts' trials left (a killed host's, say): by their owner label."""
    for hostname in hostnames:
        label = f"{OWNER_LABEL}={owner_id(hostname)}"
        projects = set()
        for container in client.containers.list(all=True, filters={"label": label}):
            projects.add(container.labels.get("com.docker.compose.project", ""))
            container.remove(force=True, v=True)
        for project in projects - {""}:
            for network in client.networks.list(filters={"label": f"com.docker.compose.project={project}"}):
                network.remove()


@pytest.fixture(scope="module")
def images() -> ClusterImages:
    return ClusterImages.from_env()


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, images: ClusterImages, base_image: str, registry: str,
    docker_client: docker.DockerClient,
) -> Iterator[Deployment]:  # fmt: skip
    prefix = f"sbct{secrets.token_hex(3)}"
    workdir = tmp_path_factory.mktemp("cluster")
    shared = SharedPaths(workdir / "shared", WORKER_UID, WORKER_GID).create()
    control = ControlPlane(f"{prefix}-cp", workdir, images)
    login = Login(control.broker_url, shared.jobs)
    selection = build_demo_selection(shared.selections / "demo", base_image, registry)
    _remove_local(docker_client, load_selection(selection).image_refs)
    dep = Deployment(control, shared, login, selection, images, workdir, prefix)
    try:
        control.up()
        hosts = [dep.add_host("a"), dep.add_host("b")]
        for host in hosts:
            host.wait_ready()
        yield dep
    finally:
        for host in dep.hosts.values():
            host.down()
        control.down()
        _remove_trial_leftovers(docker_client, [host.hostname for host in dep.hosts.values()])
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_selection_runs_across_both_hosts(deployment: Deployment) -> None:
    dep = deployment
    a, b = dep.hosts["a"], dep.hosts["b"]
    job = "across"
    done = dep.submit_and_wait(job, "--n-attempts", "2", "--n-concurrent", "4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    rows = _summary_rows(dep.shared.jobs / job)
    assert sorted(row["task_id"] for row in rows) == ["task_001", "task_001", "task_002", "task_002"]
    for row in rows:
        assert float(row["reward"]) == REWARDS[row["task_id"].removeprefix("task_")], row
        assert row["failure_class"] == "", row
    records = dep.records(job)
    assert sorted(records) == ["001-1", "001-2", "002-1", "002-2"]
    assert {record["worker"] for record in records.values()} == {a.worker_name, b.worker_name}

    # Each host pulled each image at most once, and together they pulled them all.
    digests = {ref.split("@")[1] for ref in load_selection(dep.selection).image_refs}
    counts = {host.hostname: host.pull_counts() for host in (a, b)}
    assert all(n == 1 for host in counts.values() for n in host.values()), counts
    assert digests <= {digest for host in counts.values() for digest in host}, counts

    # `status` from the login node, against the cluster's Redis.
    status = dep.login.status(job)
    assert sorted(status) == ["task_001 #1", "task_001 #2", "task_002 #1", "task_002 #2"]
    assert {state for state, _ in status.values()} == {"done"}
    assert {host for _, host in status.values()} == {a.worker_name, b.worker_name}

    # Flower, with credentials: both workers, and each trial by its readable name.
    control = dep.control

    def both_workers() -> list[str] | None:
        names = list(control.flower_json("/api/workers?refresh=1"))
        return names if {a.worker_name, b.worker_name} <= set(names) else None

    until("both workers in Flower's /api/workers", both_workers, timeout=60)
    wanted = {f"trial {job}/task_{t}#{n}" for t in REWARDS for n in (1, 2)} | {f"finalize {job}"}

    def named_tasks() -> dict[str, dict[str, object]] | None:
        tasks = control.flower_json("/api/tasks")
        by_name = {str(task.get("name")): task for task in tasks.values()}
        done = all(by_name.get(name, {}).get("state") == "SUCCESS" for name in wanted)
        return by_name if done else None

    try:
        by_name = until("the job's tasks by name in Flower", named_tasks, timeout=120)
    except TimeoutError:
        seen = {task.get("name"): task.get("state") for task in control.flower_json("/api/tasks").values()}
        pytest.fail(f"Flower did not list {sorted(wanted)} as succeeded; it lists {seen}")
    for name in wanted - {f"finalize {job}"}:
        assert by_name[name]["worker"] in (a.worker_name, b.worker_name), by_name[name]
        assert re.fullmatch(r"'task_00[12] #[12]'", str(by_name[name]["args"])), by_name[name]
    found = control.flower_json(f"/api/tasks?search={job}/task_002")
    assert sorted(str(task["name"]) for task in found.values()) == [f"trial {job}/task_002#1",
                                                                   f"trial {job}/task_002#2"]  # fmt: skip
    for path in ("/api/workers", "/api/tasks", "/"):
        assert control.flower(path, auth=False)[0] == 401, path
    assert control.flower("/api/tasks", auth=True)[0] == 200

    # Redis runs with its password and AOF on.
    assert control.redis_cli("config", "get", "appendonly").split() == ["appendonly", "yes"]
    assert control.redis_cli("config", "get", "maxmemory-policy").split() == [
        "maxmemory-policy",
        "noeviction",
    ]


def test_workers_run_unprivileged_with_the_socket_group(deployment: Deployment) -> None:
    """The entrypoint drops from root to SCIENCEBENCH_UID:GID and the socket's group, no capabilities."""
    socket_gid = docker_socket().stat().st_gid
    for host in deployment.hosts.values():
        top = run(["docker", "top", host.container(), "-eo", "pid,uid,gid,args"]).stdout.splitlines()[1:]
        # Celery titles its main process `[celeryd: <name>:MainProcess] ...`.
        worker = [
            line.split(maxsplit=3) for line in top if f"celeryd: {host.worker_name}:MainProcess" in line
        ]
        assert len(worker) == 1, top
        pid, uid, gid, _ = worker[0]
        assert (uid, gid) == (str(WORKER_UID), str(WORKER_GID)), top
        status = Path(f"/proc/{pid}/status").read_text()
        groups = re.search(r"^Groups:(.*)$", status, re.M)
        assert groups and set(groups[1].split()) == {str(WORKER_GID), str(socket_gid)}, status
        assert re.search(r"^CapEff:\s+0+$", status, re.M) and re.search(r"^CapBnd:\s+0+$", status, re.M)
        # Every process of the container but docker-init runs as the account.
        assert {line.split()[1] for line in top if "docker-init" not in line} == {str(WORKER_UID)}, top
        assert f"running as sciencebench (uid {WORKER_UID} gid {WORKER_GID}" in host.logs()
        assert "superuser privileges" not in host.logs()


def test_entrypoint_refuses_root_and_names_the_socket_group(deployment: Deployment) -> None:
    socket = docker_socket()
    base = ["docker", "run", "--rm", "--network", "none", "-v", f"{socket}:/var/run/docker.sock",
            "-e", "SCIENCEBENCH_JOBS_DIR=/tmp"]  # fmt: skip
    as_root = run([*base, deployment.images.worker], check=False)
    assert as_root.returncode == 2
    assert "refusing to run as root: set SCIENCEBENCH_UID and SCIENCEBENCH_GID" in as_root.stderr
    zero = run([*base, "-e", "SCIENCEBENCH_UID=0", "-e", "SCIENCEBENCH_GID=0", deployment.images.worker],
               check=False)  # fmt: skip
    assert zero.returncode == 2 and "refusing to run as root" in zero.stderr
    no_group = run([*base, "--user", f"{WORKER_UID}:{WORKER_GID}", deployment.images.worker], check=False)
    assert no_group.returncode == 2
    gid = socket.stat().st_gid
    assert f"cannot use the Docker socket /var/run/docker.sock (owner gid {gid}" in no_group.stderr
    assert f"docker run --group-add {gid}" in no_group.stderr


def test_cancel_against_the_cluster(deployment: Deployment) -> None:
    dep = deployment
    job = "cancelled"
    proc = dep.login.submit(dep.selection, job, "--n-attempts", "3", "--n-concurrent", "2")
    try:
        until("a trial of the job to run", lambda: (
            True if any(state == "running" for state, _ in dep.login.status(job).values()) else None
        ), timeout=180, interval=2)  # fmt: skip
        cancelled = dep.login.cli("cancel", job, "--jobs-dir", str(dep.shared.jobs))
        assert cancelled.returncode == 0, cancelled.stderr
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out[-2000:] + err[-2000:]
    records = dep.records(job)
    assert len(records) == 6
    kinds = [record["exception_type"] for record in records.values()]
    assert "Cancelled" in kinds, kinds
    assert set(kinds) <= {"Cancelled", None}, kinds
    assert len(_summary_rows(dep.shared.jobs / job)) >= kinds.count(None)
    title = dep.login.cli("status", job, "--jobs-dir", str(dep.shared.jobs)).stdout
    assert "(cancelled)" in title


def test_a_misconfigured_host_swallows_no_trial(deployment: Deployment) -> None:
    dep = deployment
    elsewhere = dep.workdir / "elsewhere"
    elsewhere_jobs = SharedPaths(elsewhere, WORKER_UID, WORKER_GID).create()
    # Its own jobs and selection directories: a host mounted differently from the login node.
    bad = dep.add_host("c", SCIENCEBENCH_JOBS_DIR=str(elsewhere_jobs.jobs),
                       SCIENCEBENCH_SELECTIONS_DIR=str(elsewhere_jobs.selections),
                       SCIENCEBENCH_ENV_FILES_DIR=str(elsewhere_jobs.profiles))  # fmt: skip
    try:
        bad.wait_ready()
        job = "misconfigured"
        done = dep.submit_and_wait(job, "--n-attempts", "3", "--n-concurrent", "6")
        records = dep.records(job)
        status = dep.login.cli("status", job, "--jobs-dir", str(dep.shared.jobs)).stdout
    finally:
        bad.down()
        del dep.hosts["c"]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(records) == 6 and all(record["exception_type"] is None for record in records.values())
    assert bad.worker_name not in {record["worker"] for record in records.values()}
    assert bad.worker_name in status and "unfit" in status.lower(), status


def test_a_killed_host_s_trials_rerun_on_the_other(
    deployment: Deployment, docker_client: docker.DockerClient
) -> None:
    dep = deployment
    a, b = dep.hosts["a"], dep.hosts["b"]
    job = "killed"
    proc = dep.login.submit(dep.selection, job, "--n-attempts", "2", "--n-concurrent", "4")
    owned_by_a = f"{OWNER_LABEL}={owner_id(a.hostname)}"

    def containers_on_a() -> bool | None:
        """Whether Pier has started a trial's containers on host a."""
        return bool(docker_client.containers.list(filters={"label": owned_by_a, "status": "running"})) or None

    try:
        # Kill at once when a's trial has containers (a status call first would give it time to finish);
        # the board still shows a's trials running on a until they are dispatched again.
        until("a trial with live containers on host a", containers_on_a, timeout=240, interval=0.2)
        a.kill()
        killed_at = time.monotonic()
        status = dep.login.status(job)
        on_a = [
            name for name, (state, host) in status.items() if state == "running" and host == a.worker_name
        ]
        assert on_a, status

        def moved() -> bool | None:
            status = dep.login.status(job)
            return True if all(status[trial][1] != a.worker_name for trial in on_a) else None

        until(
            "the killed host's trials to be dispatched again", moved, timeout=4 * LEASE_SECONDS, interval=0.5
        )
        redispatched_s = time.monotonic() - killed_at
        print(f"host a killed; its trials {on_a} dispatched again after {redispatched_s:.1f} s")
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert redispatched_s <= 2 * LEASE_SECONDS, f"dispatched again after {redispatched_s:.1f}s"
    assert proc.returncode == 0, out[-2000:] + err[-2000:]

    # Exactly one result per trial: one record, one summary row, one trial directory each.
    records = dep.records(job)
    assert sorted(records) == ["001-1", "001-2", "002-1", "002-2"]
    for trial in on_a:
        task, attempt = re.fullmatch(r"task_(\S+) #(\d+)", trial).groups()  # type: ignore[union-attr]
        assert records[f"{task}-{attempt}"]["worker"] == b.worker_name
    rows = _summary_rows(dep.shared.jobs / job)
    assert len(rows) == 4
    for row in rows:
        assert float(row["reward"]) == REWARDS[row["task_id"].removeprefix("task_")], row
    assert len([p for p in (dep.shared.jobs / job).iterdir() if p.name.startswith("task_")]) == 4

    # The dead host left its trial's containers behind; they go when its worker starts again.
    assert docker_client.containers.list(all=True, filters={"label": owned_by_a})
    a.start_again()
    assert docker_client.containers.list(all=True, filters={"label": owned_by_a}) == []


def test_the_proxy_image_parses_its_configuration(images: ClusterImages) -> None:
    done = run(["docker", "run", "--rm", "--network", "none", images.proxy,
                "squid", "-k", "parse", "-f", "/etc/squid/squid.conf"], check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    """`systemd-analyze verify` of the shipped unit, in a root holding what it references."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze missing: scripts/cluster-images.sh installs Debian's systemd"
    root = tmp_path / "root"
    units = root / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr" / "lib" / "systemd" / "system", symlinks=True)
    (units / "docker.service").write_text(
        "[Unit]\nDescription=Docker Engine\n[Service]\nExecStart=/bin/true\n"
    )
    venv_bin = root / "opt" / "sciencebench" / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "sciencebench").write_text("#!/bin/sh\n")
    (venv_bin / "sciencebench").chmod(0o755)
    unit = units / "sciencebench-worker.service"
    shutil.copy(REPO / "workers" / "sciencebench-worker.service", unit)
    done = run([analyze, "verify", f"--root={root}", "--man=no", str(unit)], check=False)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    # The check can fail: a broken directive is reported.
    unit.write_text(unit.read_text().replace("KillMode=mixed", "KillMode=sideways"))
    broken = run([analyze, "verify", f"--root={root}", "--man=no", str(unit)], check=False)
    assert "KillMode" in broken.stderr or "kill mode" in broken.stderr
