"""taskspec.py: task.toml validation, digest-pinned image refs, required files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sciencebench.core.errors import TaskSpecError
from sciencebench.core.images import check_image_ref, image_digest, image_repository
from sciencebench.login.taskspec import DEFAULT_AGENT_TIMEOUT_SEC, load_task
from tests.fixtures.selection import DEFAULT_AGENT_IMAGE, DEFAULT_VERIFIER_IMAGE, REAL_TASKS, make_task

pytestmark = pytest.mark.unit

HEX = "0123456789abcdef" * 4
DIGEST = f"sha256:{HEX}"


def materialize_real(root: Path, task_id: str) -> Path:
    """A real task.toml with the files a materialized task has beside it."""
    source = REAL_TASKS / f"task_{task_id}" / "task.toml"
    task_dir = make_task(root, task_id, toml_text=source.read_text(encoding="utf-8"))
    assert (task_dir / "task.toml").read_bytes() == source.read_bytes()
    return task_dir


# --- the real tasks ----------------------------------------------------------


def test_real_task_002_parses(tmp_path: Path) -> None:
    spec = load_task(materialize_real(tmp_path, "002"), "002")
    assert spec.task_id == "002"
    assert spec.name == "task_002"
    assert spec.agent_image == (
        "docker.io/kevinxulearning/swe-bench-science-environment-python-task-002:v0.1.0"
        "@sha256:f93d17a3abe172e02d356259657395b83a11c27f93b7b71cea37b3165f26016d"
    )
    assert spec.verifier_image == (
        "docker.io/kevinxulearning/swe-bench-science-verifier-python-task-002:v0.1.0"
        "@sha256:8cbc3c732b8b98f2715f99738209013c0caca2fb1ff9c0b7f5e211036b1e80eb"
    )
    assert spec.verifier_mode == "separate"
    assert spec.agent_timeout_sec == 5400.0
    assert spec.verifier_timeout_sec == 1800.0
    assert spec.build_timeout_sec == 600.0
    assert spec.cpus == 2
    assert spec.memory_mb == 8192
    assert spec.allow_internet is False
    assert spec.image_refs == [spec.agent_image, spec.verifier_image]


def test_real_task_101_parses(tmp_path: Path) -> None:
    spec = load_task(materialize_real(tmp_path, "101"), "101")
    assert spec.agent_image.endswith(
        ":v0.1.1@sha256:5a10c1cc642f417aed2e1478484a2177a7e5c98efb3cd57acba8b8d73adf021c"
    )
    assert spec.verifier_image is not None
    assert image_digest(spec.verifier_image) == (
        "sha256:351e46f543c558cf41d5ac880353cee71632002cae6f9fabe07c543b9ae9e63e"
    )
    assert image_repository(spec.verifier_image) == (
        "docker.io/kevinxulearning/swe-bench-science-verifier-python-task-101"
    )
    assert (spec.agent_timeout_sec, spec.verifier_timeout_sec) == (5400.0, 1800.0)


# --- image references ----------------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        f"ubuntu@{DIGEST}",
        f"ubuntu:24.04@{DIGEST}",
        f"docker.io/library/ubuntu:24.04@{DIGEST}",
        f"127.0.0.1:5555/x/y@{DIGEST}",
        f"127.0.0.1:5555/x/y:tag@{DIGEST}",
        f"localhost:5000/sciencebench/fixture-base:v1@{DIGEST}",
        f"ghcr.io/org/some_repo/sub-name:V1.2.3_rc-1@{DIGEST}",
        f"registry.example.edu/a--b/c__d@{DIGEST}",
        f"name:tag@{DIGEST}",
    ],
)
def test_pinned_refs_are_accepted(ref: str) -> None:
    assert check_image_ref(ref) == ref
    assert image_digest(ref) == DIGEST


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("pending", "pending"),
        (f"docker.io/x/pending-image@{DIGEST}", "pending"),
        ("docker.io/x/y:v1", "not pinned by digest"),
        ("ubuntu", "not pinned by digest"),
        (f"docker.io/x/y@sha256:{HEX[:12]}", "not of the form"),
        (f"docker.io/x/y@sha256:{HEX.upper()}", "not of the form"),
        (f"docker.io/x/y@sha256:{HEX}0", "not of the form"),
        (f"docker.io/x/y@sha512:{HEX}{HEX}", "not of the form"),
        (f"docker.io/X/Y@{DIGEST}", "not of the form"),
        (f"docker.io/x/y:@{DIGEST}", "not of the form"),
        (f"docker.io/x/y:tag @{DIGEST}", "not of the form"),
        (f" docker.io/x/y@{DIGEST}", "not of the form"),
        (f"docker.io/x/y@{DIGEST}\n", "not of the form"),
        (f"docker.io//y@{DIGEST}", "not of the form"),
        (f"-x/y@{DIGEST}", "not of the form"),
        (f"x/y@@{DIGEST}", "not of the form"),
    ],
)
def test_unpinned_or_malformed_refs_are_refused(ref: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_image_ref(ref)


def test_image_repository_strips_tag_and_digest() -> None:
    assert image_repository(f"127.0.0.1:5555/x/y:tag@{DIGEST}") == "127.0.0.1:5555/x/y"
    assert image_repository(f"name:tag@{DIGEST}") == "name"
    with pytest.raises(ValueError):
        image_repository("name:tag")


@pytest.mark.parametrize("ref", ["", "pending", "docker.io/x/y:v1", f"docker.io/x/y@sha256:{HEX[:10]}"])
def test_bad_agent_ref_in_task_toml(tmp_path: Path, ref: str) -> None:
    task_dir = make_task(tmp_path, "002", agent_image=ref)
    with pytest.raises(TaskSpecError, match=r"task\.toml: environment\.docker_image: image reference"):
        load_task(task_dir, "002")


@pytest.mark.parametrize("ref", ["", "pending", "docker.io/x/y:v1"])
def test_bad_verifier_ref_in_task_toml(tmp_path: Path, ref: str) -> None:
    task_dir = make_task(tmp_path, "002", verifier_image=ref)
    with pytest.raises(TaskSpecError, match=r"verifier\.environment\.docker_image"):
        load_task(task_dir, "002")


# --- malformed task.toml and missing files ------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[environment\ndocker_image = 'x'\n",
        "schema_version = \n",
        "[environment]\ndocker_image = 'a'\ndocker_image = 'b'\n",
        "a = [[[[\n",
        "a=" + "[" * 5000,  # deep nesting: tomllib raises RecursionError, not TOMLDecodeError
    ],
)
def test_malformed_toml(tmp_path: Path, text: str) -> None:
    task_dir = make_task(tmp_path, "002", toml_text=text)
    with pytest.raises(TaskSpecError, match="malformed TOML"):
        load_task(task_dir, "002")


def test_task_toml_not_utf8(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002")
    (task_dir / "task.toml").write_bytes(b"[environment]\ndocker_image = '\xff\xfe'\n")
    with pytest.raises(TaskSpecError, match="unreadable"):
        load_task(task_dir, "002")


def test_task_toml_missing(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002")
    (task_dir / "task.toml").unlink()
    with pytest.raises(TaskSpecError, match=r"task\.toml: missing"):
        load_task(task_dir, "002")


def test_environment_section_required(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002", toml_text='schema_version = "1.3"\n[agent]\ntimeout_sec = 10.0\n')
    with pytest.raises(TaskSpecError, match=r"task\.toml: environment: Field required"):
        load_task(task_dir, "002")


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ("[agent]\ntimeout_sec = -5.0", "agent.timeout_sec"),
        ("[agent]\ntimeout_sec = 'soon'", "agent.timeout_sec"),
        ("[verifier]\ntimeout_sec = 0", "verifier.timeout_sec"),
        ("[verifier]\nenvironment_mode = 'remote'", "verifier.environment_mode"),
    ],
)
def test_invalid_values_name_the_field(tmp_path: Path, extra: str, where: str) -> None:
    text = f'[environment]\ndocker_image = "{DEFAULT_AGENT_IMAGE}"\nallow_internet = false\n{extra}\n'
    task_dir = make_task(tmp_path, "002", toml_text=text)
    with pytest.raises(TaskSpecError, match=rf"task\.toml: {where}:"):
        load_task(task_dir, "002")


def test_missing_pre_artifacts(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002", with_pre_artifacts=False)
    with pytest.raises(TaskSpecError, match=r"task 002 .*missing pre_artifacts\.sh \(rerun materialize\.py"):
        load_task(task_dir, "002")


def test_missing_instruction(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002", with_instruction=False)
    with pytest.raises(TaskSpecError, match=r"missing instruction\.md"):
        load_task(task_dir, "002")


def test_missing_environment(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002", with_environment=False)
    with pytest.raises(TaskSpecError, match=r"missing environment/Dockerfile"):
        load_task(task_dir, "002")


def test_environment_without_dockerfile(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002")
    (task_dir / "environment" / "Dockerfile").unlink()
    with pytest.raises(TaskSpecError, match=r"missing environment/Dockerfile"):
        load_task(task_dir, "002")


def test_environment_with_compose_file_instead_of_dockerfile(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002")
    (task_dir / "environment" / "Dockerfile").unlink()
    (task_dir / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    assert load_task(task_dir, "002").agent_image == DEFAULT_AGENT_IMAGE


def test_missing_tests(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002", with_tests=False)
    with pytest.raises(TaskSpecError, match=r"missing tests/test\.sh"):
        load_task(task_dir, "002")


def test_tests_dir_without_test_sh(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002")
    shutil.rmtree(task_dir / "tests")
    (task_dir / "tests").mkdir()
    with pytest.raises(TaskSpecError, match=r"missing tests/test\.sh"):
        load_task(task_dir, "002")


# --- policy and modes -------------------------------------------------------------


def test_allow_internet_true_is_refused(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002", allow_internet=True)
    with pytest.raises(TaskSpecError, match="allow_internet = true is refused"):
        load_task(task_dir, "002")


def test_allow_internet_true_on_the_verifier_is_refused(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002", verifier_image=DEFAULT_VERIFIER_IMAGE, verifier_allow_internet=True)
    with pytest.raises(TaskSpecError, match="allow_internet = true is refused"):
        load_task(task_dir, "002")


def test_allow_internet_absent_means_pier_default_true_and_is_refused(tmp_path: Path) -> None:
    text = f'[environment]\ndocker_image = "{DEFAULT_AGENT_IMAGE}"\n'
    task_dir = make_task(tmp_path, "002", toml_text=text)
    with pytest.raises(TaskSpecError, match="allow_internet"):
        load_task(task_dir, "002")


def test_shared_verifier_mode_by_default(tmp_path: Path) -> None:
    spec = load_task(make_task(tmp_path, "002"), "002")
    assert spec.verifier_mode == "shared"
    assert spec.verifier_image is None
    assert spec.image_refs == [DEFAULT_AGENT_IMAGE]


def test_explicit_shared_verifier_mode(tmp_path: Path) -> None:
    spec = load_task(make_task(tmp_path, "002", environment_mode="shared"), "002")
    assert spec.verifier_mode == "shared"


def test_separate_verifier_mode_implied_by_verifier_image(tmp_path: Path) -> None:
    text = (
        f'[environment]\ndocker_image = "{DEFAULT_AGENT_IMAGE}"\nallow_internet = false\n'
        f'[verifier.environment]\ndocker_image = "{DEFAULT_VERIFIER_IMAGE}"\nallow_internet = false\n'
    )
    spec = load_task(make_task(tmp_path, "002", toml_text=text), "002")
    assert spec.verifier_mode == "separate"
    assert spec.verifier_image == DEFAULT_VERIFIER_IMAGE
    assert spec.image_refs == [DEFAULT_AGENT_IMAGE, DEFAULT_VERIFIER_IMAGE]


def test_shared_mode_with_a_verifier_image_is_a_conflict(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "002", verifier_image=DEFAULT_VERIFIER_IMAGE, environment_mode="shared")
    with pytest.raises(TaskSpecError, match="'shared' conflicts"):
        load_task(task_dir, "002")


def test_timeouts_are_kept(tmp_path: Path) -> None:
    task_dir = make_task(
        tmp_path, "002", agent_timeout_sec=1234.5, verifier_timeout_sec=321.0, build_timeout_sec=99.0
    )
    spec = load_task(task_dir, "002")
    assert (spec.agent_timeout_sec, spec.verifier_timeout_sec, spec.build_timeout_sec) == (
        1234.5,
        321.0,
        99.0,
    )


def test_timeouts_default_to_pier_defaults(tmp_path: Path) -> None:
    spec = load_task(make_task(tmp_path, "002", agent_timeout_sec=None), "002")
    assert spec.agent_timeout_sec == DEFAULT_AGENT_TIMEOUT_SEC == 3600.0
    assert spec.verifier_timeout_sec == 600.0
    assert spec.build_timeout_sec == 600.0


def test_unknown_keys_are_ignored(tmp_path: Path) -> None:
    extra = '[future]\nthing = 1\n[agent.extra]\nx = "y"'
    spec = load_task(make_task(tmp_path, "002", extra_toml=extra), "002")
    assert spec.agent_image == DEFAULT_AGENT_IMAGE


def test_directory_is_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_task(tmp_path, "002")
    monkeypatch.chdir(tmp_path)
    spec = load_task(Path("task_002"), "002")
    assert spec.directory == (tmp_path / "task_002").resolve()
