"""Fuzzing `sciencebench submit --dry-run` as a whole: one error line or a dry run, never a traceback.

tests/unit/test_fuzz_parsers.py fuzzes each parser (task.toml, selection,
env file, --task-id, gateway URLs) on its own. This drives the command's
entry point (`cli.main`, in process) with fuzzed option values, task.toml
and env-file contents at once, so an exception the parsers let through
anywhere between option parsing and the run record would show up here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sciencebench import cli
from tests.fixtures.hosts import register_ready_host
from tests.fixtures.selection import make_selection
from tests.fixtures.services import RedisServer
from tests.unit.test_fuzz_parsers import toml_documents

pytestmark = pytest.mark.unit

CANARY = "sk-fuzz-canary-5e0b7d31"
AGENTS = ["nop", "oracle", "codex", "claude-code", "mini-swe-agent", "terminus-2"]

option_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30)
task_ids = st.one_of(
    option_text,
    st.lists(st.sampled_from(["001", "002", "1", "2-1", "001-002", "", ",", "-", "9" * 12]), max_size=4).map(
        ",".join
    ),
)
env_lines = st.one_of(
    st.sampled_from(
        [
            f"OPENAI_API_KEY={CANARY}",
            "CODEX_WIRE_API=responses",
            "CODEX_WIRE_API=x",
            "CODEX_BASE_URL=http://gw.test:4000/v1",
            f"CODEX_BASE_URL=http://u:{CANARY}@gw:1/v1",
            "MODEL=gpt-5",
            "export A=1",
            "# comment",
            "",
        ]
    ),
    option_text,
)


def mostly[T](valid: st.SearchStrategy[T], fuzzed: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """Valid three times in four, so that examples get past the first check to the later ones."""
    return st.integers(0, 3).flatmap(lambda pick: fuzzed if pick == 3 else valid)


submits = st.fixed_dictionaries(
    {
        "agent": mostly(st.sampled_from(AGENTS), option_text),
        "task_id": mostly(st.sampled_from([None, "001", "002", "001-002", "1,2"]), task_ids),
        "job_name": mostly(st.sampled_from([None, "fuzz", "a.b_c-1"]), option_text),
        "models": st.lists(mostly(st.sampled_from(["gpt-5", "openai/gpt-5"]), option_text), max_size=2),
        "agent_env": st.lists(mostly(st.just(f"EXTRA_TOKEN={CANARY}"), option_text), max_size=2),
        "agent_kwarg": st.lists(
            mostly(st.sampled_from(["reasoning_effort=high", "x=1"]), option_text), max_size=2
        ),
        "n_attempts": mostly(
            st.sampled_from([None, "1", "3"]), st.sampled_from(["0", "-2", "x", "1e3", " 2"])
        ),
        "multiplier": mostly(
            st.sampled_from([None, "1.5"]), st.sampled_from(["0", "-1", "nan", "inf", "abc"])
        ),
        "env_file": st.none() | st.lists(env_lines, max_size=6).map("\n".join),
        "task_toml": mostly(st.none(), toml_documents),
    }
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Path:
    # The session's broker as no other test left it: a worker host an earlier test killed still looks
    # live for two lease periods, and every dry run here would wait for its pre-pull answer meanwhile.
    redis.Redis.from_url(redis_server.url).flushdb()
    return make_selection(tmp_path_factory.mktemp("fuzz-cli") / "sel", ["001", "002"])


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(submit=submits)
def test_submit_dry_run_never_tracebacks(
    pristine: Path, tmp_path: Path, redis_server: RedisServer, submit: dict[str, object]
) -> None:
    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    selection = shutil.copytree(pristine, work / "sel")
    if submit["task_toml"] is not None:
        (selection / "task_002" / "task.toml").write_text(str(submit["task_toml"]))
    args = ["submit", "--path", str(selection), "--jobs-dir", str(work / "jobs"), "--dry-run",
            "--agent", str(submit["agent"])]  # fmt: skip
    if submit["env_file"] is not None:
        (work / "p.env").write_text(str(submit["env_file"]))
        args += ["--env-file", str(work / "p.env")]
    for flag, key in (("--task-id", "task_id"), ("--job-name", "job_name"), ("--n-attempts", "n_attempts"),
                      ("--agent-timeout-multiplier", "multiplier")):  # fmt: skip
        if submit[key] is not None:
            args += [flag, str(submit[key])]
    for flag, key in (("--model", "models"), ("--agent-env", "agent_env"), ("--agent-kwarg", "agent_kwarg")):
        for value in submit[key]:  # type: ignore[attr-defined]
            args += [flag, value]

    register_ready_host(redis_server.url)  # a dry run checks the live hosts, as a submit does
    result = CliRunner().invoke(cli.main, args, env={"SCIENCEBENCH_BROKER_URL": redis_server.url})

    output = result.stdout + result.stderr
    event(f"exit {result.exit_code}: {(result.stderr.strip().splitlines() or ['ok'])[-1][:40]}")
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args, repr(result.exception), result.exc_info,
    )  # fmt: skip
    assert "Traceback" not in output
    assert CANARY not in output
    assert not (work / "jobs").exists()  # a dry run never creates the job
    if result.exit_code == 0:
        assert "dry run:" in result.stdout
        assert CANARY not in (selection / "batch-run.json").read_text()
    else:
        assert result.exit_code == 2, (args, output)
        lines = result.stderr.strip().splitlines()
        # Ours: exactly one line. Click's own usage errors end in one "Error:" line.
        assert lines[-1].startswith(("sciencebench: error: ", "Error: ")), result.stderr
        if lines[-1].startswith("sciencebench: error: "):
            assert len(lines) == 1, result.stderr
        assert not (selection / "batch-run.json").exists()
