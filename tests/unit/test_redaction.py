"""Redaction: argv and batch-run.json never carry a credential value."""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sciencebench.login.options import SubmitOptions
from sciencebench.login.redaction import REDACTED, mask_secrets, redact_argv
from sciencebench.login.runrecord import build_run_record, write_run_record
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import DEFAULT_VERIFIER_IMAGE, make_selection

pytestmark = pytest.mark.unit

CONFIG_PLACEHOLDER = "<generated provider config>"


# --- rules, one by one ---------------------------------------------------------------


def test_agent_env_values_are_redacted_whatever_the_name() -> None:
    argv = ["pier", "run", "--ae", "FOO=plain-value", "--agent-env", "BAR=other=value", "--ae", "NOVALUE"]
    assert redact_argv(argv) == [
        "pier",
        "run",
        "--ae",
        f"FOO={REDACTED}",
        "--agent-env",
        f"BAR={REDACTED}",
        "--ae",
        "NOVALUE",
    ]


@pytest.mark.parametrize(
    "key",
    ["OPENAI_API_KEY", "api_key", "ANTHROPIC_AUTH_TOKEN", "client_secret", "DB_PASSWORD", "Authorization"],
)
def test_sensitive_assignments_are_redacted_anywhere(key: str) -> None:
    argv = ["pier", "run", "--ak", f"{key}=s3cr3t-value", f"{key}=again-s3cr3t"]
    assert redact_argv(argv) == ["pier", "run", "--ak", f"{key}={REDACTED}", f"{key}={REDACTED}"]


def test_plain_assignments_and_options_are_kept() -> None:
    argv = [
        "pier",
        "run",
        "--ak",
        "reasoning_effort=high",
        "--ek",
        'inference_urls=["http://gw:4000/v1"]',
        "--model",
        "gpt-5",
        "--path",
        "/sel/task_002",
    ]
    assert redact_argv(argv) == argv


@pytest.mark.parametrize("key", ["config_toml", "config_toml_file"])
def test_provider_config_is_replaced_by_a_placeholder(key: str) -> None:
    config = '[model_providers.gw]\nbase_url = "https://gw.example/v1"\nenv_key = "OPENAI_API_KEY"\n'
    out = redact_argv(["pier", "run", "--ak", f"{key}={config}"])
    assert out == ["pier", "run", "--ak", f"{key}={CONFIG_PLACEHOLDER}"]


def test_known_secrets_are_masked_inside_any_argument() -> None:
    argv = ["pier", "run", "--model", "route-sk-live-0001", "--path", "/x/sk-live-0001/y", "--ae", "A=${A}"]
    out = redact_argv(argv, ["sk-live-0001"])
    assert out == [
        "pier",
        "run",
        "--model",
        f"route-{REDACTED}",
        "--path",
        f"/x/{REDACTED}/y",
        "--ae",
        f"A={REDACTED}",
    ]


def test_redact_argv_does_not_mutate_its_input() -> None:
    argv = ["--ae", "A=secret-value"]
    redact_argv(argv, ["secret-value"])
    assert argv == ["--ae", "A=secret-value"]


def test_mask_secrets_longest_first_and_ignores_trivial_values() -> None:
    assert mask_secrets("token abcdef and abcdefgh", ["abcdef", "abcdefgh"]) == (
        f"token {REDACTED} and {REDACTED}"
    )
    # Values shorter than four characters would mask half the record.
    assert mask_secrets("a 1 on", ["1", "on", ""]) == "a 1 on"
    assert mask_secrets("abcd", ["abcd"]) == REDACTED


def test_mask_secrets_masks_a_secret_json_escaped_once_and_twice() -> None:
    secret = 'sk-"quoted"\\back'
    once = json.dumps(secret)  # the secret as a JSON string
    twice = json.dumps(json.dumps({"api_key": secret}))  # a JSON value held in a JSON string
    for text in (once, twice):
        masked = mask_secrets(text, [secret])
        assert "quoted" not in masked and "back" not in masked, masked
        assert REDACTED in masked


# --- properties ---------------------------------------------------------------------

# Secrets start with a marker that occurs nowhere else, so finding one in the
# output can only mean a leak. The alphabet avoids what an unquoted env-file
# value cannot hold (whitespace, quotes, '#', backslash).
_SECRET_ALPHABET = string.ascii_letters + string.digits + "-_.~+/=:@%!^&*()[]{}|,;?<>$"
secrets_st = st.builds(
    lambda body: f"Qx7{body}",
    st.text(alphabet=_SECRET_ALPHABET, min_size=5, max_size=48),
)
names_st = st.from_regex(r"[A-Z][A-Z0-9_]{0,15}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(
    secrets=st.lists(secrets_st, min_size=1, max_size=4, unique=True),
    names=st.lists(names_st, min_size=4, max_size=4),
    noise=st.text(alphabet=string.ascii_letters + "/-_", max_size=8),
)
def test_no_secret_survives_redact_argv(secrets: list[str], names: list[str], noise: str) -> None:
    argv = ["pier", "run"]
    for index, secret in enumerate(secrets):
        argv += ["--ae", f"{names[index]}={secret}"]
        argv += ["--ak", f"api_key={secret}"]
        argv += ["--model", f"{noise}{secret}{noise}"]
        argv += [f"--path={noise}{secret}"]
    out = redact_argv(argv, secrets)
    text = "\x00".join(out)
    for secret in secrets:
        assert secret not in text
    assert len(out) == len(argv)


@settings(max_examples=100, deadline=None)
@given(secret=secrets_st, name=names_st)
def test_agent_env_value_is_redacted_even_when_not_listed(secret: str, name: str) -> None:
    out = redact_argv(["pier", "run", "--ae", f"{name}={secret}"])
    assert out[-1] == f"{name}={REDACTED}"


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


@pytest.fixture(scope="module")
def selection_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_selection(
        tmp_path_factory.mktemp("redaction") / "sel",
        ["002", "005"],
        verifier_image={"005": DEFAULT_VERIFIER_IMAGE},
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    api_key=secrets_st,
    token=secrets_st,
    agent_env_secret=secrets_st,
    broker_password=secrets_st,
    agent=st.sampled_from(["codex", "claude-code", "mini-swe-agent", "nop"]),
)
def test_no_secret_reaches_batch_run_json(
    selection_dir: Path, api_key: str, token: str, agent_env_secret: str, broker_password: str, agent: str
) -> None:
    secrets = [api_key, token, agent_env_secret, broker_password]
    with tempfile.TemporaryDirectory() as scratch:
        env_file = Path(scratch) / "provider.env"
        env_file.write_text(
            "MODEL=gpt-5\n"
            f"OPENAI_API_KEY={api_key}\n"
            f"export ANTHROPIC_AUTH_TOKEN='{token}'\n"
            f"CODEX_BASE_URL=https://me:{quote(api_key, safe='')}@gw.example.edu:4000/v1"
            f"?key={quote(token, safe='')}\n"
            f"ANTHROPIC_BASE_URL=https://gw.example.edu:8443/anthropic?token={quote(token, safe='')}\n"
            f"OPENAI_BASE_URL=http://proxy.example:4001/v1\n",
            encoding="utf-8",
        )
        opts = SubmitOptions(
            path=selection_dir,
            agent=agent,
            env_file=env_file,
            agent_env=[f"GOOGLE_CLOUD_PROJECT={agent_env_secret}", f"OPENAI_API_KEY={api_key}"],
            agent_kwargs=["reasoning_summary=auto"],
            jobs_dir=Path(scratch) / "jobs",
            job_name="redaction",
            dry_run=True,
        )
        prepared = prepare(opts)
        broker = f"redis://default:{quote(broker_password, safe='')}@broker.example:6379/0?password=x"
        record = build_run_record(prepared.job, prepared.trials[0], broker, prepared.secret_values)
        write_run_record(selection_dir, record, prepared.secret_values)
        text = (selection_dir / "batch-run.json").read_text(encoding="utf-8")
        assert not (Path(scratch) / "jobs").exists()

    decoded = "\x00".join(_strings(json.loads(text)))
    record_text = "\x00".join(_strings(record.model_dump(mode="json")))
    for secret in secrets:
        for form in {secret, quote(secret, safe="")}:
            assert form not in text
            assert form not in decoded
            assert form not in record_text
    # The record still says what ran: names, not values.
    assert record.task_ids == ["002", "005"]
    if agent == "codex":
        assert record.provider is not None and record.provider.credential_env == "OPENAI_API_KEY"
        assert record.gateway_authorities == ["gw.example.edu:4000"]
    assert record.broker == "redis://broker.example:6379/0"
    assert "--ae" in record.pier_command
