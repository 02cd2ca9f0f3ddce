"""The option table is defined once: fields, flags, click options and messages agree."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.core.models import JobSpec, RunOptions
from sciencebench.login.options import FLAGS, SubmitOptions, from_cli
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit

# The seed's option table (run-batch.md), in its order, plus --task-id after --path and the job
# budget (--max-cost, --max-tokens) after --max-retries, then fair share's --weight.
SEED_ORDER = [
    "--path", "--task-id", "--agent", "--env", "--env-file", "--model", "--agent-env", "--agent-kwarg",
    "--n-concurrent", "--n-attempts", "--max-retries", "--max-cost", "--max-tokens",
    "--weight", "--agent-timeout-multiplier", "--verifier-timeout-multiplier", "--jobs-dir", "--job-name",
    "--platform",
    "--pier-bin", "--skip-pull",
    "--no-auto-provider", "--no-auto-agent-adapter", "--agent-import-path", "--dry-run",
    # sciencebench's own, after the seed's table
    "--provider-retries", "--placement", "--prepull", "--gateway",
]  # fmt: skip


def test_every_field_has_one_flag_in_the_seeds_order() -> None:
    assert [flag.flag for flag in FLAGS] == SEED_ORDER
    assert sorted(flag.field for flag in FLAGS) == sorted(SubmitOptions.model_fields)


def test_the_job_spec_carries_the_run_options() -> None:
    assert set(RunOptions.model_fields) <= set(JobSpec.model_fields)
    assert set(RunOptions.model_fields) <= set(SubmitOptions.model_fields)


def test_submit_lists_the_table_then_local_and_wait() -> None:
    command = cli.main.commands["submit"]
    flags = [p.opts[0] for p in command.params if isinstance(p, click.Option) and p.opts[0] != "--help"]
    assert flags == [*SEED_ORDER, "--local", "--wait"]


def test_cli_values_become_submit_options(tmp_path: Path) -> None:
    opts = from_cli({
        "path": tmp_path, "models": ("m1", "m2"), "auto_provider": False, "n_attempts": 3,
        "local": True, "wait": False,
    })  # fmt: skip
    assert opts == SubmitOptions(path=tmp_path, models=["m1", "m2"], auto_provider=False, n_attempts=3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n-attempts", "0"], "--n-attempts must be at least 1"),
        (["--n-concurrent", "0"], "--n-concurrent must be at least 1"),
        (["--max-retries", "-1"], "--max-retries must be 0 or more"),
        (["--agent-timeout-multiplier", "0"], "--agent-timeout-multiplier must be greater than 0"),
        (["--verifier-timeout-multiplier", "-2"], "--verifier-timeout-multiplier must be greater than 0"),
        (["--max-cost", "0"], "--max-cost must be greater than 0"),
        (["--max-cost", "nan"], "--max-cost: Input should be a finite number"),
        (["--max-cost", "inf"], "--max-cost: Input should be a finite number"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
    ],
)
def test_a_broken_constraint_names_the_option(tmp_path: Path, args: list[str], message: str) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    result = CliRunner().invoke(cli.main, ["submit", "--path", str(selection), "--dry-run", *args])
    assert result.exit_code == 2
    assert result.stderr == f"sciencebench: error: {message}\n"
    assert not (selection / "batch-run.json").exists()


@pytest.mark.usefixtures("ready_broker")
def test_negated_flags_turn_their_field_off(tmp_path: Path) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    result = CliRunner().invoke(
        cli.main,
        ["submit", "--path", str(selection), "--dry-run", "--skip-pull", "--agent", "codex",
         "--no-auto-agent-adapter", "--model", "m"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    # Pier's built-in Codex agent gets the provider block: the adapter was turned off.
    assert "--agent codex" in result.stdout
    assert "config_toml=<generated provider config>" in result.stdout


def test_the_budget_options_reach_the_job_spec(tmp_path: Path) -> None:
    opts = from_cli({"path": tmp_path, "max_cost_usd": 12.5, "max_tokens": 2_000_000})
    assert (opts.max_cost_usd, opts.max_tokens) == (12.5, 2_000_000)
    assert SubmitOptions(path=tmp_path).max_cost_usd is None  # no budget unless asked
    assert "max_cost_usd" in JobSpec.model_fields and "max_tokens" in JobSpec.model_fields


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--max-cost", "-1"], "--max-cost must be greater than 0"),
     (["--max-tokens", "0"], "--max-tokens must be at least 1")],
)  # fmt: skip
def test_retry_checks_its_budget_as_submit_does(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        cli.main, ["retry", "some-job", "--failed", "--jobs-dir", str(tmp_path), *args]
    )
    assert result.exit_code == 2
    assert result.stderr == f"sciencebench: error: {message}\n"
