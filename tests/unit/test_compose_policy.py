"""The compose allowlist (pure): interpolation, the static and the rendered model, a whole task, its hash.

Each refused case is one way review 13 (or compose's own grammar) let a task
compose file reach the host past the old denylist; each accepted case is a
shape a real task, or Pier's own files, needs.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sciencebench.core.compose_policy import POLICY_LOGGING, compose_problems
from sciencebench.core.interpolation import interpolation
from sciencebench.core.taskdir import DEFINING_FILES, read_regular, task_toml_sha256
from sciencebench.core.taskreview import review_task, review_task_dir
from tests.fixtures.selection import REAL_TASKS, make_task

pytestmark = pytest.mark.unit

PINNED = "127.0.0.1:5555/sciencebench/base@sha256:" + "a" * 64


# --- interpolation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "names", "problem"),
    [
        ("plain", set(), None),
        ("$$HOME and $${X}", set(), None),
        ("$A ${B} ${C:-x} ${D-x} ${E:?must} ${F?must}", {"A", "B", "C", "D", "E", "F"}, None),
        ("${A:-${B}}", set(), "nested expression"),
        ("${PM:-${DOCKER_HOST}}", set(), "nested expression"),
        ("${MAIN_IMAGE_NAME:+host}", set(), "alternative-value form"),
        ("${A+x}", set(), "alternative-value form"),
        ("$1", set(), "lone '$'"),
        ("${", set(), "unterminated"),
        ("${-x}", set(), "does not name a variable"),
        ("${A*b}", set(), "not a compose expression"),
    ],
)
def test_interpolation_names_and_refusals(text: str, names: set[str], problem: str | None) -> None:
    found, problems = interpolation(text)
    assert found == names
    assert (problems == []) if problem is None else any(problem in p for p in problems), problems


# --- the static allowlist -------------------------------------------------------------------


@pytest.fixture
def task(tmp_path: Path) -> Path:
    task = make_task(tmp_path, "001")
    (task / "environment" / "data").mkdir()
    return task


def _problems(task: Path, text: str) -> list[str]:
    return compose_problems(yaml.safe_load(text), task / "environment", [task])


# Review 13's hazards.py, plus the forms its list implies.
REFUSED = {
    "pid_via_own_env": ("services: {main: {pid: '${PM}'}}", "pid may not use compose variables"),
    "pid_via_alt_value": ("services: {main: {pid: '${MAIN_IMAGE_NAME:+host}'}}", "alternative-value form"),
    "seccomp_via_alt": (
        "services: {main: {security_opt: ['${MAIN_IMAGE_NAME:+seccomp=unconfined}']}}",
        "alternative-value form",
    ),
    "bind_via_pier_var": (
        "services: {main: {volumes: ['${HOST_AGENT_LOGS_PATH}/x:/host']}}",
        "volumes may not use compose variables",
    ),
    "extends_other_file": ("services: {main: {extends: {file: evil.yaml, service: e}}}", "'extends'"),
    "include": ("include: [evil.yaml]\nservices: {main: {}}", "top-level 'include'"),
    "volumes_from": ("services: {main: {volumes_from: ['container:sciencebench-worker']}}", "'volumes_from'"),
    "env_file_host": ("services: {main: {env_file: [/etc/sciencebench/worker.env]}}", "'env_file'"),
    "secrets_file": ("services: {main: {secrets: [s]}}\nsecrets: {s: {file: /etc/shadow}}", "'secrets'"),
    "configs_file": (
        "services: {main: {configs: [c]}}\nconfigs: {c: {file: /root/.docker/c.json}}",
        "'configs'",
    ),
    "build_ctx_root": ("services: {main: {build: {context: /}}}", "build context '/'"),
    "build_network_host": ("services: {main: {build: {context: ., network: host}}}", "build key 'network'"),
    "build_ssh": ("services: {main: {build: {context: ., ssh: [default]}}}", "build key 'ssh'"),
    "build_secrets": ("services: {main: {build: {context: ., secrets: [s]}}}", "build key 'secrets'"),
    "build_inline": (
        "services: {main: {build: {dockerfile_inline: 'FROM x'}}}",
        "build key 'dockerfile_inline'",
    ),
    "build_dockerfile_up": ("services: {main: {build: {context: ., dockerfile: ../../x}}}", "dockerfile"),
    "build_context_var": ("services: {main: {build: {context: '${CONTEXT_DIR}'}}}", "build may not use"),
    "build_additional": ("services: {main: {build: {additional_contexts: {h: /}}}}", "additional_contexts"),
    # compose keeps these as they are (not a path): the Engine's builder fetches them on the host's network.
    "build_ctx_http": ("services: {main: {build: 'http://169.254.169.254/latest/x.tar'}}", "not a local"),
    "build_ctx_git": ("services: {main: {build: {context: 'git@127.0.0.1:x/y.git'}}}", "not a local"),
    "build_ctx_github": ("services: {main: {build: {context: github.com/x/y}}}", "not a local"),
    "build_ctx_image": ("services: {main: {build: {context: 'docker-image://alpine'}}}", "not a local"),
    "build_ctx_service": ("services: {main: {build: {context: 'service:other'}}}", "not a local"),
    "pid_host": ("services: {main: {pid: host}}", "pid: 'host'"),
    "pid_container": ("services: {main: {pid: 'container:sciencebench-worker'}}", "only private namespaces"),
    "ipc_container": ("services: {main: {ipc: 'container:x'}}", "only private namespaces"),
    "uts_host": ("services: {main: {uts: host}}", "only private namespaces"),
    "userns_host": ("services: {main: {userns_mode: host}}", "only private namespaces"),
    "cgroup_host": ("services: {main: {cgroup: host}}", "only private namespaces"),
    "seccomp_profile_file": ("services: {main: {security_opt: ['seccomp=allowall.json']}}", "security_opt"),
    "apparmor_unconfined": ("services: {main: {security_opt: ['apparmor:unconfined']}}", "security_opt"),
    "cgroup_parent": ("services: {main: {cgroup_parent: '/'}}", "'cgroup_parent'"),
    "gpus": ("services: {main: {gpus: all}}", "'gpus'"),
    "device_reservation": (
        "services: {main: {deploy: {resources: {reservations: {devices: [{capabilities: [gpu]}]}}}}}",
        "deploy.resources.reservations.devices",
    ),
    "network_external_host": (
        "services: {main: {networks: [h]}}\nnetworks: {h: {external: true, name: host}}",
        "top-level 'networks'",
    ),
    "network_mode_host": ("services: {main: {network_mode: host}}", "network_mode 'host'"),
    "network_mode_var": ("services: {main: {network_mode: '${NM}'}}", "network_mode may not use"),
    "privileged": ("services: {main: {privileged: true}}", "privileged"),
    "privileged_var": ("services: {main: {privileged: '${P}'}}", "privileged may not use"),
    "cap_add": ("services: {main: {cap_add: [SYS_ADMIN]}}", "'cap_add'"),
    "devices": ("services: {main: {devices: ['/dev/kmsg']}}", "'devices'"),
    "runtime": ("services: {main: {runtime: 'sysbox-runc'}}", "'runtime'"),
    "nested_default": ("services: {main: {environment: {X: '${MAIN_IMAGE_NAME:-${HOME}}'}}}", "nested"),
    "sysctls": ("services: {main: {sysctls: {kernel.shm_rmid_forced: 1}}}", "'sysctls'"),
    "long_bind_parent": ("services: {main: {volumes: [{type: bind, source: ../.., target: /h}]}}", "outside"),
    "bind_root": ("services: {main: {volumes: ['/:/host']}}", "bind mount of '/'"),
    "bind_home": ("services: {main: {volumes: ['~/.ssh:/s']}}", "bind mount of '~/.ssh'"),
    "bind_propagation": (
        "services: {main: {volumes: [{type: bind, source: ./data, target: /d, "
        "bind: {propagation: rshared}}]}}",
        "option 'propagation'",
    ),
    # compose makes these binds (Windows paths: a UNC name, a drive) and leaves them as written.
    "bind_unc_short": (
        "services: {main: {volumes: ['\\\\\\\\.\\\\pipe\\\\docker_engine:/h']}}",
        "bind mount of",
    ),
    "bind_drive_long": (
        "services: {main: {volumes: [{type: bind, source: 'c:/etc', target: /h}]}}",
        "bind mount of",
    ),
    "bind_selinux_relabel": ("services: {main: {volumes: ['./data:/d:z']}}", "volume mode 'z'"),
    "volume_driver_opts": (
        "services: {main: {}}\nvolumes: {v: {driver_opts: {type: none, o: bind, device: /}}}",
        "'driver_opts'",
    ),
    "volume_external": ("services: {main: {}}\nvolumes: {v: {external: true, name: other}}", "'external'"),
    "second_service": ("services: {main: {}, side: {image: x}}", "service side: only 'main'"),
    "container_name": ("services: {main: {container_name: sciencebench-worker}}", "'container_name'"),
    "ports": ("services: {main: {ports: ['0.0.0.0:80:80']}}", "'ports'"),
    "unpinned_image": ("services: {main: {image: 'ubuntu:latest'}}", "not pinned by digest"),
    "image_and_build": (f"services: {{main: {{image: '{PINNED}', build: .}}}}", "image and build together"),
    "reserved_label": ("services: {main: {labels: {org.sciencebench.owner: x}}}", "reserved"),
    "logging_driver": ("services: {main: {logging: {driver: syslog}}}", "'logging'"),
    "project_name": ("name: other\nservices: {main: {}}", "top-level 'name'"),
    "pull_always": ("services: {main: {pull_policy: always}}", "pull_policy 'always'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_allowlist_refuses(task: Path, case: str) -> None:
    text, says = REFUSED[case]
    problems = _problems(task, text)
    assert any(says in problem for problem in problems), problems


def test_what_a_task_compose_file_may_ask_for(task: Path) -> None:
    text = f"""
x-common: &common
  TZ: UTC
version: "3.8"
services:
  main:
    image: {PINNED}
    command: ["sh", "-c", "echo $$HOME ${{GREETING:-hi}}"]
    environment:
      <<: *common
      KEY: ${{OPENAI_API_KEY}}
      LOGS: ${{ENV_AGENT_LOGS_PATH}}
    working_dir: /app
    volumes: ["./data:/data:ro", "cache:/cache", {{type: tmpfs, target: /scratch}}]
    deploy: {{resources: {{limits: {{cpus: "1", memory: 1G}}}}}}
    healthcheck: {{test: ["CMD", "true"], interval: 1s}}
    security_opt: [no-new-privileges:true]
    network_mode: none
    privileged: false
    cap_drop: [ALL]
    ipc: private
    pull_policy: missing
volumes:
  cache: {{}}
"""
    assert _problems(task, text) == []
    build = "services: {main: {build: {context: ., dockerfile: Dockerfile, args: {V: '1'}}}}"
    assert _problems(task, build) == []


@pytest.mark.parametrize(
    "volume",
    [
        "'./data:/data'",
        "'./data:/data:rw'",
        "{type: bind, source: ./data, target: /data}",
        "{type: bind, source: ./data, target: /data, read_only: false}",
        "{type: bind, source: ./data, target: /data, read_only: 'true'}",
    ],
)
def test_a_writable_bind_of_the_tasks_is_refused(task: Path, volume: str) -> None:
    # A container could change the task's files (the selection's, or the worker's copy of them).
    problems = _problems(task, f"services: {{main: {{volumes: [{volume}]}}}}")
    assert problems == ["service main: bind mount of './data' is writable; mark it read-only "
                        "('read_only: true', or ':ro' in the short syntax)"]  # fmt: skip


def test_read_only_binds_of_the_tasks_pass(task: Path) -> None:
    for volume in ("'./data:/data:ro'", "{type: bind, source: ./data, target: /data, read_only: true}"):
        assert _problems(task, f"services: {{main: {{volumes: [{volume}]}}}}") == []


def test_a_rendered_writable_bind_of_the_task_is_refused_but_the_trials_own_may_be_written(
    task: Path, tmp_path: Path
) -> None:
    trial = tmp_path / "trial"
    model = _rendered(task, trial)
    data = model["services"]["main"]["volumes"][0]
    assert data["read_only"] is True and _rendered_problems(task, trial, model) == []
    data.pop("read_only")
    (problem,) = _rendered_problems(task, trial, model)
    assert "bind mount of" in problem and "environment/data' is writable" in problem


def test_every_real_task_passes_the_policy() -> None:
    # Their tests/docker-compose.yaml binds ./grader.py with read_only: true.
    tasks = sorted(REAL_TASKS.glob("task_*"))
    assert len(tasks) == 10
    for task in tasks:
        assert review_task_dir(task).problems == (), task


def test_a_bind_mount_through_a_symlink_is_judged_by_its_target(task: Path) -> None:
    (task / "environment" / "root").symlink_to("/")
    assert any("outside" in p for p in _problems(task, "services: {main: {volumes: ['./root:/h']}}"))


@pytest.mark.parametrize(
    "text",
    [
        # PyYAML keeps the last value, compose refuses the file: the check must not judge another model.
        "services:\n  main:\n    privileged: true\n    privileged: false\n",
        "services:\n  main: {}\nservices:\n  main: {}\n",
        "x-a: &a {pid: host}\nservices:\n  main:\n    <<: *a\n    pid: private\n    pid: private\n",
    ],
)
def test_a_key_given_twice_is_refused(task: Path, text: str) -> None:
    (task / "environment" / "docker-compose.yaml").write_text(text)
    problems = review_task_dir(task).problems
    assert any("not valid YAML" in p or "given twice" in p for p in problems), problems


def test_a_merged_key_may_be_overridden_once(task: Path) -> None:
    text = "x-a: &a {pid: private, init: true}\nservices:\n  main:\n    <<: *a\n    init: false\n"
    (task / "environment" / "docker-compose.yaml").write_text(text)
    assert review_task_dir(task).problems == ()


def test_problems_are_one_line_each(task: Path) -> None:
    problems = _problems(task, 'services: {main: {"evil\\nkey": 1}}')
    assert problems and all("\n" not in p for p in problems)


def test_a_yaml_alias_bomb_is_refused_not_walked(task: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    text = "x-bomb:\n  " + "\n  ".join(lines) + "\nservices: {main: {}}\n"
    assert any("too large" in p for p in _problems(task, text))


# --- the rendered model (`docker compose config --format json`) --------------------------------


def _rendered(task: Path, trial: Path, **main: Any) -> dict[str, Any]:
    """What compose 2.40 printed for a task compose file under Pier's files and the policy's."""
    service: dict[str, Any] = {
        "cap_drop": ["NET_ADMIN", "NET_RAW"],
        "command": ["sh", "-c", "sleep infinity"],
        "entrypoint": None,
        "environment": {"A": "hello"},
        "image": PINNED,
        "labels": {"org.sciencebench.network-role": "agent", "org.sciencebench.owner": "o"},
        "network_mode": "none",
        "stop_signal": "SIGKILL",
        "volumes": [
            {"type": "bind", "source": str(task / "environment" / "data"), "target": "/data",
             "read_only": True, "bind": {"create_host_path": True}},
            {"type": "volume", "source": "cache", "target": "/cache", "volume": {}},
            {"type": "bind", "source": str(trial / "agent"), "target": "/logs/agent"},
        ],
        "deploy": {"resources": {"limits": {"cpus": 1, "memory": "104857600"}}, "placement": {}},
    }  # fmt: skip
    service.update(main)
    return {"name": "t__x", "services": {"main": service}, "volumes": {"cache": {"name": "t__x_cache"}}}


def _rendered_problems(task: Path, trial: Path, model: dict[str, Any]) -> list[str]:
    return compose_problems(
        model, task / "environment", [trial, task], rendered=True, project="t__x", writable_roots=[trial]
    )


def test_a_rendered_model_of_a_confined_task_passes(task: Path, tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    assert _rendered_problems(task, trial, _rendered(task, trial)) == []
    build = {"context": str(task / "environment"), "dockerfile": "Dockerfile", "network": "none"}
    assert _rendered_problems(task, trial, _rendered(task, trial, build=build, pull_policy="build")) == []


def test_a_rendered_model_keeps_the_policys_bounded_logs_and_a_task_sets_none(
    task: Path, tmp_path: Path
) -> None:
    # PID 1's output is a file on the host's disk beside the writable layer: the policy bounds it.
    trial = tmp_path / "trial"
    assert _rendered_problems(task, trial, _rendered(task, trial, logging=POLICY_LOGGING)) == []
    unbounded = {"driver": "json-file", "options": {"max-size": "100g"}}
    problems = _rendered_problems(task, trial, _rendered(task, trial, logging=unbounded))
    assert len(problems) == 1 and "service main: logging" in problems[0], problems
    problems = _problems(task, "services: {main: {image: x, logging: {driver: none}}}")
    assert any("'logging' is not allowed" in p for p in problems), problems


@pytest.mark.parametrize(
    ("network", "says"), [(None, "'default'"), ("host", "'host'"), ("bridge", "'bridge'")]
)
def test_a_rendered_build_must_have_no_network(
    task: Path, tmp_path: Path, network: str | None, says: str
) -> None:
    trial = tmp_path / "trial"
    build = {"context": str(task / "environment"), "dockerfile": "Dockerfile"}
    if network is not None:
        build["network"] = network
    problems = _rendered_problems(task, trial, _rendered(task, trial, build=build))
    assert problems == [f"service main: build network {says} (every build runs with network none)"]


def test_a_task_may_not_choose_its_build_network_even_none(task: Path) -> None:
    # As written, any `network` key of a build is refused: the policy's override sets it.
    for network in ("none", "host", "default"):
        problems = _problems(task, f"services: {{main: {{build: {{context: ., network: {network}}}}}}}")
        assert any("build key 'network'" in p for p in problems), problems


@pytest.mark.parametrize(
    ("main", "says"),
    [
        ({"pid": "host"}, "pid: 'host'"),
        ({"ipc": "host"}, "ipc: 'host'"),
        ({"privileged": True}, "privileged"),
        ({"network_mode": "host"}, "network_mode 'host'"),
        ({"security_opt": ["seccomp=unconfined"]}, "security_opt"),
        ({"volumes": [{"type": "bind", "source": "/", "target": "/h"}]}, "bind mount of '/'"),
        ({"build": {"context": "/", "dockerfile": "Dockerfile"}}, "build context '/'"),
        ({"build": {"context": "https://127.0.0.1:4000/ctx.tar", "dockerfile": "Dockerfile"}}, "not a local"),
        ({"env_file": ["/etc/sciencebench/worker.env"]}, "'env_file'"),
        ({"image": "ubuntu:latest"}, "not pinned"),
    ],
)
def test_a_rendered_model_is_held_to_the_same_allowlist(
    task: Path, tmp_path: Path, main: dict[str, Any], says: str
) -> None:
    trial = tmp_path / "trial"
    problems = _rendered_problems(task, trial, _rendered(task, trial, **main))
    assert any(says in p for p in problems), problems


def test_a_rendered_model_with_another_project_or_network_is_refused(task: Path, tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    model = _rendered(task, trial)
    assert _rendered_problems(task, trial, {**model, "name": "other"}) == ["top-level 'name' is not allowed"]
    networks = {"h": {"name": "host", "external": True}}
    assert _rendered_problems(task, trial, {**model, "networks": networks}) == [
        "top-level 'networks' is not allowed"
    ]
    volumes = {"cache": {"name": "someone_elses"}}
    assert "'name'" in _rendered_problems(task, trial, {**model, "volumes": volumes})[0]


# --- a whole task ------------------------------------------------------------------------------


def test_review_collects_the_variables_a_task_takes_from_the_job(task: Path) -> None:
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace(
            'workdir = "/app/task_001"\n', 'workdir = "/app/task_001"\nenv = { OWN = "1" }\n'
        )
        + '\n[solution.env]\nK = "${GRADER_TOKEN}"\n'
    )
    (task / "environment" / "docker-compose.yaml").write_text(
        "services: {main: {environment: "
        "{A: '${OWN}', B: '${OPENAI_API_KEY}', C: '${HOST_AGENT_LOGS_PATH}'}}}\n"
    )
    review = review_task_dir(task)
    assert review.problems == ()
    assert review.template_variables == {"GRADER_TOKEN"}
    assert review.compose_variables == {"OPENAI_API_KEY"}  # not the task's own, not Pier's


def test_review_counts_every_name_the_compose_process_would_be_given(task: Path) -> None:
    # The policy environment gives `docker compose` every name its files' text interpolates
    # (`interpolation` over the raw text, comments and keys included); a bare `environment`
    # entry then copies that value into the container. So each such name must be declared.
    (task / "environment" / "docker-compose.yaml").write_text(
        "# ${OPERATOR_KEY}\n"
        "services: {main: {environment: [OPERATOR_KEY, '${OPENAI_API_KEY}'], x-k: {'${KEY_NAME}': 1}}}\n"
    )
    review = review_task_dir(task)
    assert review.problems == ()
    assert review.compose_variables == {"OPERATOR_KEY", "OPENAI_API_KEY", "KEY_NAME"}


def test_a_name_only_the_agent_environment_sets_is_declared_for_the_verifiers_compose(tmp_path: Path) -> None:
    # The separate verifier's compose process gets [verifier.environment].env, not [environment].env:
    # there the name would come from Pier's own environment.
    task = make_task(tmp_path, "002", verifier_image=PINNED)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("cpus = 1\n", 'cpus = 1\nenv = { OWN = "1" }\n', 1))
    assert tomllib.loads(toml.read_text())["environment"]["env"] == {"OWN": "1"}
    (task / "tests" / "docker-compose.yaml").write_text("services: {main: {environment: {K: '${OWN}'}}}\n")
    assert review_task_dir(task).compose_variables == {"OWN"}
    # Set by both, it is the task's own either way.
    toml.write_text(
        toml.read_text().replace("[verifier.environment]\n", '[verifier.environment]\nenv = { OWN = "2" }\n')
    )
    assert review_task_dir(task).compose_variables == set()


def test_review_names_env_table_keys_never_values(task: Path) -> None:
    raw = tomllib.loads((task / "task.toml").read_text())
    raw["verifier"]["env"] = {"LD_PRELOAD": "/secret/value.so"}
    (problem,) = review_task(task, raw).problems
    assert problem.startswith("task.toml verifier.env: refused: LD_PRELOAD")
    assert "/secret/value.so" not in problem


def test_a_steps_compose_file_is_reviewed_too(task: Path) -> None:
    step_tests = task / "steps" / "one" / "tests"
    step_tests.mkdir(parents=True)
    (step_tests / "docker-compose.yaml").write_text("services: {main: {pid: host}}\n")
    (problem,) = review_task_dir(task).problems
    assert problem.startswith("steps/one/tests/docker-compose.yaml: refused by the network policy")


def test_a_symlinked_step_tests_dir_is_refused(task: Path, tmp_path: Path) -> None:
    (task / "steps" / "one").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (task / "steps" / "one" / "tests").symlink_to(tmp_path / "elsewhere")
    assert any("steps/one/tests is (inside) a symlink" in p for p in review_task_dir(task).problems)


@pytest.mark.parametrize(
    ("relative", "says"),
    [
        # Pier copies environment/ with shutil.copytree (symlinks followed) into an agent build context.
        ("environment/secret", "environment/secret is a symlink"),
        ("environment/etc", "environment/etc is a symlink"),
        ("environment/Dockerfile", "environment/Dockerfile is a symlink"),
        ("tests/data/x", "tests/data/x is a symlink"),
        ("solution/solve.sh", "solution/solve.sh is a symlink"),
    ],
)
def test_a_symlink_anywhere_in_the_task_is_refused(task: Path, relative: str, says: str) -> None:
    link = task / relative
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to("/etc" if relative.endswith("etc") else "/etc/hostname")
    assert any(says in p for p in review_task_dir(task).problems), review_task_dir(task).problems


def test_a_special_file_anywhere_in_the_task_is_refused(task: Path, tmp_path: Path) -> None:
    (task / "environment" / "data").mkdir(parents=True, exist_ok=True)
    os.mkfifo(task / "environment" / "data" / "fifo")
    problems = review_task_dir(task).problems
    assert any("environment/data/fifo is not a regular file or directory" in p for p in problems), problems


def test_a_hard_linked_file_is_the_tasks_own(task: Path, tmp_path: Path) -> None:
    # A materialized selection may share files by hard link; the submitter can only link files they own.
    os.link(task / "instruction.md", tmp_path / "shared-instruction.md")
    assert review_task_dir(task).problems == ()


@pytest.mark.parametrize(
    "artifacts",
    [
        # Pier writes an artifact to `<trial>/artifacts/<destination>` (or the source's name) on the worker.
        [{"source": "/logs/x", "destination": "../../../../root/.bashrc"}],
        [{"source": "/logs/x", "destination": "/ok/../../../../etc/cron.d/x"}],
        [{"source": "/logs/.."}],
        [{"source": "/logs/x", "destination": 3}],
    ],
)
def test_an_artifact_written_outside_the_trial_is_refused(task: Path, artifacts: list[Any]) -> None:
    raw = tomllib.loads((task / "task.toml").read_text())
    problems = review_task(task, {**raw, "artifacts": artifacts}).problems
    assert any("artifacts" in p for p in problems), problems
    steps = [{"name": "one", "artifacts": artifacts}]
    assert any("steps[0].artifacts" in p for p in review_task(task, {**raw, "steps": steps}).problems)


def test_artifacts_inside_the_trial_pass(task: Path) -> None:
    raw = tomllib.loads((task / "task.toml").read_text())
    artifacts = [
        "/logs/artifacts/model.patch",
        {"source": "/app/out", "destination": "out/app"},
        {"source": "/"},
    ]
    assert review_task(task, {**raw, "artifacts": artifacts}).problems == ()


@pytest.mark.parametrize("name", ["../../../other-job/task_001__x", "/etc", "a/b", "..", ".", "", 3])
def test_a_step_name_that_is_not_one_plain_name_is_refused(task: Path, name: Any) -> None:
    # Pier joins it onto the task's steps/ (tests, solution, instruction it reads and uploads)
    # and the trial's steps/ (where it moves what the containers wrote) without a check.
    raw = tomllib.loads((task / "task.toml").read_text())
    problems = review_task(task, {**raw, "steps": [{"name": "ok"}, {"name": name}]}).problems
    assert any("task.toml steps[1].name" in p for p in problems), problems


def test_plain_step_names_pass(task: Path) -> None:
    raw = tomllib.loads((task / "task.toml").read_text())
    steps = [{"name": "one"}, {"name": "step_2.fix-it"}]
    assert review_task(task, {**raw, "steps": steps}).problems == ()


# --- the task hash -------------------------------------------------------------------------------


def _old_hash(task: Path) -> str:
    digest = hashlib.sha256()
    for name in DEFINING_FILES:
        digest.update(name.encode())
        digest.update((task / name).read_bytes())
    return digest.hexdigest()


def test_a_task_without_compose_files_hashes_as_before(task: Path) -> None:
    assert task_toml_sha256(task) == _old_hash(task)


@pytest.mark.parametrize("relative", ["environment/docker-compose.yaml", "tests/docker-compose.yaml"])
def test_the_hash_covers_compose_files(task: Path, relative: str) -> None:
    before = task_toml_sha256(task)
    compose = task / relative
    compose.write_text("services: {main: {}}\n")
    with_compose = task_toml_sha256(task)
    assert with_compose != before
    compose.write_text("services: {main: {pid: host}}\n")
    assert task_toml_sha256(task) not in (before, with_compose)


@pytest.mark.timeout(10)
def test_reading_a_fifo_or_a_symlink_fails_at_once(task: Path) -> None:
    fifo = task / "tests" / "docker-compose.yaml"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        task_toml_sha256(task)
    fifo.unlink()
    fifo.symlink_to(task / "task.toml")
    with pytest.raises(OSError, match="a symlink"):
        read_regular(fifo)
