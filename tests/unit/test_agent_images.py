"""Baked agent images without Docker: the record, the submit-time checks, the argv, the recipes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sciencebench.bake.recipes import RecipeError, image_tag, render
from sciencebench.core.agentimages import (
    AgentImages,
    BakedImage,
    load_agent_images,
    parse_agent_image_keyword,
)
from sciencebench.core.errors import ProfileError
from sciencebench.core.harnesses import bake_of
from sciencebench.core.paths import SelectionPaths
from sciencebench.core.pier_argv import render_argv
from sciencebench.login.options import SubmitOptions
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import Prepared
from sciencebench.network.execenv import exec_env_args
from tests.fixtures.hosts import BAKED_ONLY, READY, prepare
from tests.fixtures.selection import DEFAULT_AGENT_IMAGE, DEFAULT_VERIFIER_IMAGE, make_selection

pytestmark = pytest.mark.unit

KEY = "sk-unit-canary-7f3a"
BAKED_CODEX = "127.0.0.1:5555/sciencebench-agents/codex:0.169.0-a1a1@sha256:" + "c3" * 32
BAKED_OTHER = "127.0.0.1:5555/sciencebench-agents/codex:0.170.0-a1a1@sha256:" + "d4" * 32


def baked(agent: str = "codex", version: str = "0.169.0", image: str = BAKED_CODEX, **kw: Any) -> BakedImage:
    fields: dict[str, Any] = {"wire_apis": ["responses"] if agent == "codex" else None} | kw
    return BakedImage(
        base_image=DEFAULT_AGENT_IMAGE,
        agent=agent,
        version=version,
        image=image,
        inputs_sha256="e5" * 32,
        **fields,
    )


def selection(tmp_path: Path, *images: BakedImage) -> Path:
    root = make_selection(tmp_path / "sel", ["002", "005"], verifier_image={"005": DEFAULT_VERIFIER_IMAGE})
    if images:
        path = SelectionPaths(root).agent_images
        path.parent.mkdir(parents=True)
        path.write_text(AgentImages(images=list(images)).model_dump_json())
    return root


def submit(root: Path, tmp_path: Path, env_text: str, **kw: Any) -> Prepared:
    env_file = tmp_path / "provider.env"
    env_file.write_text(env_text)
    kw.setdefault("agent", "codex")
    # Hosts that run baked images only: a task without one is refused.
    return prepare(
        SubmitOptions(path=root, env_file=env_file, jobs_dir=tmp_path / "jobs", job_name="j", **kw),
        cluster=BAKED_ONLY,
    )


# --- the record --------------------------------------------------------------------


def test_a_missing_record_is_empty_and_a_broken_one_names_its_file(tmp_path: Path) -> None:
    assert load_agent_images(tmp_path / "none.json").images == []
    broken = tmp_path / "agent-images.json"
    broken.write_text('{"images": [{"agent": "codex"}]}')
    with pytest.raises(ValueError, match=r"agent-images\.json: not a valid agent image record"):
        load_agent_images(broken)


def test_find_matches_the_base_image_by_digest_and_replace_keeps_one_entry_in_place() -> None:
    first, other = baked(), baked(version="0.170.0", image=BAKED_OTHER)
    record = AgentImages(images=[first, other])
    retagged = DEFAULT_AGENT_IMAGE.replace(":v1@", ":v2@")  # another tag, the same bytes
    assert record.find(retagged, "codex") == [first, other]
    assert record.find(retagged, "codex", "0.170.0") == [other]
    assert record.find(DEFAULT_AGENT_IMAGE, "claude-code") == []
    rebuilt = baked(image=BAKED_CODEX.replace("c3" * 32, "f6" * 32))
    assert record.replace(rebuilt).images == [rebuilt, other]
    assert record.replace(baked(agent="claude-code", image=BAKED_OTHER)).images[-1].agent == "claude-code"


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        "[1]",
        '{"agent": "codex", "version": "1"}',
        {"agent": "codex", "version": "1", "image": "x:1"},
    ],
)
def test_the_agent_image_keyword_is_refused_unless_complete_and_pinned(value: object) -> None:
    with pytest.raises(ValueError):
        parse_agent_image_keyword(value)


def test_the_agent_image_keyword_round_trips() -> None:
    image = baked()
    assert parse_agent_image_keyword(json.loads(image.keyword())) == ("codex", "0.169.0", BAKED_CODEX)
    assert parse_agent_image_keyword(image.keyword()) == ("codex", "0.169.0", BAKED_CODEX)
    assert parse_agent_image_keyword(None) is None


# --- submit ------------------------------------------------------------------------


def test_codex_runs_its_baked_image_and_the_record_names_it(tmp_path: Path) -> None:
    root = selection(tmp_path, baked())
    prepared = submit(root, tmp_path, f"OPENAI_API_KEY={KEY}\nCODEX_VERSION=latest\n")
    job = prepared.job
    assert set(job.agent_images) == {"002", "005"}
    assert job.agent.agent_kwargs["version"] == "0.169.0"  # `latest` means the one baked
    for trial in prepared.trials:
        assert trial.image_refs[0] == BAKED_CODEX and DEFAULT_AGENT_IMAGE not in trial.image_refs
    trial_005 = next(t for t in prepared.trials if t.task_id == "005")
    assert DEFAULT_VERIFIER_IMAGE in trial_005.image_refs  # the verifier image is still pulled
    argv = render_argv(job, prepared.trials[0], tmp_path / "scratch", "p")
    keyword = next(a for a in argv if a.startswith("agent_image="))
    assert json.loads(keyword.partition("=")[2]) == {
        "agent": "codex",
        "version": "0.169.0",
        "image": BAKED_CODEX,
    }
    assert "version=0.169.0" in argv
    record = build_run_record(job, prepared.trials[0], "redis://localhost:6379/0", prepared.secret_values)
    assert record.agent_images["002"].model_dump() == {
        "base_image": DEFAULT_AGENT_IMAGE, "agent": "codex", "version": "0.169.0", "image": BAKED_CODEX,
    }  # fmt: skip
    assert KEY not in record.text()


def test_a_missing_baked_image_is_one_line_naming_the_command(tmp_path: Path) -> None:
    root = selection(tmp_path)
    with pytest.raises(ProfileError) as caught:
        submit(root, tmp_path, f"OPENAI_API_KEY={KEY}\n")
    message = str(caught.value)
    assert "\n" not in message and KEY not in message
    assert "no baked codex image for task(s) 002, 005" in message
    assert f"sciencebench images bake --path {root} --agent codex" in message
    # Where to push: a task image's registry (docker.io for the benchmark) is not the user's to push to.
    assert "--registry HOST[:PORT]`)" in message
    # Both ways out: bake, or a host that installs agents online.
    assert "no live worker host installs agents online" in message
    assert "sciencebench worker --agent-install online" in message


def test_bake_requires_a_registry_to_push_to(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from sciencebench import cli

    root = selection(tmp_path)
    result = CliRunner().invoke(cli.main, ["images", "bake", "--path", str(root), "--agent", "codex"])
    assert result.exit_code == 2
    assert "Missing option '--registry'" in result.output


def test_a_version_nobody_baked_is_refused_naming_it(tmp_path: Path) -> None:
    root = selection(tmp_path, baked())
    with pytest.raises(ProfileError, match=r"no baked codex 0\.99\.0 image .* --agent-version 0\.99\.0"):
        submit(root, tmp_path, f"OPENAI_API_KEY={KEY}\nCODEX_VERSION=0.99.0\n")


def test_two_baked_versions_need_a_choice(tmp_path: Path) -> None:
    root = selection(tmp_path, baked(), baked(version="0.170.0", image=BAKED_OTHER))
    with pytest.raises(ProfileError, match=r"several versions .*CODEX_VERSION"):
        submit(root, tmp_path, f"OPENAI_API_KEY={KEY}\n")
    chosen = submit(root, tmp_path, f"OPENAI_API_KEY={KEY}\nCODEX_VERSION=0.170.0\n")
    assert {b.image for b in chosen.job.agent_images.values()} == {BAKED_OTHER}


def test_chat_is_refused_when_the_baked_codex_refuses_it(tmp_path: Path) -> None:
    root = selection(tmp_path, baked())
    with pytest.raises(ProfileError) as caught:
        submit(root, tmp_path, f"OPENAI_API_KEY={KEY}\nCODEX_WIRE_API=chat\n")
    assert "CODEX_WIRE_API=chat: the baked Codex 0.169.0 accepts only wire_api=responses" in str(caught.value)
    # A baked build that accepts chat (an older release, as probed at bake time) lets it through.
    root_old = selection(tmp_path / "old", baked(wire_apis=["responses", "chat"]))
    assert submit(root_old, tmp_path, f"OPENAI_API_KEY={KEY}\nCODEX_WIRE_API=chat\n").job.agent_images


def test_no_baked_image_is_needed_for_nop_oracle_or_where_a_host_installs_online(tmp_path: Path) -> None:
    root = selection(tmp_path)
    for agent in ("nop", "oracle"):
        assert submit(root, tmp_path, "", agent=agent).job.agent_images == {}
    (tmp_path / "provider.env").write_text(f"OPENAI_API_KEY={KEY}\n")
    online = prepare(SubmitOptions(path=root, env_file=tmp_path / "provider.env", agent="codex",
                                   jobs_dir=tmp_path / "jobs", job_name="j"), cluster=READY)  # fmt: skip
    assert online.job.agent_images == {}  # Pier installs codex in its build, as the original's does


def test_a_dry_run_is_refused_as_the_real_submit_is(tmp_path: Path) -> None:
    root = selection(tmp_path)
    with pytest.raises(ProfileError, match=r"no baked codex image for task.* installs agents online"):
        submit(root, tmp_path, f"OPENAI_API_KEY={KEY}\n", dry_run=True)


def test_claude_code_and_the_mini_swe_agent_adapter_use_their_own_images(tmp_path: Path) -> None:
    claude = baked(agent="claude-code", version="2.1.332", image=BAKED_OTHER)
    root = selection(tmp_path, baked(), claude)
    prepared = submit(root, tmp_path, f"ANTHROPIC_AUTH_TOKEN={KEY}\n", agent="claude-code")
    assert {b.image for b in prepared.job.agent_images.values()} == {BAKED_OTHER}
    adapter = "sciencebench.agents.mini_swe_agent:ScienceBenchMiniSweAgent"
    with pytest.raises(ProfileError, match="no baked mini-swe-agent image"):
        submit(root, tmp_path, f"OPENAI_API_KEY={KEY}\n", agent="mini-swe-agent", agent_import_path=adapter)
    # Someone else's agent class: sciencebench cannot know what it installs, so nothing is required.
    other = submit(
        root, tmp_path, f"OPENAI_API_KEY={KEY}\n", agent="mini-swe-agent", agent_import_path="x.y:Z"
    )
    assert other.job.agent_images == {}


# --- recipes and the exec environment ----------------------------------------------


def artifacts(tmp_path: Path) -> Path:
    root = tmp_path / "artifacts"
    for agent in ("codex", "claude-code"):
        directory = root / agent / bake_of(agent).version
        directory.mkdir(parents=True)
        (directory / "MANIFEST").write_text(f"source {bake_of(agent).source}\nabc  {agent}\n")
    wheels = root / "mini-swe-agent" / bake_of("mini-swe-agent").version / "py3.11"
    wheels.mkdir(parents=True)
    (wheels / "MANIFEST").write_text("source pypi\n")
    return root


def test_recipes_install_from_mounted_artifacts_and_key_on_every_input(tmp_path: Path) -> None:
    root = artifacts(tmp_path)
    codex = render("codex", "0.169.0", DEFAULT_AGENT_IMAGE, root)
    assert "/mnt/sciencebench-artifacts/agent/codex" in codex.script and "codex --version" in codex.script
    assert codex.mounts == {"agent": root / "codex" / "0.169.0"}
    assert codex.labels["dev.sciencebench.agent-image.inputs"] == codex.inputs_sha256
    again = render("codex", "0.169.0", DEFAULT_AGENT_IMAGE, root)
    assert again.inputs_sha256 == codex.inputs_sha256
    (root / "codex" / "0.169.0" / "MANIFEST").write_text("source npm\nother  codex\n")
    assert render("codex", "0.169.0", DEFAULT_AGENT_IMAGE, root).inputs_sha256 != codex.inputs_sha256
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with_ca = render("claude-code", "2.1.332", DEFAULT_AGENT_IMAGE, root, extra_ca=ca)
    assert with_ca.env["NODE_EXTRA_CA_CERTS"].endswith("sciencebench-extra-ca.crt")
    assert "update-ca-certificates" in with_ca.script
    mswea = render("mini-swe-agent", "2.4.6", DEFAULT_AGENT_IMAGE, root, python="3.11")
    assert "--no-index" in mswea.script and "mini-swe-agent==2.4.6" in mswea.script
    assert mswea.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    tag = image_tag("codex", "0.169.0", DEFAULT_AGENT_IMAGE, codex.inputs_sha256)
    assert tag == f"0.169.0-{'a1' * 6}-{codex.inputs_sha256[:12]}"


@pytest.mark.parametrize(
    ("agent", "version", "kw", "message"),
    [
        ("aider", "1.0", {}, "only codex, claude-code, mini-swe-agent can be baked"),
        ("codex", "9.9.9", {}, "scripts/agent-artifacts.sh --agent codex --version 9.9.9"),
        ("codex", "0.169.0; rm -rf /", {}, "not a version"),
        ("mini-swe-agent", "2.4.6", {}, "needs python3"),
        ("mini-swe-agent", "2.4.6", {"python": "3.12"}, "--python 3.12"),
    ],
)
def test_recipes_refuse_what_they_cannot_bake(
    tmp_path: Path, agent: str, version: str, kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(RecipeError) as caught:
        render(agent, version, DEFAULT_AGENT_IMAGE, artifacts(tmp_path), **kw)
    assert message in str(caught.value)


def test_exec_passes_inherited_values_by_name_only() -> None:
    args = exec_env_args({"OPENAI_API_KEY": KEY, "CODEX_HOME": "/tmp/c", "SHADOWED": "new"},
                         {"OPENAI_API_KEY": KEY, "SHADOWED": "old"})  # fmt: skip
    assert args == ["-e", "OPENAI_API_KEY", "-e", "CODEX_HOME=/tmp/c", "-e", "SHADOWED=new"]
