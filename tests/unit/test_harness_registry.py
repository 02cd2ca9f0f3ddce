"""The harness registry is the one place a harness is added: a test-local entry reaches every consumer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sciencebench.bake.recipes import RecipeError, bake_spec, render
from sciencebench.bake.recipes import main as recipes_main
from sciencebench.core import harnesses
from sciencebench.core.errors import InputError, ProfileError
from sciencebench.core.gateways import Gateway, parse_gateway
from sciencebench.core.harnesses import Bake, Harness, ProviderProfile
from sciencebench.core.models import AgentPlan, Provider
from sciencebench.core.pier_argv import agent_configs
from sciencebench.login.agentimages import resolve_agent_images
from sciencebench.login.profiles import plan_agent
from sciencebench.login.selection import load_selection
from tests.fixtures.selection import DEFAULT_AGENT_IMAGE, make_selection

pytestmark = pytest.mark.unit

ADAPTER = "tests.toy:ToyAgent"


def _translate(
    env_values: dict[str, str], kwargs: dict[str, str], builtin: bool
) -> tuple[Provider, Gateway, dict[str, str]]:
    url = env_values.get("TOY_URL") or "https://toy.example.test/v1"
    provider = Provider(protocol="toy", base_url=url, credential_env="TOY_KEY")
    return provider, parse_gateway(url, "TOY_URL"), {"endpoint": url, "builtin": str(builtin), **kwargs}


TOY = Harness(
    "toy",
    adapter=ADAPTER,
    auto_adapter=True,
    gateway_variables=("TOY_URL",),
    profile=ProviderProfile(_translate, "TOY_KEY", "toy-large"),
    exact_model=True,
    bake=Bake("1.2.3", "npm:toy@1.2.3", ("toy", "toyd")),
)

# Registers the toy harness for a child process, then runs the command line.
CHILD = """
import sys
from sciencebench.core import harnesses
toy = harnesses.Harness("toy", bake=harnesses.Bake("1", "x", ("toy",)))
harnesses.REGISTRY = {**harnesses.REGISTRY, "toy": toy}
from sciencebench.cli import main
main(sys.argv[1:], prog_name="sciencebench")
"""


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Harness:
    """The registry with one more harness, for this test only."""
    monkeypatch.setattr(harnesses, "REGISTRY", {**harnesses.REGISTRY, TOY.name: TOY})
    return TOY


def _plan(**kw: object) -> AgentPlan:
    args: dict[str, object] = {
        "agent": "toy", "env_values": {"TOY_KEY": "k", "TOY_URL": "http://gw.toy.test:4000/v1"}, "models": [],
        "agent_kwargs": {}, "agent_env": {}, "agent_import_path": None, "auto_provider": True,
        "auto_agent_adapter": True, "dry_run": False,
    } | kw  # fmt: skip
    return plan_agent(**args)  # type: ignore[arg-type]


def test_the_cli_offers_a_registered_harness_to_bake() -> None:
    child = [sys.executable, "-c", CHILD]
    shown = subprocess.run([*child, "images", "bake", "--help"], capture_output=True, text=True, check=True)
    assert "[codex|claude-code|mini-swe-agent|toy]" in shown.stdout
    from sciencebench.cli.hosts import bake

    [agent] = [param for param in bake.params if param.name == "agent"]
    assert list(getattr(agent.type, "choices", [])) == ["codex", "claude-code", "mini-swe-agent"]


def test_its_profile_translation_adapter_and_model_default_apply(toy: Harness) -> None:
    plan = _plan()
    assert plan.agent_import_path == ADAPTER and plan.agent is None
    assert plan.models == ["toy-large"]
    assert plan.agent_kwargs["endpoint"] == "http://gw.toy.test:4000/v1"
    assert plan.provider.credential_env == "TOY_KEY"
    with pytest.raises(ProfileError, match="TOY_KEY: required for --agent toy"):
        _plan(env_values={"TOY_URL": "http://gw.toy.test:4000/v1"})
    builtin = _plan(auto_agent_adapter=False)
    assert builtin.agent == "toy" and builtin.agent_kwargs["builtin"] == "True"


def test_its_allowlist_rule_names_the_gateway(toy: Harness) -> None:
    plan = _plan(auto_provider=False)
    assert [g.authority for g in plan.gateways] == ["gw.toy.test:4000"]
    assert plan.provider is None
    unregistered = _plan(agent="not-registered", auto_provider=False)
    assert unregistered.gateways == []


def test_pier_gets_its_model_exactly(toy: Harness) -> None:
    plan = _plan(models=["route/toy-large"])
    [config] = agent_configs(plan, models=["route/toy-large"])
    assert config["kwargs"]["command_model_name"] == "route/toy-large"


def test_its_bake_recipe_is_rendered(toy: Harness, tmp_path: Path) -> None:
    (tmp_path / "toy" / "1.2.3").mkdir(parents=True)
    (tmp_path / "toy" / "1.2.3" / "MANIFEST").write_text("source npm:toy@1.2.3\n")
    recipe = render("toy", "1.2.3", DEFAULT_AGENT_IMAGE, tmp_path)
    assert "/mnt/sciencebench-artifacts/agent/toyd /usr/local/bin/" in recipe.script
    assert recipe.script.splitlines()[-1] == "toy --version"
    assert bake_spec("toy", "1.2.3") is toy.bake
    with pytest.raises(RecipeError, match="only codex, claude-code, mini-swe-agent, toy can be baked"):
        render("oracle", "1", DEFAULT_AGENT_IMAGE, tmp_path)


def test_its_pin_is_what_the_fetch_script_reads(toy: Harness, capsys: pytest.CaptureFixture[str]) -> None:
    assert recipes_main(["pin", "toy"]) == 0
    assert capsys.readouterr().out == "1.2.3\n"


def test_a_missing_baked_image_is_found_at_submit(toy: Harness, tmp_path: Path) -> None:
    selection = load_selection(make_selection(tmp_path / "sel", ["001"]))
    resolved = resolve_agent_images(selection, _plan())
    assert resolved.missing == ["001"]
    assert "--agent toy" in resolved.hint


def test_the_bake_command_accepts_it(toy: Harness, tmp_path: Path) -> None:
    from sciencebench.bake.command import bake_selection

    root = make_selection(tmp_path / "sel", ["001"])
    # Past the agent check: the registry is the next one refused (no engine is asked).
    with pytest.raises(InputError, match="--registry"):
        bake_selection(root, "toy", registry="", artifacts=tmp_path)
    with pytest.raises(InputError, match="only codex, claude-code, mini-swe-agent, toy can be baked"):
        bake_selection(root, "oracle", registry="", artifacts=tmp_path)
