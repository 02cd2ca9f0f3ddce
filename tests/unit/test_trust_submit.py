"""The login node refuses what would let a job steer a worker host: one line, exit 2, nothing written.

Each case runs the CLI in-process on a fixture selection and checks the
message names the problem, never a secret value, and that neither the
selection nor the jobs directory changed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sciencebench import cli
from sciencebench.core.models import check_job_name
from tests.fixtures.selection import DEFAULT_VERIFIER_IMAGE, make_selection

pytestmark = pytest.mark.unit

CANARY = "sk-canary-TRUST-51ab77"


def _tree(root: Path) -> dict[str, str]:
    """Every file under `root` with its hash (and every directory), to prove nothing changed."""
    if not root.exists():
        return {}
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            found[rel] = "dir"
        else:
            found[rel] = "special"
    return found


def _submit(tmp_path: Path, selection: Path, *args: str) -> Result:
    jobs = tmp_path / "jobs"
    before = (_tree(selection), _tree(jobs))
    result = CliRunner().invoke(
        cli.main, ["submit", "--path", str(selection), "--jobs-dir", str(jobs), "--job-name", "t", *args]
    )
    if result.exit_code == 2:
        assert (_tree(selection), _tree(jobs)) == before, "exit 2 wrote something"
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("sciencebench: error: ")
        assert CANARY not in result.stdout + result.stderr
    return result


@pytest.fixture
def selection(tmp_path: Path) -> Path:
    return make_selection(tmp_path / "sel", ["001", "002"])


# --- the harness is the worker's own -------------------------------------------------


def test_a_job_cannot_choose_the_workers_pier(tmp_path: Path, selection: Path) -> None:
    marker = tmp_path / "marker"
    script = tmp_path / "x.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    result = _submit(tmp_path, selection, "--pier-bin", str(script))
    assert result.exit_code == 2
    assert "every worker runs its own Pier" in result.stderr
    assert "SCIENCEBENCH_PIER_BIN" in result.stderr
    assert not marker.exists()


def test_local_mode_keeps_pier_bin(tmp_path: Path, selection: Path) -> None:
    result = _submit(tmp_path, selection, "--pier-bin", "/opt/pier/bin/pier", "--local", "--skip-pull",
                     "--dry-run")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "pier command: /opt/pier/bin/pier run" in result.stdout


@pytest.mark.parametrize("path", ["nocolon", "a.b:", ":Cls", "os;rm:X", "a b:C"])
def test_agent_import_path_must_be_module_colon_class(tmp_path: Path, selection: Path, path: str) -> None:
    result = _submit(tmp_path, selection, "--agent-import-path", path, "--dry-run")
    assert result.exit_code == 2
    assert "expected module:Class" in result.stderr


@pytest.mark.parametrize("platform", ["foo", "linux", "linux/", "/amd64", "a/b/c/d"])
def test_platform_must_be_os_arch(tmp_path: Path, selection: Path, platform: str) -> None:
    result = _submit(tmp_path, selection, "--platform", platform, "--dry-run")
    assert result.exit_code == 2
    assert "expected os/arch" in result.stderr


# --- env files cannot steer the harness ------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["LD_PRELOAD", "PATH", "PYTHONPATH", "DOCKER_HOST", "SCIENCEBENCH_PROXY_IMAGE", "CODEX_AUTH_JSON_PATH",
     "HTTPS_PROXY", "no_proxy", "COMPOSE_FILE", "REQUESTS_CA_BUNDLE", "HOME", "BASH_ENV", "OPENSSL_CONF",
     "CODEX_FORCE_AUTH_JSON", "GODEBUG", "HOST_AGENT_LOGS_PATH"],
)  # fmt: skip
def test_env_file_keys_that_steer_the_harness_are_refused(tmp_path: Path, selection: Path, key: str) -> None:
    env_file = tmp_path / "p.env"
    env_file.write_text(f"OPENAI_API_KEY=x\n{key}={CANARY}\n")
    result = _submit(tmp_path, selection, "--env-file", str(env_file))
    assert result.exit_code == 2
    assert f"--env-file: refused: {key}" in result.stderr


def test_agent_env_keys_are_held_to_the_same_rule(tmp_path: Path, selection: Path) -> None:
    result = _submit(tmp_path, selection, "--agent-env", f"LD_LIBRARY_PATH={CANARY}")
    assert result.exit_code == 2
    assert "--agent-env: refused: LD_LIBRARY_PATH" in result.stderr


def test_a_nul_byte_in_an_env_value_is_refused(tmp_path: Path, selection: Path) -> None:
    env_file = tmp_path / "p.env"
    env_file.write_bytes(b'OPENAI_API_KEY="a\x00b"\n')
    result = _submit(tmp_path, selection, "--env-file", str(env_file))
    assert result.exit_code == 2
    assert "line 1: value contains a NUL character" in result.stderr


def test_agent_kwargs_naming_worker_files_are_refused(tmp_path: Path, selection: Path) -> None:
    for kwarg in ("config_toml_file=/etc/shadow", "prompt_template_path=/root/.ssh/id_rsa"):
        result = _submit(tmp_path, selection, "--agent-kwarg", kwarg, "--dry-run")
        assert result.exit_code == 2
        assert "names a file on the worker hosts" in result.stderr


def test_codex_adapter_refuses_an_explicit_config_toml(tmp_path: Path, selection: Path) -> None:
    config = 'model_provider = "x"\n[model_providers.x]\nbase_url = "http://gw.example:4000/v1"\n'
    result = _submit(tmp_path, selection, "--agent", "codex", "--agent-kwarg", f"config_toml={config}",
                     "--dry-run")  # fmt: skip
    assert result.exit_code == 2
    assert "--no-auto-agent-adapter" in result.stderr


@pytest.mark.usefixtures("ready_broker")
def test_builtin_codex_gets_the_gateway_of_its_config_toml(tmp_path: Path, selection: Path) -> None:
    config = 'model_provider = "x"\n[model_providers.x]\nbase_url = "http://gw.example:4000/v1"\n'
    args = ["--agent", "codex", "--no-auto-agent-adapter", "--dry-run", "--no-auto-provider", "--model", "m"]
    result = _submit(tmp_path, selection, *args, "--agent-kwarg", f"config_toml={config}")
    assert result.exit_code == 0, result.stderr
    assert '"gw.example:4000"' in (selection / "batch-run.json").read_text()


# --- templates resolve only from what the submit declared -----------------------------------


def _with_toml(tmp_path: Path, extra: str) -> Path:
    return make_selection(tmp_path / "tsel", ["001"], extra_toml=extra)


@pytest.mark.parametrize(
    "extra",
    [
        '[verifier]\nenv = { LEAK = "${SCIENCEBENCH_BROKER_URL}" }',
        '[solution]\nenv = { K = "${OPENAI_API_KEY:-none}" }',
        "[environment.env]\nX = '${HOME}'",
    ],
)
def test_an_undeclared_template_is_refused(tmp_path: Path, extra: str) -> None:
    # make_selection's toml already has [environment] and [verifier]; write the table freshly.
    selection = _with_toml(tmp_path, "")
    toml = selection / "task_001" / "task.toml"
    text = toml.read_text()
    if extra.startswith("[verifier]"):
        text = text.replace("[verifier]\n", '[verifier]\nenv = { LEAK = "${SCIENCEBENCH_BROKER_URL}" }\n')
    elif extra.startswith("[environment.env]"):
        text = text.replace("[environment]\n", "[environment]\nenv = { X = '${HOME}' }\n")
    else:
        text += "\n" + extra + "\n"
    toml.write_text(text)
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert "neither --env-file nor --agent-env provides" in result.stderr


@pytest.mark.usefixtures("ready_broker")
def test_a_declared_template_is_accepted(tmp_path: Path) -> None:
    selection = _with_toml(tmp_path, "")
    toml = selection / "task_001" / "task.toml"
    toml.write_text(toml.read_text().replace("[verifier]\n", '[verifier]\nenv = { K = "${GRADER_TOKEN}" }\n'))
    refused = _submit(tmp_path, selection, "--dry-run")
    assert refused.exit_code == 2
    env_file = tmp_path / "p.env"
    env_file.write_text(f"GRADER_TOKEN={CANARY}\n")
    accepted = _submit(tmp_path, selection, "--dry-run", "--env-file", str(env_file))
    assert accepted.exit_code == 0, accepted.stderr


# --- task compose files ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("compose", "says"),
    [
        ("services:\n  main:\n    volumes: ['/:/host']\n", "bind mount of '/'"),
        (
            "services:\n  main:\n    volumes: ['/var/run/docker.sock:/s']\n",
            "bind mount of '/var/run/docker.sock'",
        ),
        ("services:\n  main:\n    pid: host\n", "pid: 'host' (only private namespaces)"),
        ("services:\n  main:\n    privileged: true\n", "privileged"),
        ("services:\n  main:\n    security_opt: ['seccomp=unconfined']\n", "security_opt"),
        ("services:\n  main:\n    cap_add: [SYS_ADMIN]\n", "'cap_add' is not allowed"),
        ("services:\n  main:\n    devices: ['/dev/kmsg']\n", "'devices' is not allowed"),
        ("services:\n  side:\n    image: x\n", "service side: only 'main' may be configured"),
        ("services:\n  main:\n    volumes: ['../../../etc:/etc2']\n", "outside the task directory"),
    ],
)
def test_a_task_compose_file_asking_for_the_host_is_refused(tmp_path: Path, compose: str, says: str) -> None:
    selection = make_selection(tmp_path / "csel", ["001"])
    (selection / "task_001" / "tests" / "docker-compose.yaml").write_text(compose)
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert "refused by the network policy" in result.stderr and says in result.stderr


@pytest.mark.usefixtures("ready_broker")
def test_a_task_compose_file_may_mount_its_own_files(tmp_path: Path) -> None:
    selection = make_selection(tmp_path / "csel", ["001"])
    tests = selection / "task_001" / "tests"
    (tests / "grader").mkdir()
    (tests / "docker-compose.yaml").write_text(
        "services:\n  main:\n    volumes: ['./grader:/grader:ro', 'cache:/cache']\n"
        "    environment: {LOGS: '${ENV_VERIFIER_LOGS_PATH}'}\nvolumes:\n  cache: {}\n"
    )
    assert _submit(tmp_path, selection, "--dry-run").exit_code == 0


def test_a_bind_source_may_not_come_from_a_variable_even_piers(tmp_path: Path) -> None:
    # Pier mounts its log directories itself; a task naming them would follow whatever the
    # compose process's environment says HOST_VERIFIER_LOGS_PATH is.
    selection = make_selection(tmp_path / "csel", ["001"])
    (selection / "task_001" / "tests" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    volumes: ['${HOST_VERIFIER_LOGS_PATH}:/logs/v']\n"
    )
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert "service main: volumes may not use compose variables" in result.stderr


def test_compose_variables_must_be_declared(tmp_path: Path) -> None:
    selection = make_selection(tmp_path / "csel", ["001"])
    (selection / "task_001" / "tests" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    environment:\n"
        "      KEY: ${SCIENCEBENCH_BROKER_URL}\n      OK: ${MAIN_IMAGE_NAME}\n"
    )
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert "${SCIENCEBENCH_BROKER_URL}" in result.stderr


# The selections of security review 13 (/tmp/review-13/sel_*), rebuilt here: a compose file
# for environment/ and the task's [environment].env. Each must exit 2 at submit.
EVIL_SERVICE = 'services: {e: {image: x, privileged: true, pid: host, volumes: ["/:/host"]}}'
REVIEW_13 = {
    "sel_alt_value": ('services: {main: {pid: "${MAIN_IMAGE_NAME:+host}"}}', "", "alternative-value form"),
    "sel_build_secret": (
        "services: {main: {build: {context: ., secrets: [s]}}}\nsecrets: {s: {file: /etc/shadow}}",
        "",
        "top-level 'secrets' is not allowed",
    ),
    "sel_docker_config_env": (
        "services: {main: {}}",
        f'env = {{ DOCKER_CONFIG = "{CANARY}", LD_PRELOAD = "{CANARY}" }}',
        "environment.env: refused: DOCKER_CONFIG",
    ),
    "sel_env_file": (
        'services: {main: {env_file: ["/etc/sciencebench/worker.env"]}}',
        "",
        "'env_file' is not allowed",
    ),
    "sel_extends": (
        "services: {main: {extends: {file: evil.yaml, service: e}}}",
        "",
        "'extends' is not allowed",
    ),
    "sel_include": ("include: [evil.yaml]\nservices: {main: {}}", "", "top-level 'include' is not allowed"),
    "sel_pid_own_env": (
        'services: {main: {pid: "${PM}", ipc: "${PM}"}}',
        'env = { PM = "host" }',
        "pid may not use compose variables",
    ),
    "sel_pier_var_override": (
        'services: {main: {volumes: ["${HOST_AGENT_LOGS_PATH}:/host"]}}',
        'env = { HOST_AGENT_LOGS_PATH = "/" }',
        "environment.env: refused: HOST_AGENT_LOGS_PATH",
    ),
    "sel_volumes_from": (
        'services: {main: {volumes_from: ["container:sciencebench-worker"]}}',
        "",
        "'volumes_from' is not allowed",
    ),
}


@pytest.mark.parametrize("case", sorted(REVIEW_13))
def test_the_review_13_selections_exit_2_in_one_line(tmp_path: Path, case: str) -> None:
    compose, env_line, says = REVIEW_13[case]
    selection = make_selection(tmp_path / case, ["001"])
    task = selection / "task_001"
    (task / "environment" / "docker-compose.yaml").write_text(compose)
    (task / "environment" / "evil.yaml").write_text(EVIL_SERVICE)
    if env_line:
        toml = task / "task.toml"
        toml.write_text(
            toml.read_text().replace(
                'workdir = "/app/task_001"\n', f'workdir = "/app/task_001"\n{env_line}\n', 1
            )
        )
    result = _submit(tmp_path, selection)  # a real submit (no --dry-run): nothing may be written either
    assert result.exit_code == 2, result.output
    assert "task 001 (" in result.stderr and says in result.stderr, result.stderr
    assert "Traceback" not in result.output


# --- env tables of a task.toml ----------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["PATH", "LD_PRELOAD", "DOCKER_HOST", "DOCKER_CONFIG", "COMPOSE_FILE", "OPENSSL_CONF",
     "HOST_AGENT_LOGS_PATH", "CONTEXT_DIR", "MAIN_IMAGE_NAME", "PREBUILT_IMAGE_NAME", "PYTHONPATH",
     "BUILDX_CONFIG"],
)  # fmt: skip
@pytest.mark.parametrize("table", ["environment", "verifier", "solution", "verifier.environment", "agent"])
def test_a_task_env_key_that_steers_the_harness_is_refused(tmp_path: Path, key: str, table: str) -> None:
    selection = make_selection(tmp_path / "esel", ["001"], verifier_image=DEFAULT_VERIFIER_IMAGE)
    toml = selection / "task_001" / "task.toml"
    text = toml.read_text()
    header = f"[{table}]\n"
    assignment = f'{key} = "{CANARY}"\n'
    if header in text:
        text = text.replace(header, f"{header}env = {{ {assignment.strip()} }}\n", 1)
    else:
        text += f"\n[{table}.env]\n{assignment}"
    toml.write_text(text)
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2, result.stderr
    assert "task 001 (" in result.stderr and f"{table}.env: refused: {key}" in result.stderr


# --- symlinks, special files, .env files ------------------------------------------------------


def test_a_symlinked_environment_dir_is_refused(tmp_path: Path) -> None:
    # Review 13's selE: the worker computed mount roots from the symlink's target.
    selection = make_selection(tmp_path / "sel", ["001"])
    shared = tmp_path / "shared" / "env"
    shutil.move(selection / "task_001" / "environment", shared)
    (selection / "task_001" / "environment").symlink_to(shared)
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert "environment is a symlink" in result.stderr


@pytest.mark.parametrize("name", ["tests", "task.toml", "pre_artifacts.sh", "solution"])
def test_any_symlinked_top_level_entry_is_refused(tmp_path: Path, name: str) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    task = selection / "task_001"
    outside = tmp_path / "outside"
    outside.mkdir()
    if (task / name).exists():
        shutil.move(task / name, outside / name)
    else:
        (outside / name).mkdir()
    (task / name).symlink_to(outside / name)
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert f"{name} is a symlink" in result.stderr


def test_a_symlinked_compose_file_is_refused(tmp_path: Path) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    elsewhere = tmp_path / "c.yaml"
    elsewhere.write_text("services: {main: {}}\n")
    (selection / "task_001" / "tests" / "docker-compose.yaml").symlink_to(elsewhere)
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert "tests/docker-compose.yaml is a symlink" in result.stderr


def test_a_fifo_compose_file_is_refused_without_hanging(tmp_path: Path) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    os.mkfifo(selection / "task_001" / "environment" / "docker-compose.yaml")
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert "environment/docker-compose.yaml is not a regular file" in result.stderr


@pytest.mark.parametrize("where", ["environment", "tests"])
def test_a_dot_env_file_in_a_compose_project_dir_is_refused(tmp_path: Path, where: str) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    (selection / "task_001" / where / ".env").write_text(f"PM=host\nTOKEN={CANARY}\n")
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert f"{where}/.env: compose would read it" in result.stderr


# --- the selection's own files --------------------------------------------------------------


def test_a_symlinked_task_directory_is_refused(tmp_path: Path) -> None:
    outside = make_selection(tmp_path / "elsewhere", ["002"])
    selection = make_selection(tmp_path / "sel", ["001", "002"])
    shutil.rmtree(selection / "task_002")
    (selection / "task_002").symlink_to(outside / "task_002")
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert "task_002: a symlink" in result.stderr


def test_a_named_pipe_as_task_toml_is_refused_without_hanging(tmp_path: Path) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    toml = selection / "task_001" / "task.toml"
    toml.unlink()
    os.mkfifo(toml)
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert "task.toml: not a regular file" in result.stderr


def test_an_instruction_that_is_a_directory_is_one_line(tmp_path: Path) -> None:
    # Unreadable to anyone, root included (a mode of 0 would not stop root).
    selection = make_selection(tmp_path / "sel", ["001"])
    instruction = selection / "task_001" / "instruction.md"
    instruction.unlink()
    instruction.mkdir()
    result = _submit(tmp_path, selection, "--dry-run")
    assert result.exit_code == 2
    assert "instruction.md" in result.stderr


# --- names and exit 2 -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["smoke\n", "smoke\nx", "-x", "a/b", "..", "a" * 129, ""])
def test_job_names_must_match_in_full(tmp_path: Path, selection: Path, name: str) -> None:
    with pytest.raises(ValueError):
        check_job_name(name)
    result = CliRunner().invoke(
        cli.main, ["submit", "--path", str(selection), "--job-name", name, "--dry-run"]
    )
    assert result.exit_code == 2


def test_exit_2_writes_no_secret(tmp_path: Path, selection: Path) -> None:
    """A jobs dir that is a file: the --agent-env secrets file must not be left behind."""
    jobs = tmp_path / "jobs-file"
    jobs.write_text("not a directory\n")
    before = _tree(selection)
    result = CliRunner().invoke(
        cli.main,
        ["submit", "--local", "--path", str(selection), "--jobs-dir", str(jobs), "--job-name", "t",
         "--agent-env", f"X_TOKEN={CANARY}"],
    )  # fmt: skip
    assert result.exit_code == 2, result.stderr
    assert _tree(selection) == before
    assert not (selection / ".sciencebench").exists()
    assert jobs.read_text() == "not a directory\n"
    assert CANARY not in result.stdout + result.stderr
