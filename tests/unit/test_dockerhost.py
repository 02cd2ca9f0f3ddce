"""Pure parts of sciencebench.worker.docker and Pier naming: digests, locks, auth lookup.

The puller's control flow runs against an in-memory fake engine; the real
engine is exercised in tests/docker/test_dockerhost.py.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from sciencebench.core.errors import PullError, WorkspaceError
from sciencebench.core.images import normalize_repository, platform_matches
from sciencebench.dockerhost import hostlocks, labels, naming
from sciencebench.dockerhost.naming import (
    compose_project_name,
    is_pier_project,
    project_trial_key,
    projects_of_trial,
    trial_project_names,
    verifier_session_id,
)
from sciencebench.worker.docker import cleanup, images
from sciencebench.worker.docker.cleanup import derived_image_removable, leftover_projects
from sciencebench.worker.docker.images import ImagePuller, pinned_name, repo_digests_contain

pytestmark = pytest.mark.unit

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
REF_A = f"127.0.0.1:5555/sciencebench/base:v1@{DIGEST_A}"
REF_B = f"127.0.0.1:5555/sciencebench/other@{DIGEST_B}"


# --- naming -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("session_id", "project"),
    [
        ("task_002__AbC1xyz", "task_002__abc1xyz"),
        ("task.v2__Q7rT9zz", "task-v2__q7rt9zz"),
        ("_hidden__abcdefg", "0_hidden__abcdefg"),
        ("Task 1__x", "task-1__x"),
        ("task_002__AbC1xyz__verifier__trial", "task_002__abc1xyz__verifier__trial"),
    ],
)
def test_compose_project_name_follows_pier(session_id: str, project: str) -> None:
    assert compose_project_name(session_id) == project


def test_verifier_session_id_short_and_long() -> None:
    assert verifier_session_id("task_002__AbC1xyz") == "task_002__AbC1xyz__verifier__trial"
    assert verifier_session_id("task_002__AbC1xyz", "step one") == "task_002__AbC1xyz__verifier__step_one"
    long_id = verifier_session_id("task_" + "x" * 27 + "__AbC1xyz", "a-rather-long-step-name")
    assert len(long_id) <= 63
    assert "__verifier" in long_id
    assert long_id.rsplit("__", 1)[1].isalnum() and len(long_id.rsplit("__", 1)[1]) == 8
    # Deterministic: the same inputs give the same project on every host.
    assert long_id == verifier_session_id("task_" + "x" * 27 + "__AbC1xyz", "a-rather-long-step-name")


def test_trial_project_names_and_matcher() -> None:
    names = trial_project_names("task_002__AbC1xyz", verifier_keys=("trial", "build"))
    assert names == [
        "task_002__abc1xyz",
        "task_002__abc1xyz__verifier__trial",
        "task_002__abc1xyz__verifier__build",
    ]
    mine = projects_of_trial("task_002__AbC1xyz")
    assert all(mine(name) for name in names)
    assert not mine("task_002__abc1xyzz")
    assert not mine("task_002__zzzzzzz__verifier__trial")
    assert project_trial_key("task_002__abc1xyz__verifier__trial") == "task_002__abc1xyz"


@pytest.mark.parametrize(
    ("project", "expected"),
    [
        ("task_002__abc1xyz", True),
        ("task_002__abc1xyz__verifier__trial", True),
        ("task-v2__q7rt9zz", True),
        ("sciencebench-redis", False),
        ("task_002__abc", False),
        ("task_002", False),
    ],
)
def test_is_pier_project(project: str, expected: bool) -> None:
    assert is_pier_project(project) is expected


# --- digests and platforms -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "normal"),
    [
        ("ubuntu", "docker.io/library/ubuntu"),
        ("docker.io/ubuntu", "docker.io/library/ubuntu"),
        ("index.docker.io/org/img", "docker.io/org/img"),
        ("org/img", "docker.io/org/img"),
        ("127.0.0.1:5555/sciencebench/base", "127.0.0.1:5555/sciencebench/base"),
        ("localhost/img", "localhost/img"),
        ("ghcr.io/org/img", "ghcr.io/org/img"),
    ],
)
def test_normalize_repository(name: str, normal: str) -> None:
    assert normalize_repository(name) == normal


def test_pinned_name_drops_tag_and_refuses_unpinned() -> None:
    assert pinned_name(REF_A) == f"127.0.0.1:5555/sciencebench/base@{DIGEST_A}"
    with pytest.raises(PullError, match="not pinned by digest"):
        pinned_name("127.0.0.1:5555/sciencebench/base:latest")


def test_repo_digests_contain() -> None:
    assert repo_digests_contain([f"127.0.0.1:5555/sciencebench/base@{DIGEST_A}"], REF_A)
    assert not repo_digests_contain([f"127.0.0.1:5555/sciencebench/base@{DIGEST_B}"], REF_A)
    assert not repo_digests_contain([f"127.0.0.1:5555/sciencebench/copy@{DIGEST_A}"], REF_A)
    assert not repo_digests_contain([], REF_A)
    # Docker Hub images are listed with their familiar name.
    assert repo_digests_contain([f"ubuntu@{DIGEST_A}"], f"docker.io/library/ubuntu:24.04@{DIGEST_A}")


@pytest.mark.parametrize(
    ("platform", "os_", "arch", "variant", "ok"),
    [
        ("linux/amd64", "linux", "amd64", "", True),
        ("linux/amd64", "linux", "arm64", "v8", False),
        ("linux/arm64/v8", "linux", "arm64", "v8", True),
        ("linux/arm64/v8", "linux", "arm64", "", True),
        ("linux/arm/v7", "linux", "arm", "v6", False),
        ("windows/amd64", "linux", "amd64", "", False),
        ("linux", "linux", "amd64", "", False),
    ],
)
def test_platform_matches(platform: str, os_: str, arch: str, variant: str, ok: bool) -> None:
    assert platform_matches(platform, os_, arch, variant) is ok


# --- what cleanup may remove ----------------------------------------------------


def _image(project: str | None, repo_digests: list[str]) -> dict[str, Any]:
    image_labels = {labels.COMPOSE_PROJECT_LABEL: project} if project else None
    return {"Id": "sha256:" + "c" * 64, "Labels": image_labels, "RepoDigests": repo_digests}


def test_derived_image_removable_only_for_own_unpublished_images() -> None:
    project = "task_002__abc1xyz"
    assert derived_image_removable(_image(project, []), project)
    assert derived_image_removable(_image(project, [f"{project}-main@{DIGEST_A}"]), project)
    assert not derived_image_removable(_image("task_003__zzzzzzz", []), project)
    assert not derived_image_removable(_image(None, []), project)
    # A pinned task image that happens to carry the label: it came from a registry.
    pinned = _image(project, [f"127.0.0.1:5555/sciencebench/base@{DIGEST_A}"])
    assert not derived_image_removable(pinned, project)


def test_leftover_projects_spares_live_and_foreign() -> None:
    projects = [
        "task_001__aaaaaaa",
        "task_001__aaaaaaa__verifier__trial",
        "task_002__bbbbbbb",
        "task_002__bbbbbbb__verifier__trial",
        "task_003__ccccccc",
        "sciencebench-redis",
        "other_004__ddddddd",
    ]
    live = {"task_002__BBBBBBB", naming.pier_trial_prefix("task_003")}
    assert leftover_projects(projects, live) == [
        "other_004__ddddddd",
        "task_001__aaaaaaa",
        "task_001__aaaaaaa__verifier__trial",
    ]
    assert leftover_projects(projects, (), prefix="task_00") == [
        "task_001__aaaaaaa",
        "task_001__aaaaaaa__verifier__trial",
        "task_002__bbbbbbb",
        "task_002__bbbbbbb__verifier__trial",
        "task_003__ccccccc",
    ]


def test_pier_trial_prefix() -> None:
    assert naming.pier_trial_prefix("task_002") == "task_002__"
    assert naming.pier_trial_prefix("Task.V2_") == "task-v2__"
    long_name = "task_" + "x" * 26 + "_-yz"
    assert naming.pier_trial_prefix(long_name) == "task_" + "x" * 26 + "__"


# --- leases and locks -------------------------------------------------------------


def test_trial_lease_is_seen_until_released(tmp_path: Path) -> None:
    verifier = "task_002__abc1xyz__verifier__trial"
    assert hostlocks.live_trial_locks(tmp_path) == set()
    with hostlocks.hold_live_trial("task_002__AbC1xyz", tmp_path):
        assert hostlocks.live_trial_locks(tmp_path) == {"task_002__abc1xyz"}
        assert hostlocks.live_trial_held(verifier, tmp_path)
        assert hostlocks.live_trial_held("task_002__abc1xyz", tmp_path)
        assert not hostlocks.live_trial_held("task_003__abc1xyz", tmp_path)
        with hostlocks.hold_live_trial(naming.pier_trial_prefix("task_003"), tmp_path):
            assert hostlocks.live_trial_held("task_003__zzzzzzz", tmp_path)
        assert not hostlocks.live_trial_held("task_003__zzzzzzz", tmp_path)
    assert not hostlocks.live_trial_held(verifier, tmp_path)
    assert hostlocks.live_trial_locks(tmp_path) == set()


def test_trial_lease_of_a_dead_process_is_released(tmp_path: Path) -> None:
    script = (
        "import sys, time; from pathlib import Path; from sciencebench.dockerhost import hostlocks\n"
        "with hostlocks.hold_live_trial('task_005__', Path(sys.argv[1])):\n"
        "    print('held', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"
        assert hostlocks.live_trial_held("task_005__zz9zz9z", tmp_path)
        proc.kill()
        proc.wait(timeout=10)
        assert not hostlocks.live_trial_held("task_005__zz9zz9z", tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_host_lock_excludes_threads_and_times_out(tmp_path: Path) -> None:
    lock = tmp_path / "locks" / "x.lock"
    inside = 0
    overlap = False
    guard = threading.Lock()

    def worker() -> None:
        nonlocal inside, overlap
        with hostlocks.host_lock(lock, timeout_sec=30, what="test"):
            with guard:
                inside += 1
                overlap = overlap or inside > 1
            time.sleep(0.02)
            with guard:
                inside -= 1

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not overlap

    with (
        hostlocks.host_lock(lock, timeout_sec=30, what="test"),
        pytest.raises(PullError, match="waited 0s for another process on this host to finish x"),
        hostlocks.host_lock(lock, timeout_sec=0.1, what="x"),
    ):
        pass


def test_a_state_file_that_is_a_symlink_is_refused_and_its_target_never_touched(tmp_path: Path) -> None:
    """The state dir's locks, holds and logs are opened without following a symlink at the file itself."""
    target = tmp_path / "elsewhere" / "victim"
    target.parent.mkdir()
    lock = tmp_path / "locks" / "y.lock"
    lock.parent.mkdir()
    lock.symlink_to(target)  # dangling: following it with O_CREAT would create the target
    with pytest.raises(WorkspaceError, match=r"host state dir .* is unusable"):
        hostlocks.open_state_file(lock, os.O_RDWR | os.O_CREAT)
    with pytest.raises(WorkspaceError), hostlocks.host_lock(lock, timeout_sec=1, what="test"):
        pass
    assert not target.exists()


# --- the pull log ---------------------------------------------------------------


def test_pull_log_counts(tmp_path: Path) -> None:
    assert images.pull_counts(tmp_path) == {}
    for digest in (DIGEST_A, DIGEST_B, DIGEST_A):
        record = {"ref": "r", "digest": digest, "platform": "linux/amd64", "seconds": 1.0, "pid": 1}
        images._append_line(images.pull_log_path(tmp_path), json.dumps(record | {"finished_at": "t"}))
    assert images.pull_counts(tmp_path) == {DIGEST_A: 2, DIGEST_B: 1}
    assert len(images.read_pull_log(tmp_path)) == 3


# --- registry credentials --------------------------------------------------------


@pytest.fixture
def docker_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "docker-config"
    config.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    return config


def _write_helper(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    helper = bin_dir / f"docker-credential-{name}"
    helper.write_text("#!/bin/sh\n" + body)
    helper.chmod(helper.stat().st_mode | stat.S_IXUSR)


def test_registry_auth_from_auths(docker_config: Path) -> None:
    token = base64.b64encode(b"alice:s3cret").decode()
    (docker_config / "config.json").write_text(json.dumps({"auths": {"127.0.0.1:5555": {"auth": token}}}))
    auth = images.registry_auth("127.0.0.1:5555")
    assert auth is not None
    assert (auth["username"], auth["password"]) == ("alice", "s3cret")
    assert images.registry_auth("127.0.0.1:6666") is None


def test_registry_auth_runs_the_credential_helper(
    docker_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    seen = tmp_path / "helper-calls"
    _write_helper(
        bin_dir,
        "sbtest",
        f'read server; echo "$1 $server" >> {seen}\n'
        'printf \'{"ServerURL":"%s","Username":"bob","Secret":"t0ken"}\' "$server"\n',
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (docker_config / "config.json").write_text(json.dumps({"credHelpers": {"127.0.0.1:5555": "sbtest"}}))
    auth = images.registry_auth("127.0.0.1:5555")
    assert auth is not None
    assert (auth["Username"], auth["Password"]) == ("bob", "t0ken")
    assert seen.read_text() == "get 127.0.0.1:5555\n"
    # Registries the helper is not configured for stay anonymous.
    assert images.registry_auth("127.0.0.1:6666") is None


def test_registry_auth_missing_or_failing_helper(
    docker_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (docker_config / "config.json").write_text(
        json.dumps({"credHelpers": {"127.0.0.1:5555": "absent", "127.0.0.1:5556": "broken"}})
    )
    with pytest.raises(
        PullError, match=r"docker-credential-absent configured for 127.0.0.1:5555 .*not on PATH"
    ):
        images.registry_auth("127.0.0.1:5555")
    bin_dir = tmp_path / "bin"
    _write_helper(bin_dir, "broken", "echo 'keyring locked'; exit 1\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(
        PullError, match=r"docker-credential-broken failed for 127\.0\.0\.1:5556: .*keyring locked"
    ):
        images.registry_auth("127.0.0.1:5556")


# --- the puller against a fake engine ---------------------------------------------


class _FakeImage:
    def __init__(self, attrs: dict[str, Any]) -> None:
        self.attrs = attrs


class _FakeEngine:
    """Just enough of DockerClient: images.get and api.pull."""

    def __init__(self, pull_seconds: float = 0.0) -> None:
        self.present: dict[str, dict[str, Any]] = {}
        self.pulls: list[tuple[str, str, str | None]] = []
        self.pull_seconds = pull_seconds
        self.fail_with: str | None = None
        self.wrong_digest = False
        self.images = self
        self.api = self
        self._lock = threading.Lock()

    def get(self, name: str) -> _FakeImage:
        with self._lock:
            if name not in self.present:
                raise docker.errors.ImageNotFound(f"No such image: {name}")
            return _FakeImage(self.present[name])

    def pull(self, repository: str, tag: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        assert kwargs["stream"] and kwargs["decode"]
        assert kwargs["auth_config"] == {}  # anonymous: the fake config has no credentials
        with self._lock:
            self.pulls.append((repository, tag, kwargs.get("platform")))
        time.sleep(self.pull_seconds)
        yield {"status": f"Pulling from {repository}"}
        if self.fail_with:
            yield {"errorDetail": {"message": self.fail_with}, "error": self.fail_with}
            return
        digest = "sha256:" + "f" * 64 if self.wrong_digest else tag
        with self._lock:
            self.present[f"{repository}@{tag}"] = {
                "RepoDigests": [f"{repository}@{digest}"],
                "Os": "linux",
                "Architecture": "amd64",
            }
        yield {"status": f"Digest: {tag}"}


@pytest.fixture
def engine(docker_config: Path) -> _FakeEngine:
    return _FakeEngine()


def _puller(engine: _FakeEngine, state: Path) -> ImagePuller:
    return ImagePuller(state, client_factory=lambda: engine)  # type: ignore[arg-type,return-value]


def test_puller_pulls_missing_once_and_trusts_present(engine: _FakeEngine, tmp_path: Path) -> None:
    puller = _puller(engine, tmp_path)
    statuses = puller.ensure_images([REF_A, REF_B, REF_A], "linux/amd64", skip_pull=False)
    assert [(s.ref, s.pulled) for s in statuses] == [(REF_A, True), (REF_B, True)]
    assert engine.pulls == [
        ("127.0.0.1:5555/sciencebench/base", DIGEST_A, "linux/amd64"),
        ("127.0.0.1:5555/sciencebench/other", DIGEST_B, "linux/amd64"),
    ]
    assert puller.ensure([REF_A, REF_B], "linux/amd64", skip_pull=False).keys() == {REF_A, REF_B}
    assert len(engine.pulls) == 2
    assert puller.pulls_performed == 2
    assert images.pull_counts(tmp_path) == {DIGEST_A: 1, DIGEST_B: 1}


def test_puller_threads_share_one_pull(docker_config: Path, tmp_path: Path) -> None:
    engine = _FakeEngine(pull_seconds=0.3)
    puller = _puller(engine, tmp_path)
    results: list[list[images.ImageStatus]] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(puller.ensure_images([REF_A, REF_B], "linux/amd64", False))
        )
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 8
    assert len(engine.pulls) == 2
    pulled = [s for statuses in results for s in statuses if s.pulled]
    assert sorted(s.ref for s in pulled) == sorted([REF_A, REF_B])
    assert images.pull_counts(tmp_path) == {DIGEST_A: 1, DIGEST_B: 1}


def test_puller_reports_stream_errors(engine: _FakeEngine, tmp_path: Path) -> None:
    engine.fail_with = "manifest unknown"
    with pytest.raises(
        PullError, match=r"^pull of .*base:v1@sha256:a+ for linux/amd64 failed: manifest unknown$"
    ):
        _puller(engine, tmp_path).ensure([REF_A], "linux/amd64", skip_pull=False)
    assert images.pull_counts(tmp_path) == {}


def test_puller_verifies_repo_digests_after_pull(engine: _FakeEngine, tmp_path: Path) -> None:
    engine.wrong_digest = True
    with pytest.raises(PullError, match="is not present on this host with its pinned digest"):
        _puller(engine, tmp_path).ensure([REF_A], "linux/amd64", skip_pull=False)


def test_puller_skip_pull(engine: _FakeEngine, tmp_path: Path) -> None:
    puller = _puller(engine, tmp_path)
    with pytest.raises(PullError, match=r"image .*/sciencebench/base:v1@sha256:a+ is not present.*skip_pull"):
        puller.ensure([REF_A], "linux/amd64", skip_pull=True)
    assert engine.pulls == []
    puller.ensure([REF_A], "linux/amd64", skip_pull=False)
    assert puller.ensure([REF_A], "linux/amd64", skip_pull=True).keys() == {REF_A}
    with pytest.raises(PullError, match="present only for linux/amd64, not linux/arm64"):
        puller.ensure([REF_A], "linux/arm64", skip_pull=True)


def test_puller_refuses_unpinned_refs_before_touching_docker(tmp_path: Path) -> None:
    def no_engine() -> Any:
        raise AssertionError("the engine must not be contacted")

    puller = ImagePuller(tmp_path, client_factory=no_engine)
    with pytest.raises(PullError, match="not pinned by digest"):
        puller.ensure([REF_A, "127.0.0.1:5555/sciencebench/base:latest"], "linux/amd64", False)


# --- failures stay one line and typed ------------------------------------------------


def test_unreachable_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    with pytest.raises(PullError, match=r"^Docker Engine at unix://.*/no-such\.sock is unreachable: "):
        ImagePuller(tmp_path).ensure([REF_A], "linux/amd64", skip_pull=False)
    report = cleanup.remove_projects(["task_002__abc1xyz"])
    assert report.containers == [] and len(report.errors) == 1
    assert "is unreachable" in report.errors[0]
    assert cleanup.sweep_leftovers(state=tmp_path).errors


def test_unwritable_state_dir(engine: _FakeEngine, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(
        WorkspaceError, match=f"host state dir {blocker}/locks is unusable .*SCIENCEBENCH_STATE_DIR"
    ):
        _puller(engine, blocker).ensure([REF_A], "linux/amd64", skip_pull=False)
