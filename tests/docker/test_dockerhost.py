"""sciencebench.worker.docker and preflight on the real Docker Engine 28 and real Pier.

Needs `source /var/tmp/sciencebench-host/env.sh` (scripts/host-setup.sh) and
the fixture images (scripts/fixture-images.sh). Talks only to the local engine
and the loopback registry. Every object a test creates carries a unique name
(`sbt<hex>...`), so tests never touch other engineers' containers or images,
and each test removes what it created, registry manifests included.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import string
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker
import pytest

from sciencebench.core import versions
from sciencebench.core.errors import NoRoomError, PreflightError, PullError
from sciencebench.core.settings import STATE_DIR_ENV
from sciencebench.dockerhost import hostlocks, labels, naming
from sciencebench.worker import preflight
from sciencebench.worker.docker import budget, cleanup, engine, images
from sciencebench.worker.docker.imageholds import hold_images
from tests.fixtures.engines import private_engine
from tests.fixtures.registry import Published, present
from tests.fixtures.registry import docker_cli as _docker

pytestmark = pytest.mark.docker

PLATFORM = "linux/amd64"
REPO = Path(__file__).resolve().parents[2]
PIER_BIN = str(Path(sys.executable).parent / "pier")


# --- environment --------------------------------------------------------------


def _images_env() -> dict[str, str]:
    path = Path(os.environ.get("SB_STATE", "/var/tmp/sciencebench-host")) / "images.env"
    values: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
    return values


@pytest.fixture(scope="module")
def registry() -> str:
    value = os.environ.get("SCIENCEBENCH_TEST_REGISTRY")
    if not value or not os.environ.get("DOCKER_HOST"):
        raise RuntimeError(
            "no test engine/registry: source /var/tmp/sciencebench-host/env.sh (scripts/host-setup.sh)"
        )
    return value


@pytest.fixture(scope="module")
def base_image(registry: str) -> str:
    ref = os.environ.get("SB_BASE_IMAGE") or _images_env().get("SB_BASE_IMAGE")
    if not ref:
        raise RuntimeError("no SB_BASE_IMAGE: run scripts/fixture-images.sh")
    return ref


@pytest.fixture(scope="module")
def client(registry: str) -> Iterator[docker.DockerClient]:
    connected = engine.connect()
    yield connected
    connected.close()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv(STATE_DIR_ENV, str(path))
    return path


def _uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def published(registry: str) -> Iterator[Published]:
    images = Published(registry)
    yield images
    images.cleanup()


# --- engine facts and preflight -----------------------------------------------


def test_engine_facts_and_preflight(client: docker.DockerClient, tmp_path: Path) -> None:
    facts = engine.engine_facts(client)
    assert versions.parse_version(facts.server_version) >= (28, 0, 0)  # type: ignore[operator]
    assert facts.platform == PLATFORM
    assert facts.compose_version and facts.compose_problem is None
    report = preflight.check_host(PLATFORM, tmp_path / "jobs", PIER_BIN)
    assert report.pier_version == "0.3.0"
    assert report.engine_version == facts.server_version
    assert (tmp_path / "jobs").is_dir()


def test_preflight_wrong_platform(registry: str) -> None:
    with pytest.raises(PreflightError, match="runs linux/amd64 but the job needs linux/arm64"):
        preflight.check_host("linux/arm64", None, PIER_BIN)


# --- pulls --------------------------------------------------------------------


def test_ensure_pulls_by_digest_and_verifies(
    client: docker.DockerClient, base_image: str, published: Published, state: Path
) -> None:
    uid = _uid()
    fresh = published.unique(f"pull-{uid}")
    retagged = published.retag(base_image, f"retag-{uid}")
    assert not present(client, fresh) and not present(client, retagged)

    puller = images.ImagePuller()
    statuses = puller.ensure_images([fresh, retagged], PLATFORM, skip_pull=False)
    assert [(s.ref, s.pulled) for s in statuses] == [(fresh, True), (retagged, True)]
    for ref in (fresh, retagged):
        repo_digests = client.images.get(ref).attrs["RepoDigests"]
        assert ref in repo_digests
    assert images.pull_counts(state) == {fresh.split("@")[1]: 1, retagged.split("@")[1]: 1}

    # Present with the pinned digest: not pulled again, by this or another puller.
    again = images.ImagePuller().ensure_images([fresh, retagged], PLATFORM, skip_pull=False)
    assert not any(s.pulled for s in again)
    assert len(images.read_pull_log(state)) == 2
    # skip_pull trusts them too.
    assert puller.ensure([fresh, retagged], PLATFORM, skip_pull=True).keys() == {fresh, retagged}
    print(
        "\npull: "
        + ", ".join(f"{s.ref.split('/')[-1][:24]} {s.seconds:.2f}s" for s in statuses)
        + f"; present check {max(s.seconds for s in again) * 1000:.1f} ms"
    )


def test_wrong_digest_fails_with_pull_error(base_image: str, state: Path) -> None:
    repo = base_image.split("@")[0]
    missing = f"{repo}@sha256:{uuid.uuid4().hex}{uuid.uuid4().hex}"
    with pytest.raises(PullError) as err:
        images.ImagePuller().ensure([missing], PLATFORM, skip_pull=False)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"pull of {missing} for {PLATFORM} failed: ")
    assert "not found" in message or "manifest unknown" in message
    assert images.pull_counts(state) == {}


def test_skip_pull_with_missing_image_names_it(published: Published, state: Path) -> None:
    ref = published.unique(f"skip-{_uid()}", size=1024)
    with pytest.raises(PullError) as err:
        images.ImagePuller().ensure([ref], PLATFORM, skip_pull=True)
    assert str(err.value) == f"image {ref} is not present on this host, and skip_pull forbids pulling it"


def test_pull_uses_the_hosts_credential_helper(
    client: docker.DockerClient,
    registry: str,
    published: Published,
    state: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref = published.unique(f"cred-{_uid()}", size=1024)
    config = tmp_path / "docker-config"
    bin_dir = tmp_path / "bin"
    config.mkdir()
    bin_dir.mkdir()
    calls = tmp_path / "helper-calls"
    helper = bin_dir / "docker-credential-sbtest"
    helper.write_text(
        f'#!/bin/sh\nread server; echo "$1 $server" >> {calls}\n'
        'printf \'{"ServerURL":"%s","Username":"sb","Secret":"pw"}\' "$server"\n'
    )
    helper.chmod(0o755)
    (config / "config.json").write_text(json.dumps({"credHelpers": {registry: "sbtest"}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    statuses = images.ImagePuller().ensure_images([ref], PLATFORM, skip_pull=False)
    assert statuses[0].pulled and present(client, ref)
    assert calls.read_text() == f"get {registry}\n"


_PULL_SCRIPT = """
import json, sys, time
from pathlib import Path
from sciencebench.worker.docker.images import ImagePuller
state, start_at, refs = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
puller = ImagePuller(state)
time.sleep(max(0.0, start_at - time.time()))
print(json.dumps([s.__dict__ for s in puller.ensure_images(refs, "linux/amd64", skip_pull=False)]))
"""


def test_concurrent_trials_share_one_pull_per_image(
    client: docker.DockerClient, published: Published, state: Path
) -> None:
    uid = _uid()
    refs = [
        published.unique(f"conc-a-{uid}", size=8 << 20),
        published.unique(f"conc-b-{uid}", size=8 << 20),
    ]
    assert not any(present(client, ref) for ref in refs)

    start_at = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PULL_SCRIPT, str(state), repr(start_at), *refs],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
        )
        for _ in range(2)
    ]
    puller = images.ImagePuller(state)  # one per worker process, shared by its threads
    results: list[list[dict[str, Any]]] = []
    errors: list[BaseException] = []

    def trial() -> None:
        time.sleep(max(0.0, start_at - time.time()))
        try:
            results.append([s.__dict__ for s in puller.ensure_images(refs, PLATFORM, skip_pull=False)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=trial) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()
        results.append(json.loads(out))
    assert not errors
    assert len(results) == 10

    counts = images.pull_counts(state)
    assert counts == {ref.split("@")[1]: 1 for ref in refs}
    pulled = sorted(s["ref"] for statuses in results for s in statuses if s["pulled"])
    assert pulled == sorted(refs)
    assert all(present(client, ref) for ref in refs)
    log = images.read_pull_log(state)
    waits = [s["waited_sec"] for statuses in results for s in statuses if not s["pulled"]]
    print(
        f"\nconcurrent: 10 callers x 2 images -> pulls per digest {sorted(counts.values())}; "
        f"pull seconds {[r.seconds for r in log]}; callers that waited on the lock "
        f"{sum(w > 0.01 for w in waits)}/{len(waits)}, max wait {max(waits):.2f}s"
    )


# --- the image budget -----------------------------------------------------------

MIB = 1 << 20


@pytest.fixture
def own_engine(
    tmp_path: Path, registry: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[docker.DockerClient]:
    """A private Engine (its client) that `engine.connect` finds: the budget counts its whole Engine."""
    with private_engine("budget", tmp_path / "engine", registry) as own:
        monkeypatch.setenv("DOCKER_HOST", own.docker_host)
        client = own.client()
        yield client
        client.close()


def _held_sizes(client: docker.DockerClient, refs: list[str]) -> int:
    return sum(int(client.images.get(ref).attrs["Size"]) for ref in refs if present(client, ref))


def test_budget_evicts_the_least_recently_used_free_image(
    own_engine: docker.DockerClient, published: Published, state: Path
) -> None:
    client = own_engine
    small, middle, large = (published.unique(f"budget-{n}m-{_uid()}", size=n * MIB) for n in (4, 8, 12))
    puller = images.ImagePuller(image_budget=21 * MIB)  # fits the two larger ones, not all three
    for ref in (small, middle):  # two trials, one after the other
        with hold_images([ref], state):
            puller.ensure([ref], PLATFORM, skip_pull=False)
    assert present(client, small) and present(client, middle)

    with hold_images([large], state):
        puller.ensure([large], PLATFORM, skip_pull=False)
        # `small` was used least recently and nothing holds it: it went, and only it.
        assert not present(client, small)
        assert present(client, middle) and present(client, large)
        assert _held_sizes(client, [small, middle, large]) <= 21 * MIB
    # Only `small` was evicted (the build cache other builds left on the engine may be pruned with it).
    evictions = [e for e in budget.read_evictions(images.pull_log_path(state)) if e.event == "evicted"]
    assert [e.ref for e in evictions] == [small]
    assert evictions[0].size >= 4 * MIB
    assert "task images" in puller.budget.summary(client) and "1 evicted" in puller.budget.summary(client)

    # Needed again: pulled again (its size known from the log now), evicting the least recent, `middle`.
    with hold_images([small], state):
        puller.ensure([small], PLATFORM, skip_pull=False)
    assert present(client, small) and not present(client, middle) and present(client, large)
    assert images.pull_counts(state)[small.split("@")[1]] == 2


def test_budget_never_evicts_an_image_a_trial_holds(
    own_engine: docker.DockerClient, published: Published, state: Path
) -> None:
    client = own_engine
    first, second, third = (published.unique(f"held-{n}-{_uid()}", size=8 * MIB) for n in range(3))
    with hold_images([first], state), hold_images([second], state):  # two running trials
        images.ImagePuller(image_budget=20 * MIB).ensure([first, second], PLATFORM, skip_pull=False)
        with hold_images([third], state):
            # Its size is unknown before its first pull here: it runs, over the budget by its own image.
            images.ImagePuller(image_budget=20 * MIB).ensure([third], PLATFORM, skip_pull=False)
        assert present(client, first) and present(client, second) and present(client, third)
        client.images.remove(third)
        with hold_images([third], state), pytest.raises(NoRoomError, match="exceed its image budget"):
            # Now its size is known: it cannot fit beside the two held images, so it goes back to the queue.
            images.ImagePuller(image_budget=20 * MIB).ensure([third], PLATFORM, skip_pull=False)
        assert present(client, first) and present(client, second) and not present(client, third)
    # The trials ended: now the third fits by evicting the least recently used.
    with hold_images([third], state):
        images.ImagePuller(image_budget=20 * MIB).ensure([third], PLATFORM, skip_pull=False)
    assert present(client, third) and present(client, first) != present(client, second)
    assert len([e for e in budget.read_evictions(images.pull_log_path(state)) if e.event == "evicted"]) == 1


def test_budget_leaves_images_it_did_not_pull_alone(
    own_engine: docker.DockerClient, published: Published, state: Path
) -> None:
    client = own_engine
    other = published.unique(f"other-{_uid()}", size=2 * MIB)
    client.images.pull(other.split("@")[0], tag=other.split("@")[1])  # present, not in the pull log
    big = published.unique(f"alone-{_uid()}", size=6 * MIB)
    with hold_images([big], state):
        images.ImagePuller(image_budget=1 * MIB).ensure([big], PLATFORM, skip_pull=False)  # over: runs anyway
    assert present(client, other) and present(client, big)
    assert budget.read_evictions(images.pull_log_path(state)) == []


# --- cleanup ------------------------------------------------------------------


def _rand7() -> str:
    return "".join(random.choices(string.ascii_letters + string.digits, k=7))


def _write_project(
    directory: Path, base_image: str, labelled_repo: str | None = None, owner: str = ""
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "Dockerfile").write_text(f"FROM {base_image}\nRUN echo derived > /derived\n")
    labelled = (
        f"""
  labelled:
    profiles: ["publish"]
    build:
      context: .
    image: {labelled_repo}:t
"""
        if labelled_repo
        else ""
    )
    (directory / "compose.yaml").write_text(
        f"""
services:
  main:
    build:
      context: .
    command: ["sh", "-c", "sleep infinity"]
    stop_signal: SIGKILL
    labels: {{"{labels.MANAGED_LABEL}": "agent", "{labels.OWNER_LABEL}": "{owner}"}}
    volumes: ["data:/data"]
    networks: [default, side]
  sidecar:
    image: {base_image}
    command: ["sh", "-c", "sleep infinity"]
    stop_signal: SIGKILL
{labelled}
volumes:
  data: {{}}
networks:
  side:
    internal: true
"""
    )
    return directory / "compose.yaml"


def _compose(project: str, compose_file: Path, *args: str) -> None:
    _docker("compose", "-p", project, "-f", str(compose_file), *args)


def _project_objects(client: docker.DockerClient, project: str) -> dict[str, list[str]]:
    only = {"label": f"{labels.COMPOSE_PROJECT_LABEL}={project}"}
    return {
        "containers": [c.name or "" for c in client.containers.list(all=True, filters=only)],
        "networks": [n.name or "" for n in client.networks.list(filters=only)],
        "volumes": [v.name or "" for v in client.volumes.list(filters=only)],
        "images": [t for i in client.images.list(filters=only) for t in i.tags],
    }


def test_cleanup_trial_removes_project_objects_but_not_pinned_images(
    client: docker.DockerClient, base_image: str, published: Published, registry: str, tmp_path: Path
) -> None:
    trial_name = f"task_{_uid()}__{_rand7()}"
    agent_project, verifier_project = naming.trial_project_names(trial_name)
    labelled_repo = f"{registry}/sciencebench-test/labelled-{_uid()}"
    compose_file = _write_project(tmp_path / "env", base_image, labelled_repo)
    # A registry image that carries this project's label: cleanup must keep it.
    _compose(agent_project, compose_file, "--profile", "publish", "build", "labelled")
    labelled_ref = published.push_existing(f"{labelled_repo}:t")
    _compose(agent_project, compose_file, "up", "-d", "--wait", "main", "sidecar")
    _compose(verifier_project, compose_file, "up", "-d", "--wait", "sidecar")
    try:
        before = _project_objects(client, agent_project)
        assert len(before["containers"]) == 2 and len(before["networks"]) == 2
        assert before["volumes"] == [f"{agent_project}_data"]
        assert f"{agent_project}-main:latest" in before["images"]
        assert f"{labelled_repo}:t" in before["images"]
        assert _project_objects(client, verifier_project)["containers"]

        report = cleanup.remove_projects(naming.trial_project_names(trial_name))
        assert report.errors == []
        assert report.projects == [agent_project, verifier_project]
        assert sorted(report.containers) == sorted(
            [f"{agent_project}-main-1", f"{agent_project}-sidecar-1", f"{verifier_project}-sidecar-1"]
        )
        assert sorted(report.networks) == sorted(
            [f"{agent_project}_default", f"{agent_project}_side", f"{verifier_project}_default"]
        )
        assert report.volumes == [f"{agent_project}_data"]
        assert report.images == [f"{agent_project}-main:latest"]
        assert f"{labelled_repo}:t" in report.kept_images

        assert _project_objects(client, agent_project) == {
            "containers": [],
            "networks": [],
            "volumes": [],
            "images": [f"{labelled_repo}:t"],
        }
        assert _project_objects(client, verifier_project) == {
            "containers": [],
            "networks": [],
            "volumes": [],
            "images": [],
        }
        assert present(client, base_image)
        assert present(client, labelled_ref)
        # Idempotent.
        again = cleanup.remove_projects([agent_project, verifier_project])
        assert (again.containers, again.networks, again.images, again.errors) == ([], [], [], [])
    finally:
        for project in (agent_project, verifier_project):
            _docker("compose", "-p", project, "down", "-v", "--rmi", "local", check=False)
        _docker("rmi", f"{labelled_repo}:t", check=False)


def test_sweep_removes_orphans_only(
    client: docker.DockerClient, base_image: str, tmp_path: Path, state: Path
) -> None:
    prefix = f"sbt{_uid()}"
    orphan, active, leased = (f"{prefix}{k}__{_rand7()}" for k in "abc")
    foreign = f"{prefix}-redis"  # a compose project that is not a Pier trial
    compose_file = _write_project(tmp_path / "env", base_image, owner=hostlocks.owner_id(state))
    projects = [naming.compose_project_name(n) for n in (orphan, active, leased)] + [foreign]
    for project in projects:
        _compose(project, compose_file, "up", "-d", "--wait", "main")
    # A Pier-shaped trial that sciencebench did not start (someone's own `pier run`).
    unmanaged = naming.compose_project_name(f"{prefix}d__{_rand7()}")
    _compose(unmanaged, compose_file, "up", "-d", "--wait", "sidecar")
    # A live trial of another worker state on the same Engine.
    foreign_file = _write_project(tmp_path / "other", base_image, owner="another-worker-state")
    other_worker = naming.compose_project_name(f"{prefix}e__{_rand7()}")
    _compose(other_worker, foreign_file, "up", "-d", "--wait", "main")
    projects += [unmanaged, other_worker]
    orphan_project = projects[0]
    try:
        # Leased the way a trial runner does before Pier has named the trial.
        with hostlocks.hold_live_trial(naming.pier_trial_prefix(f"{prefix}c"), state):
            report = cleanup.sweep_leftovers(active={active}, prefix=prefix, state=state)
        assert report.errors == []
        assert report.projects == [orphan_project]
        assert report.images == [f"{orphan_project}-main:latest"]
        assert _project_objects(client, orphan_project) == {
            "containers": [],
            "networks": [],
            "volumes": [],
            "images": [],
        }
        for project in projects[1:]:
            assert len(_project_objects(client, project)["containers"]) == 1, project
        assert present(client, base_image)

        # The lease ended with the block: the next sweep takes the leased trial too.
        report = cleanup.sweep_leftovers(active={active}, prefix=prefix, state=state)
        assert report.projects == [projects[2]]
        assert foreign in cleanup.compose_projects(client)
        assert unmanaged in cleanup.compose_projects(client)
        assert other_worker in cleanup.compose_projects(client)
    finally:
        cleanup.remove_projects(projects)
    assert not {p for p in cleanup.compose_projects(client) if p.startswith(prefix)}
    assert present(client, base_image)


# --- Pier's own naming ----------------------------------------------------------


def test_project_naming_matches_pier_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pier_docker = importlib.import_module("pier.environments.docker.docker")
    pier_trial = importlib.import_module("pier.trial.trial")
    names = [
        "task_002__AbC1xyz",
        "Task.V2__q7RT9zz",
        "_x__1234567",
        "task_" + "y" * 27 + "__ZZ9zz9z",
        "weird name+chars__abcdefg",
    ]
    for name in names:
        assert naming.compose_project_name(name) == pier_docker._sanitize_docker_compose_project_name(name)
        fake_trial = SimpleNamespace(config=SimpleNamespace(trial_name=name))
        for key in ("trial", "step-1", "a much longer step name that forces truncation"):
            expected = pier_trial.Trial._separate_verifier_session_id(fake_trial, key)
            assert naming.verifier_session_id(name, key) == expected


def test_real_pier_trial_uses_the_predicted_project(base_image: str, tmp_path: Path) -> None:
    task_name = f"sbt{_uid()}"
    task = tmp_path / "tasks" / task_name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text(
        f'[environment]\ndocker_image = "{base_image}"\nallow_internet = false\n'
        "[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 120\n"
    )
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {base_image}\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 4\n")
    jobs = tmp_path / "jobs"
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", DOCKER_DEFAULT_PLATFORM=PLATFORM)
    argv = [PIER_BIN, "run", "-p", str(task), "-a", "oracle", "--jobs-dir", str(jobs), "--job-name", "j",
            "-n", "1", "-k", "1", "--no-delete", "-y", "-q"]  # fmt: skip
    seen: set[str] = set()
    with subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as proc:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            seen |= {p for p in cleanup.compose_projects() if p.startswith(task_name)}
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0].decode(errors="replace")
    assert proc.returncode == 0, output[-2000:]
    trial_dirs = [d for d in (jobs / "j").iterdir() if d.is_dir() and d.name.startswith(f"{task_name}__")]
    assert len(trial_dirs) == 1, output[-2000:]
    trial_name = trial_dirs[0].name
    result = json.loads((trial_dirs[0] / "result.json").read_text())
    assert result["verifier_result"]["rewards"] == {"reward": 1.0}, result.get("exception_info")
    assert seen == {naming.compose_project_name(trial_name)}
    assert all(naming.projects_of_trial(trial_name)(p) for p in seen)
    report = cleanup.remove_projects(naming.trial_project_names(trial_name))
    assert report.errors == []
    assert not {p for p in cleanup.compose_projects() if p.startswith(task_name)}


def test_remove_trial_finds_its_projects_by_label_only(
    client: docker.DockerClient, base_image: str, tmp_path: Path, state: Path
) -> None:
    """A trial's projects go (a step verifier's too); a sibling trial of the same task stays."""
    task = f"sbt{_uid()}"
    trial, sibling = f"{task}__{_rand7()}", f"{task}__{_rand7()}"
    compose_file = _write_project(tmp_path / "env", base_image, owner=hostlocks.owner_id(state))
    agent = naming.compose_project_name(trial)
    step = naming.compose_project_name(naming.verifier_session_id(trial, "build"))
    other = naming.compose_project_name(sibling)
    for project in (agent, step, other):
        _compose(project, compose_file, "up", "-d", "--wait", "main")
    try:
        report = cleanup.remove_trial(trial)
        assert report.errors == []
        assert sorted(report.containers) == sorted(f"{p}-main-1" for p in (agent, step))
        for project in (agent, step):
            assert _project_objects(client, project)["containers"] == [], project
        assert len(_project_objects(client, other)["containers"]) == 1
    finally:
        cleanup.remove_projects([agent, step, other])
    assert present(client, base_image)
