"""Registry mirrors: which mirror serves which upstream, the names a worker pulls and runs images by."""

from __future__ import annotations

import asyncio
import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pier.models.agent.install import AgentInstallSpec, InstallStep
from pier.models.task.config import EnvironmentConfig
from pier.models.trial.paths import TrialPaths

from sciencebench import cli
from sciencebench.core.agentimages import AGENT_IMAGE_KEYWORD, BakedImage
from sciencebench.core.errors import PolicyRefused, SettingsError
from sciencebench.core.mirrors import (
    MIRRORS_KEYWORD,
    Mirror,
    mirrors_keyword,
    parse_mirror,
    parse_mirrors,
    parse_mirrors_keyword,
    through_mirror,
    upstream_name,
)
from sciencebench.core.settings import Settings
from sciencebench.network.environment import IsolatedDockerEnvironment
from sciencebench.worker.runtime import DockerRuntime

pytestmark = pytest.mark.unit

D = "sha256:" + "d" * 64
PROXY_IMAGE = "127.0.0.1:5555/sciencebench/squid@sha256:" + "b" * 64
HUB = (Mirror("docker.io", "127.0.0.1:5002"),)


@pytest.mark.parametrize(
    ("text", "mirror"),
    [
        ("127.0.0.1:5002", Mirror("docker.io", "127.0.0.1:5002")),  # Docker Hub's mirror, the common case
        ("http://mirror.internal:5000/", Mirror("docker.io", "mirror.internal:5000")),
        ("https://Mirror.Example", Mirror("docker.io", "mirror.example")),
        ("index.docker.io=localhost:5002", Mirror("docker.io", "localhost:5002")),
        ("reg.example:5000=127.0.0.1:5003", Mirror("reg.example:5000", "127.0.0.1:5003")),
        ("ghcr.io=[::1]:5004", Mirror("ghcr.io", "[::1]:5004")),
    ],
)
def test_a_mirror_serves_one_upstream_docker_hub_unless_named(text: str, mirror: Mirror) -> None:
    assert parse_mirror(text) == mirror


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("mirror", "needs a port or a dotted name"),  # `mirror/library/python` is a Docker Hub repository
        ("docker.io", "is Docker Hub itself"),
        ("http://h.example:5000/v2", "has a path"),
        ("127.0.0.1:99999", "is not a registry host[:port]"),
        ("reg.example:5000=reg.example:5000", "is its own upstream"),
        ("library=127.0.0.1:5002", "upstream registry 'library' needs a port or a dotted name"),
        ("a=b=c.example", "is not a registry"),
        ("", "is not a registry"),
    ],
)
def test_a_bad_mirror_is_refused_naming_it(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"^.*{says.replace('[', '.').replace(']', '.')}"):
        parse_mirror(text)


def test_a_registry_has_one_mirror() -> None:
    assert parse_mirrors(["127.0.0.1:5002, reg.example=127.0.0.1:5003"]) == (
        Mirror("docker.io", "127.0.0.1:5002"),
        Mirror("reg.example", "127.0.0.1:5003"),
    )
    with pytest.raises(ValueError, match=r"registry docker\.io has more than one mirror"):
        parse_mirrors(["127.0.0.1:5002", "docker.io=127.0.0.1:5003"])


@pytest.mark.parametrize(
    ("ref", "local"),
    [
        (f"python@{D}", f"127.0.0.1:5002/library/python@{D}"),
        (f"python:3.12@{D}", f"127.0.0.1:5002/library/python@{D}"),  # the digest names the image
        (f"docker.io/library/python@{D}", f"127.0.0.1:5002/library/python@{D}"),
        (f"index.docker.io/org/image:v1@{D}", f"127.0.0.1:5002/org/image@{D}"),
        (f"reg.example:5000/x/y@{D}", f"127.0.0.1:5003/x/y@{D}"),
        (f"ghcr.io/org/image@{D}", f"ghcr.io/org/image@{D}"),  # no mirror for it: pulled from it
    ],
)
def test_a_ref_is_named_through_its_registrys_mirror_with_the_same_digest(ref: str, local: str) -> None:
    mirrors = parse_mirrors(["127.0.0.1:5002", "reg.example:5000=127.0.0.1:5003"])
    assert through_mirror(ref, mirrors) == local
    assert through_mirror(ref, ()) == ref
    name = local.rpartition("@")[0]
    assert upstream_name(name, mirrors) in (name, "docker.io/library/python", "docker.io/org/image",
                                            "reg.example:5000/x/y")  # fmt: skip
    with pytest.raises(ValueError, match="not a pinned image reference"):
        through_mirror("python:3.12", mirrors)


def test_a_mirrors_name_reads_back_as_its_upstreams() -> None:
    mirrors = parse_mirrors(["127.0.0.1:5002", "reg.example:5000=127.0.0.1:5003"])
    assert upstream_name("127.0.0.1:5002/library/python", mirrors) == "docker.io/library/python"
    assert upstream_name("127.0.0.1:5003/x/y", mirrors) == "reg.example:5000/x/y"
    assert upstream_name("ghcr.io/org/image", mirrors) == "ghcr.io/org/image"


def test_the_keyword_carries_the_mirrors_and_a_bad_one_is_refused() -> None:
    mirrors = parse_mirrors(["127.0.0.1:5002", "reg.example:5000=127.0.0.1:5003"])
    assert parse_mirrors_keyword(mirrors_keyword(mirrors)) == mirrors
    assert parse_mirrors_keyword(json.loads(mirrors_keyword(mirrors))) == mirrors  # as Pier decodes it
    assert parse_mirrors_keyword(None) == ()
    for bad in ("{", "[1]", {"docker.io": 5}, {"docker.io": "mirror"}):
        with pytest.raises(ValueError, match=MIRRORS_KEYWORD + "|needs a port"):
            parse_mirrors_keyword(bad)


# --- the setting, the option ------------------------------------------------------------------


def test_the_setting_lists_mirrors_and_a_bad_one_is_a_settings_error() -> None:
    settings = Settings.from_env(
        {"SCIENCEBENCH_REGISTRY_MIRROR": "127.0.0.1:5002 reg.example=127.0.0.1:5003"}
    )
    assert settings.registry_mirror == ("docker.io=127.0.0.1:5002", "reg.example=127.0.0.1:5003")
    assert settings.mirrors == parse_mirrors(settings.registry_mirror)
    with pytest.raises(SettingsError, match="SCIENCEBENCH_REGISTRY_MIRROR: mirror 'mirror' needs a port"):
        Settings.from_env({"SCIENCEBENCH_REGISTRY_MIRROR": "mirror"})
    assert Settings.from_env({}).mirrors == ()


def _worker(monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[Any, list[Settings]]:
    from sciencebench.worker import main as worker_main

    seen: list[Settings] = []
    monkeypatch.setattr(worker_main, "run_worker", lambda **kw: seen.append(kw["settings"]))
    monkeypatch.setenv("SCIENCEBENCH_PROXY_IMAGE", PROXY_IMAGE)
    monkeypatch.setenv("SCIENCEBENCH_REGISTRY_MIRROR", "127.0.0.1:5009")
    args = ["worker", "--jobs-root", "/srv/jobs", "--selection-root", "/srv/sel", *extra]
    return CliRunner().invoke(cli.main, args), seen


def test_the_worker_option_wins_over_the_setting_and_reaches_the_trials_keywords(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, seen = _worker(monkeypatch)
    assert result.exit_code == 0, result.output
    assert seen[0].mirrors == (Mirror("docker.io", "127.0.0.1:5009"),)  # the environment's
    result, seen = _worker(monkeypatch, "--registry-mirror", "127.0.0.1:5002",
                           "--registry-mirror", "reg.example:5000=127.0.0.1:5003")  # fmt: skip
    assert result.exit_code == 0, result.output
    runtime = DockerRuntime(seen[0])
    keywords = runtime.environment_kwargs()
    assert json.loads(keywords[MIRRORS_KEYWORD]) == {"docker.io": "127.0.0.1:5002",
                                                     "reg.example:5000": "127.0.0.1:5003"}  # fmt: skip
    refs = [f"python@{D}", f"127.0.0.1:5000/sciencebench/baked@{D}"]
    assert runtime.local_refs(refs) == [f"127.0.0.1:5002/library/python@{D}", refs[1]]


def test_without_a_mirror_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = DockerRuntime(Settings.from_env({"SCIENCEBENCH_PROXY_IMAGE": PROXY_IMAGE}))
    assert MIRRORS_KEYWORD not in runtime.environment_kwargs()
    assert runtime.local_refs([f"python@{D}"]) == [f"python@{D}"]


def test_a_bad_mirror_option_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    result, seen = _worker(monkeypatch, "--registry-mirror", "mirror")
    assert result.exit_code == 2, result.output
    assert "--registry-mirror: mirror 'mirror' needs a port" in result.stderr and seen == []
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1


# --- the trial's environment runs the mirror's name -------------------------------------------


def _env(
    tmp_path: Path, image: str | None, compose: str | None = None, **kwargs: Any
) -> IsolatedDockerEnvironment:
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "Dockerfile").write_text(f"FROM {PROXY_IMAGE}\n")
    if compose is not None:
        (env_dir / "docker-compose.yaml").write_text(compose)
    trial_paths = TrialPaths(trial_dir=tmp_path / "trial")
    trial_paths.mkdir()  # type: ignore[no-untyped-call]
    config = EnvironmentConfig(docker_image=image, allow_internet=False)
    return IsolatedDockerEnvironment(
        environment_dir=env_dir, environment_name="task_001", session_id="task_001__mirror",
        trial_paths=trial_paths, task_env_config=config, **kwargs,
    )  # fmt: skip


def test_the_agents_and_the_verifiers_image_run_by_the_mirrors_name(tmp_path: Path) -> None:
    config_image = f"python:3.12@{D}"
    env = _env(tmp_path, config_image, registry_mirrors=mirrors_keyword(HUB))
    assert env.task_env_config.docker_image == f"127.0.0.1:5002/library/python@{D}"
    assert env._env_vars.prebuilt_image_name == f"127.0.0.1:5002/library/python@{D}"  # compose's name
    plain = _env(tmp_path / "plain", config_image)
    assert plain._env_vars.prebuilt_image_name == config_image  # without the keyword, as Pier names it
    other = _env(tmp_path / "other", f"127.0.0.1:5000/x/y@{D}", registry_mirrors=mirrors_keyword(HUB))
    assert other._env_vars.prebuilt_image_name == f"127.0.0.1:5000/x/y@{D}"  # no mirror for its registry


def test_a_baked_agent_image_runs_by_its_mirrors_name(tmp_path: Path) -> None:
    install = AgentInstallSpec(agent_name="codex", version="0.1", steps=[InstallStep(run="true")])
    baked = BakedImage(base_image=f"python@{D}", agent="codex", version="0.1", image=f"org/baked@{D}",
                       inputs_sha256="0" * 64)  # fmt: skip
    env = _env(tmp_path, f"python@{D}", registry_mirrors={"docker.io": "127.0.0.1:5002"},
               agent_install_spec=install, **{AGENT_IMAGE_KEYWORD: baked.keyword()})  # fmt: skip
    assert env._baked_image() == f"127.0.0.1:5002/org/baked@{D}"


def test_a_task_compose_files_image_runs_by_the_mirrors_name(tmp_path: Path) -> None:
    compose = f"services:\n  main:\n    image: docker.io/library/python@{D}\n"
    env = _env(tmp_path, None, compose, registry_mirrors=mirrors_keyword(HUB))
    env._prepare_egress_proxy_compose()
    override = json.loads(env._docker_compose_paths[-1].read_text())
    assert override["services"]["main"]["image"] == f"127.0.0.1:5002/library/python@{D}"
    plain = _env(tmp_path / "plain", None, compose)
    plain._prepare_egress_proxy_compose()
    assert "image" not in json.loads(plain._docker_compose_paths[-1].read_text())["services"]["main"]


def test_a_bad_mirrors_keyword_is_refused_at_start_not_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    env = _env(tmp_path, f"python@{D}", registry_mirrors="{not json")
    assert env._env_vars.prebuilt_image_name == f"python@{D}"
    with pytest.raises(PolicyRefused, match="registry_mirrors: not JSON"):
        asyncio.run(env._start_with_agent(force_build=False))
