"""runrecord.py: batch-run.json carries the original's keys and no credentials."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest

import sciencebench
from sciencebench.core.errors import ProfileError
from sciencebench.core.gateways import public_url
from sciencebench.core.harnesses import REGISTRY
from sciencebench.core.models import JobSpec, TrialSpec
from sciencebench.login.options import SubmitOptions
from sciencebench.login.redaction import REDACTED
from sciencebench.login.runrecord import RunRecord, build_run_record, write_run_record
from sciencebench.login.submit import Prepared
from tests.fixtures.hosts import prepare
from tests.fixtures.selection import (
    DEFAULT_AGENT_IMAGE,
    DEFAULT_VERIFIER_IMAGE,
    REAL_TASKS,
    make_selection,
)

pytestmark = pytest.mark.unit
CODEX_ADAPTER = REGISTRY["codex"].adapter

# The keys the original single-host runner writes, then the ones sciencebench adds.
ORIGINAL_KEYS = [
    "task_ids",
    "allow_restricted_licenses",
    "selection_sha256",
    "image_refs",
    "platform",
    "agent",
    "models",
    "n_concurrent",
    "n_attempts",
    "max_retries",
    "pier_version",
    "pier_command",
    "agent_import_path",
    "provider",
    "network_policy",
    "gateway_authorities",
]
ADDED_KEYS = ["job_name", "job_id", "sciencebench_version", "broker"]
CANARY = "sk-canary-RECORD-5d1c0a"


def _prepare(tmp_path: Path, *, env_text: str | None = None, **kw: Any) -> Prepared:
    selection = tmp_path / "sel"
    if not selection.exists():
        make_selection(
            selection,
            ["005", "002"],
            verifier_image={"005": DEFAULT_VERIFIER_IMAGE},
            allow_restricted_licenses=True,
        )
    if env_text is not None:
        (tmp_path / "p.env").write_text(env_text)
        kw["env_file"] = tmp_path / "p.env"
    kw.setdefault("jobs_dir", tmp_path / "jobs")
    kw.setdefault("job_name", "rec")
    return prepare(SubmitOptions(path=selection, **kw))


def _record(prepared: Prepared, broker: str = "redis://localhost:6379/0") -> dict[str, Any]:
    """The record as batch-run.json holds it."""
    record = build_run_record(prepared.job, prepared.trials[0], broker, prepared.secret_values)
    loaded: dict[str, Any] = json.loads(record.text())
    return loaded


def test_record_has_every_key_of_the_original(tmp_path: Path) -> None:
    record = _record(_prepare(tmp_path))
    missing = [key for key in [*ORIGINAL_KEYS, *ADDED_KEYS] if key not in record]
    assert missing == []


def test_record_values_for_a_nop_run(tmp_path: Path) -> None:
    prepared = _prepare(
        tmp_path, n_concurrent=3, n_attempts=2, max_retries=1, platform="linux/amd64", models=["m1"]
    )
    record = _record(prepared)
    expected_hash = hashlib.sha256(
        json.dumps({"task_ids": ["005", "002"]}, sort_keys=True).encode()
    ).hexdigest()
    assert record["task_ids"] == ["005", "002"]
    assert record["allow_restricted_licenses"] is True
    assert record["selection_sha256"] == expected_hash
    assert record["image_refs"] == [DEFAULT_AGENT_IMAGE, DEFAULT_VERIFIER_IMAGE]
    assert record["platform"] == "linux/amd64"
    assert record["agent"] == "nop"
    assert record["models"] == ["m1"]
    assert (record["n_concurrent"], record["n_attempts"], record["max_retries"]) == (3, 2, 1)
    assert record["pier_version"] == "0.3.0"
    assert isinstance(record["pier_command"], str)  # one string, as the original writes it
    assert shlex.split(record["pier_command"])[:2] == ["pier", "run"]
    assert record["agent_import_path"] is None
    assert record["provider"] is None
    assert record["network_policy"] == "isolated-bridge"
    assert record["gateway_authorities"] == []
    assert record["job_name"] == "rec"
    assert record["job_id"] == str(prepared.job.job_id)  # result.json's id, the coordination key
    assert record["sciencebench_version"] == sciencebench.__version__
    assert record["broker"] == "redis://localhost:6379/0"
    json.dumps(record)  # JSON-serializable as is


def test_record_for_codex_names_provider_without_credentials(tmp_path: Path) -> None:
    env = (
        f"OPENAI_API_KEY={CANARY}\nMODEL=my-route\n"
        f"CODEX_BASE_URL=https://u:{CANARY}@gw.example.edu:4000/v1?key={CANARY}\n"
    )
    record = _record(_prepare(tmp_path, agent="codex", env_text=env))
    assert record["agent_import_path"] == CODEX_ADAPTER
    assert record["models"] == ["my-route"]
    assert record["provider"] == {
        "protocol": "responses",
        "base_url": "https://gw.example.edu:4000/v1",
        "credential_env": "OPENAI_API_KEY",
    }
    assert record["gateway_authorities"] == ["gw.example.edu:4000"]
    assert CANARY not in json.dumps(record)


def test_record_agent_is_the_requested_harness(tmp_path: Path) -> None:
    # The original records the --agent value under "agent" and the adapter
    # separately under "agent_import_path"; sciencebench writes the import
    # path in both, so the record no longer says the harness was codex.
    env = f"OPENAI_API_KEY={CANARY}\n"
    record = _record(_prepare(tmp_path, agent="codex", env_text=env))
    assert record["agent_import_path"] == CODEX_ADAPTER
    assert record["agent"] == "codex"


def test_pier_command_is_redacted(tmp_path: Path) -> None:
    prepared = _prepare(
        tmp_path,
        agent="claude-code",
        env_text=f"ANTHROPIC_AUTH_TOKEN={CANARY}\nANTHROPIC_BASE_URL=https://gw.example.edu/anthropic\n",
        agent_env=[f"GOOGLE_CLOUD_PROJECT={CANARY}-extra"],
    )
    record = _record(prepared)
    command = record["pier_command"]
    assert f"GOOGLE_CLOUD_PROJECT={REDACTED}" in command
    assert CANARY not in json.dumps(record)


def test_credential_looking_agent_kwargs_are_redacted_not_refused(tmp_path: Path) -> None:
    # The original passes them on and writes `KEY=<redacted>` in its record; the value stays
    # out of the record and of job.json, and is kept for the workers in a private file.
    prepared = _prepare(
        tmp_path, agent="claude-code", agent_kwargs=[f"api_key={CANARY}-kwarg", "max_thinking_tokens=16000"]
    )
    record = _record(prepared)
    assert f"api_key={REDACTED}" in record["pier_command"]
    assert f"max_thinking_tokens={REDACTED}" in record["pier_command"]
    assert CANARY not in json.dumps(record)
    assert prepared.job.agent.agent_kwargs == {"api_key": REDACTED, "max_thinking_tokens": REDACTED}
    assert CANARY not in prepared.job.model_dump_json()
    assert prepared.agent_kwarg_values == {"api_key": f"{CANARY}-kwarg", "max_thinking_tokens": "16000"}


def test_keywords_naming_host_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ProfileError, match="--agent-kwarg config_toml_file: names a file on the worker hosts"
    ):
        _prepare(tmp_path, agent_kwargs=["config_toml_file=/etc/passwd"])


def test_broker_credentials_are_dropped(tmp_path: Path) -> None:
    record = _record(_prepare(tmp_path), broker=f"redis://default:{CANARY}@broker.example:6379/2?x={CANARY}")
    assert record["broker"] == "redis://broker.example:6379/2"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("redis://:pw@host/0", "redis://host/0"),
        ("rediss://user:pw@host:6380/1?ssl_cert_reqs=none#x", "rediss://host:6380/1"),
        ("redis://user:pw@[::1]:6379/0", "redis://[::1]:6379/0"),
        ("redis://:pw@host:99999/0", "redis://host/0"),
        ("redis://:pw1@h1:6379/0;redis://:pw2@h2:6379/0", "redis://h1:6379/0;redis://h2:6379/0"),
        ("sentinel://:pw1@h1:26379;sentinel://:pw2@h2:26379", "sentinel://h1:26379;sentinel://h2:26379"),
        ("embedded (in-process)", "embedded (in-process)"),
    ],
)
def test_public_url(url: str, expected: str) -> None:
    assert public_url(url) == expected


def test_write_run_record_masks_and_replaces(tmp_path: Path) -> None:
    record = build_run_record(*_first(_prepare(tmp_path)), "redis://localhost:6379/0", [])
    leaked = record.model_copy(update={"models": [f"leaked {CANARY} here"]})
    write_run_record(tmp_path, leaked, [CANARY])
    written = json.loads((tmp_path / "batch-run.json").read_text())
    assert written["models"] == [f"leaked {REDACTED} here"]
    write_run_record(tmp_path, record, [])
    assert json.loads((tmp_path / "batch-run.json").read_text()) == json.loads(record.text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch-run.json", "sel"]  # no temporary left


def _first(prepared: Prepared) -> tuple[JobSpec, TrialSpec]:
    return prepared.job, prepared.trials[0]


@pytest.mark.parametrize("secret", ['sk-"quoted"-canary', "sk-back\\slash-canary", "sk-caf\u00e9-canary"])
def test_a_secret_json_escapes_is_masked_too(tmp_path: Path, secret: str) -> None:
    # A quote, a backslash or a non-ASCII letter is escaped in the file: masked in that form as well.
    record = build_run_record(*_first(_prepare(tmp_path)), "redis://localhost:6379/0", [])
    leaked = record.model_copy(update={"pier_command": f"pier run --ae KEY={secret}"})
    write_run_record(tmp_path, leaked, [secret])
    text = (tmp_path / "batch-run.json").read_text()
    assert secret not in json.loads(text)["pier_command"]
    assert json.dumps(secret)[1:-1] not in text
    assert json.loads(text)["pier_command"] == f"pier run --ae KEY={REDACTED}"


def test_every_field_of_the_record_is_masked(tmp_path: Path) -> None:
    # A secret that reached any field, however deep, is masked in the file.
    prepared = _prepare(tmp_path, agent="codex", env_text=f"OPENAI_API_KEY={CANARY}\n")
    record = build_run_record(*_first(prepared), "redis://localhost:6379/0", [])
    texts = [name for name, info in RunRecord.model_fields.items() if info.annotation in (str, "str")]
    assert "pier_command" in texts and "broker" in texts
    for name in texts:
        leaked = record.model_copy(update={name: f"x{CANARY}y"})
        write_run_record(tmp_path, leaked, [CANARY])
        text = (tmp_path / "batch-run.json").read_text()
        assert CANARY not in text, name
        assert json.loads(text)[name] == f"x{REDACTED}y", name
    assert record.provider is not None
    deep = record.model_copy(update={
        "provider": record.provider.model_copy(update={"base_url": f"https://{CANARY}.example/v1"}),
        "image_refs": [f"registry/{CANARY}@sha256:" + "0" * 64],
    })  # fmt: skip
    write_run_record(tmp_path, deep, [CANARY])
    assert CANARY not in (tmp_path / "batch-run.json").read_text()


# --- the record key by key against the original's, on the benchmark's released tasks -----------

CODEX_ENV = (
    f"MODEL=openai/my-deployment\nOPENAI_API_KEY={CANARY}\n"
    f"CODEX_BASE_URL=https://u:{CANARY}@gateway.example.edu/v1?token={CANARY}\n"
    "CODEX_WIRE_API=Responses\nCODEX_VERSION=latest\nCODEX_REASONING_EFFORT=\n"
)
# The spec's Basic Commands (paths changed only), plus its mini-swe-agent profile.
SCENARIOS: dict[str, dict[str, Any]] = {
    "nop-smoke": {"agent": "nop", "n_concurrent": 1, "n_attempts": 1, "job_name": "smoke"},
    "codex-small": {
        "agent": "codex", "env_text": CODEX_ENV, "n_concurrent": 2, "n_attempts": 1, "max_retries": 1,
        "job_name": "codex-small",
    },
    "claude-small": {
        "agent": "claude-code", "models": ["anthropic/claude-opus-4-7"], "n_concurrent": 1,
        "env_text": f"ANTHROPIC_AUTH_TOKEN={CANARY}\nANTHROPIC_BASE_URL=https://api.anthropic.com\n"
                    "ANTHROPIC_CUSTOM_HEADERS=\n",
        "job_name": "claude-small",
    },
    "mini-small": {
        "agent": "mini-swe-agent", "models": ["openai/gpt-5"],
        "env_text": f"OPENAI_API_KEY={CANARY}\nOPENAI_BASE_URL=https://gateway.example.edu/v1\n",
        "agent_kwargs": ["max_thinking_tokens=16000", "step_limit=50"], "job_name": "mini-small",
    },
}  # fmt: skip


def _original_record(selection: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    """What the original runner writes for this input, from the spec and the reference (section 2)."""
    listed = selection / "selection.json"
    chosen = json.loads(listed.read_text()) if listed.is_file() else {}
    ids = chosen.get("task_ids") or sorted(
        p.name.removeprefix("task_") for p in selection.glob("task_[0-9]*")
    )
    refs: dict[str, None] = {}
    for task_id in ids:
        toml = tomllib.loads((selection / f"task_{task_id}" / "task.toml").read_text())
        refs[toml["environment"]["docker_image"]] = None
        if verifier := toml.get("verifier", {}).get("environment", {}).get("docker_image"):
            refs[verifier] = None
    agent = scenario["agent"]
    codex = agent == "codex"
    return {
        "task_ids": ids,
        "allow_restricted_licenses": chosen.get("allow_restricted_licenses"),
        "selection_sha256": hashlib.sha256(
            json.dumps({"task_ids": ids}, sort_keys=True).encode()
        ).hexdigest(),
        "image_refs": list(refs),
        "platform": "linux/amd64",
        "agent": agent,
        "models": ["openai/my-deployment"] if codex else scenario.get("models", []),
        "n_concurrent": scenario.get("n_concurrent", 1),
        "n_attempts": scenario.get("n_attempts", 1),
        "max_retries": scenario.get("max_retries", 0),
        "pier_version": "0.3.0",
        "agent_import_path": CODEX_ADAPTER if codex else None,
        # The base URL as written, without credentials or query; for the translated Codex profile only.
        "provider": {
            "protocol": "responses",
            "base_url": "https://gateway.example.edu/v1",
            "credential_env": "OPENAI_API_KEY",
        }
        if codex
        else None,
        "network_policy": "isolated-bridge",
        "gateway_authorities": {
            "codex": ["gateway.example.edu:443"],
            "claude-code": ["api.anthropic.com:443"],
            "mini-swe-agent": ["gateway.example.edu:443"],
        }.get(agent, []),
    }


@pytest.fixture(scope="module")
def real_records(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """(ours, the original's) record of every scenario on a copy of the released tasks."""
    root = tmp_path_factory.mktemp("real")
    selection = root / "tasks-selected-small"
    shutil.copytree(REAL_TASKS, selection)
    records = {}
    # The hosts install agents online, as the original's do: no bake step.
    for name, scenario in SCENARIOS.items():
        kw = {key: value for key, value in scenario.items() if key != "env_text"}
        if "env_text" in scenario:
            (root / f"{name}.env").write_text(scenario["env_text"])
            kw["env_file"] = root / f"{name}.env"
        prepared = prepare(SubmitOptions(path=selection, jobs_dir=root / "jobs", **kw))
        records[name] = (_record(prepared), _original_record(selection, scenario))
    return records


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("key", [key for key in ORIGINAL_KEYS if key != "pier_command"])
def test_each_key_has_the_original_value_on_the_released_tasks(
    real_records: dict[str, tuple[dict[str, Any], dict[str, Any]]], key: str, scenario: str
) -> None:
    ours, original = real_records[scenario]
    assert ours[key] == original[key]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_pier_command_is_one_redacted_string_of_one_trial(
    real_records: dict[str, tuple[dict[str, Any], dict[str, Any]]], scenario: str
) -> None:
    ours, original = real_records[scenario]
    command = ours["pier_command"]
    assert isinstance(command, str)
    argv = shlex.split(command)
    assert argv[:2] == ["pier", "run"]
    # One trial's run: one task directory of the selection.
    path = Path(argv[argv.index("--path") + 1])
    assert path.name == f"task_{original['task_ids'][0]}"
    assert CANARY not in command
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and any(
            word in key.lower() for word in ("key", "token", "secret", "password", "authorization")
        ):
            assert value == REDACTED, arg
    if scenario == "codex-small":
        assert "command_model_name=openai/my-deployment" in argv  # the route exactly
        assert not any(arg.startswith("reasoning_effort=") for arg in argv)  # empty means unset
    if scenario == "mini-small":
        assert f"max_thinking_tokens={REDACTED}" in argv and "step_limit=50" in argv


def test_allow_restricted_licenses_is_null_when_the_selection_json_says_nothing(tmp_path: Path) -> None:
    selection = make_selection(tmp_path / "sel", ["002"])
    (selection / "selection.json").write_text(json.dumps({"task_ids": ["002"]}))
    assert _record(_prepare(tmp_path))["allow_restricted_licenses"] is None


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("redis://:pw@host/0", "redis://:***@host/0"),
        ("rediss://user:pw@host:6380/1?ssl_cert_reqs=none#x", "rediss://user:***@host:6380/1"),
        ("redis://user@[::1]:6379/0", "redis://user@[::1]:6379/0"),
        ("redis://u:pw@host:99999/0", "redis://u:***@host/0"),
        ("redis://:pw1@h1:6379/0;redis://:pw2@h2:6379/0", "redis://:***@h1:6379/0;redis://:***@h2:6379/0"),
    ],
)
def test_masked_url_keeps_the_user_and_hides_the_password(url: str, expected: str) -> None:
    from sciencebench.core.gateways import masked_url

    assert masked_url(url) == expected
