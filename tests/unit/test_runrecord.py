"""runrecord.py: batch-run.json carries the original's keys and no credentials."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import sciencebench
from sciencebench.core.errors import ProfileError
from sciencebench.core.gateways import public_url
from sciencebench.core.harness import CODEX_ADAPTER
from sciencebench.login.options import SubmitOptions
from sciencebench.login.redaction import REDACTED
from sciencebench.login.runrecord import build_run_record, write_run_record
from sciencebench.login.submit import Prepared, prepare
from tests.fixtures.selection import DEFAULT_AGENT_IMAGE, DEFAULT_VERIFIER_IMAGE, make_selection

pytestmark = pytest.mark.unit

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
    return build_run_record(prepared.job, prepared.trials[0], broker, prepared.secret_values)


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
    assert record["pier_command"][:2] == ["pier", "run"]
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


def test_credential_looking_agent_kwargs_are_refused(tmp_path: Path) -> None:
    # Kwargs ride on Pier's command line, where `ps` shows them: credentials go in --env-file.
    with pytest.raises(ProfileError, match="--agent-kwarg api_key: looks like a credential"):
        _prepare(tmp_path, agent_kwargs=[f"api_key={CANARY}-kwarg"])


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
    record = {"task_ids": ["002"], "note": f"leaked {CANARY} here"}
    write_run_record(tmp_path, record, [CANARY])
    written = json.loads((tmp_path / "batch-run.json").read_text())
    assert written == {"task_ids": ["002"], "note": f"leaked {REDACTED} here"}
    write_run_record(tmp_path, {"task_ids": ["005"]}, [])
    assert json.loads((tmp_path / "batch-run.json").read_text()) == {"task_ids": ["005"]}
    assert [p.name for p in tmp_path.iterdir()] == ["batch-run.json"]  # no temporary left behind
