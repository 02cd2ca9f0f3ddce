"""The seed's option table, defined once.

`SubmitOptions` (a pydantic model extending `core.models.RunOptions`, the
part every trial runs with and `JobSpec` carries) holds each option's name,
type, default and constraints; `FLAGS` adds its command-line spelling and
help, in the order `--help` lists them. The CLI's options are generated from
both (`click_options`), and what click parsed becomes a `SubmitOptions`
again (`from_cli`), so an option is added in exactly two places: a field and
a `Flag`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from pydantic import Field, ValidationError

from sciencebench.core.errors import InputError
from sciencebench.core.models import RunOptions
from sciencebench.core.paths import DEFAULT_JOBS_DIR


class SubmitOptions(RunOptions):
    """The seed's option table as the login node reads it (plus `--task-id`)."""

    path: Path
    task_id: str | None = None
    agent: str = "nop"
    env_file: Path | None = None
    models: list[str] = Field(default_factory=list)
    agent_env: list[str] = Field(default_factory=list)
    agent_kwargs: list[str] = Field(default_factory=list)
    jobs_dir: Path = DEFAULT_JOBS_DIR
    job_name: str | None = None
    auto_provider: bool = True
    auto_agent_adapter: bool = True
    agent_import_path: str | None = None
    dry_run: bool = False
    prepull: bool = False
    # `--local` only: gateways this host may reach besides SCIENCEBENCH_GATEWAYS (its user is the operator).
    gateways: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Flag:
    """How one `SubmitOptions` field is spelled on the command line.

    `negated`: the flag is `--no-...` and sets a field that defaults to True to False.
    """

    field: str
    flag: str
    help: str
    metavar: str | None = None
    negated: bool = False


FLAGS: tuple[Flag, ...] = (
    Flag("path", "--path", "Materialized selection directory (task_NNN/ directories)."),
    Flag("task_id", "--task-id", "Narrow the selection, e.g. 002,005-007 (inclusive ranges)."),
    Flag("agent", "--agent", "Pier harness: codex, claude-code, mini-swe-agent, oracle, nop, ..."),
    Flag("env", "--env", "Docker backend with the offline network policy."),
    Flag("env_file", "--env-file", "Provider/harness env file (KEY=value); values never leave this file."),
    Flag("models", "--model", "Model route; repeatable."),
    Flag("agent_env", "--agent-env", "Extra harness environment value; repeatable; always redacted.",
         metavar="KEY=VALUE"),
    Flag("agent_kwargs", "--agent-kwarg", "Extra Pier agent keyword; repeatable.", metavar="KEY=VALUE"),
    Flag("n_concurrent", "--n-concurrent", "Cluster-wide cap on simultaneously running trials of this job."),
    Flag("n_attempts", "--n-attempts", "Attempts per task."),
    Flag("max_retries", "--max-retries", "Tries again of a trial whose failure Pier would retry."),
    Flag("max_cost_usd", "--max-cost", "Job budget in USD, cluster-wide, from Pier's cost of each finished "
         "trial: once reached, no further trial starts (running ones finish).", metavar="USD"),
    Flag("max_tokens", "--max-tokens", "Job budget in tokens (input + output), as --max-cost.", metavar="N"),
    Flag("weight", "--weight", "This job's weight beside the submitting user's other jobs under fair share "
         "(`sciencebench share` changes it later).", metavar="W"),
    Flag("agent_timeout_multiplier", "--agent-timeout-multiplier", "Multiplier for the agent stage timeout."),
    Flag("verifier_timeout_multiplier", "--verifier-timeout-multiplier",
         "Multiplier for the verifier and build timeouts."),
    Flag("jobs_dir", "--jobs-dir", "Directory for jobs (shared with the workers)."),
    Flag("job_name", "--job-name", "Stable job name used in result paths (default: agent-timestamp)."),
    Flag("platform", "--platform", "Docker pull and Pier image platform."),
    Flag("pier_bin", "--pier-bin", "Pier executable for --local (workers run their own)."),
    Flag("skip_pull", "--skip-pull", "Trust local images; fail when one is missing."),
    Flag("auto_provider", "--no-auto-provider",
         "Do not translate CODEX_* profile values into Codex arguments.", negated=True),
    Flag("auto_agent_adapter", "--no-auto-agent-adapter",
         "Use Pier's built-in Codex agent instead of the sciencebench adapter.", negated=True),
    Flag("agent_import_path", "--agent-import-path", "Explicit Pier agent import path (module:Class)."),
    Flag("dry_run", "--dry-run", "Validate, render and record, without running Pier."),
    # sciencebench's own, after the seed's table
    Flag("provider_retries", "--provider-retries",
         "Reruns, after a back-off, of a trial that failed on its model provider (429, 5xx, reset)."),
    Flag("placement", "--placement", "Place each trial on a host that holds its images (or pulls them), "
         "waiting a bounded time for a busy one; without it any free host takes any trial."),
    Flag("prepull", "--prepull", "Before the trials, pull the selection's images onto the live hosts: with "
         "--placement each image onto one host (balanced by size), without it onto every host."),
    Flag("gateways", "--gateway", "For --local: allow this host's trials to reach this gateway (scheme, host "
         "and port), e.g. one on an internal address; repeatable (workers: `worker --gateway`).",
         metavar="URL"),
)  # fmt: skip

_BY_FIELD = {flag.field: flag for flag in FLAGS}


def _base_type(annotation: Any) -> Any:
    """`int` of `int | None`, `str` of `list[str]`: the type click converts one value to."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (annotation,) = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) is list:
        (annotation,) = typing.get_args(annotation)
    return annotation


def _click_option(flag: Flag) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    field = SubmitOptions.model_fields[flag.field]
    annotation = field.annotation
    if flag.negated:
        return click.option(flag.flag, flag.field, flag_value=False, default=True, help=flag.help)
    if annotation is bool:
        return click.option(flag.flag, flag.field, is_flag=True, help=flag.help)
    base = _base_type(annotation)
    multiple = typing.get_origin(annotation) is list
    default = None if field.is_required() or multiple else field.get_default()
    # Click tells an explicit default of None from none at all: pass one only when there is one.
    extra: dict[str, Any] = {} if default is None else {"default": default, "show_default": True}
    return click.option(
        flag.flag,
        flag.field,
        type=click.Path(path_type=Path) if base is Path else base,
        multiple=multiple,
        required=field.is_required(),
        metavar=flag.metavar,
        help=flag.help,
        **extra,
    )


def click_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command with every option of the table, in `FLAGS` order."""
    for flag in reversed(FLAGS):
        fn = _click_option(flag)(fn)
    return fn


def from_cli(values: Mapping[str, Any]) -> SubmitOptions:
    """The `SubmitOptions` of what click parsed (other keys are ignored).

    Raises InputError naming the option when a value breaks a constraint.
    """
    fields = {name: values[name] for name in _BY_FIELD if name in values}
    try:
        return SubmitOptions.model_validate(fields)
    except ValidationError as exc:
        raise InputError(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """One line for the first error of a `SubmitOptions` validation, naming the option."""
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else ""
    flag = _BY_FIELD[name].flag if name in _BY_FIELD else name
    context = error.get("ctx") or {}
    if error["type"] == "greater_than_equal":
        bound = context.get("ge")
        return f"{flag} must be {'0 or more' if bound == 0 else f'at least {bound:g}'}"
    if error["type"] == "greater_than":
        return f"{flag} must be greater than {context.get('gt'):g}"
    return f"{flag}: {str(error['msg']).removeprefix('Value error, ')}"


def budget_limits(max_cost_usd: float | None, max_tokens: int | None) -> tuple[float | None, int | None]:
    """--max-cost and --max-tokens checked as submit checks them (for `retry`). Raises InputError."""
    try:
        limits = RunOptions.model_validate({"max_cost_usd": max_cost_usd, "max_tokens": max_tokens})
    except ValidationError as exc:
        raise InputError(describe(exc)) from None
    return limits.max_cost_usd, limits.max_tokens
