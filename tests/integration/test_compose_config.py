"""The compose files validate with compose/example.env and say what the docs promise.

`docker compose config` needs no Engine: it only parses, interpolates and
validates. The docker CLI and compose v2 plugin come from the test host's
setup (PATH and DOCKER_CONFIG from $SB_STATE/env.sh).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.services import REPO

pytestmark = pytest.mark.integration

COMPOSE_DIR = REPO / "compose"
EXAMPLE_ENV = COMPOSE_DIR / "example.env"
COMPOSE_FILES = ["build.yml", "control-plane.yml", "worker-host.yml", "worker-joins-control-plane.yml",
                 "control-plane-tls.yml", "worker-host-tls.yml"]  # fmt: skip
# Each override and the file it is valid on top of.
OVERRIDES = {"worker-joins-control-plane.yml": "worker-host.yml", "worker-host-tls.yml": "worker-host.yml",
             "control-plane-tls.yml": "control-plane.yml"}  # fmt: skip
BUCKETS_FLAG = "--task_runtime_metric_buckets=1,10,60,600,3600,7200,inf"
_REFERENCE = re.compile(r"\$\{([A-Z][A-Z0-9_]*)")
_ASSIGNMENT = re.compile(r"^([A-Z][A-Z0-9_]*)=", re.MULTILINE)


def _clean_env() -> dict[str, str]:
    """This process's environment minus anything that would override example.env.

    Compose lets the shell environment win over --env-file, so a stray
    SCIENCEBENCH_* variable would make the test check something else.
    """
    return {k: v for k, v in os.environ.items() if not k.startswith(("SCIENCEBENCH_", "FLOWER_", "COMPOSE_"))}


def _compose(file: str, *args: str, env_file: Path = EXAMPLE_ENV) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE_DIR / file), "--env-file", str(env_file), *args],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _compose_many(files: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    names = [arg for file in files for arg in ("-f", str(COMPOSE_DIR / file))]
    return subprocess.run(
        ["docker", "compose", *names, "--env-file", str(EXAMPLE_ENV), *args],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _rendered(file: str) -> dict[str, Any]:
    done = _compose(file, "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


@pytest.fixture(scope="module", autouse=True)
def _compose_available() -> None:
    done = subprocess.run(["docker", "compose", "version", "--short"], env=_clean_env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, (
        "docker compose v2 is unavailable: source $SB_STATE/env.sh (scripts/host-setup.sh) first; "
        + done.stderr
    )


def _compose_files(file: str) -> list[str]:
    """An override is only valid on top of the file it overrides."""
    return [OVERRIDES[file], file] if file in OVERRIDES else [file]


@pytest.mark.parametrize("file", COMPOSE_FILES)
def test_compose_file_validates_with_example_env(file: str) -> None:
    done = _compose_many(_compose_files(file), "config", "-q")
    assert done.returncode == 0, done.stderr
    # Compose warns on stderr about unset variables and obsolete keys.
    assert done.stderr.strip() == ""


def test_example_env_documents_exactly_the_variables_used() -> None:
    used = set()
    for file in COMPOSE_FILES:
        used |= set(_REFERENCE.findall((COMPOSE_DIR / file).read_text()))
    documented = set(_ASSIGNMENT.findall(EXAMPLE_ENV.read_text()))
    assert used - documented == set(), "used in compose/ but not in example.env"
    assert documented - used == set(), "in example.env but used by no compose file"


@pytest.mark.parametrize(
    ("file", "variable"),
    [
        ("control-plane.yml", "SCIENCEBENCH_REDIS_PASSWORD"),
        ("control-plane.yml", "SCIENCEBENCH_FLOWER_PASSWORD"),
        ("worker-host.yml", "SCIENCEBENCH_BROKER_URL"),
        ("worker-host.yml", "SCIENCEBENCH_JOBS_DIR"),
        ("build.yml", "SCIENCEBENCH_BASE_IMAGE"),
        ("build.yml", "SCIENCEBENCH_BUILD_INPUTS"),
    ],
)
def test_required_variables_are_enforced(tmp_path: Path, file: str, variable: str) -> None:
    lines = [line for line in EXAMPLE_ENV.read_text().splitlines() if not line.startswith(f"{variable}=")]
    env_file = tmp_path / "partial.env"
    env_file.write_text("\n".join(lines) + "\n")
    done = _compose(file, "config", "-q", env_file=env_file)
    assert done.returncode != 0
    assert variable in done.stderr


def test_control_plane_is_loopback_durable_and_keeps_secrets_out_of_argv() -> None:
    services = _rendered("control-plane.yml")["services"]
    redis, flower = services["redis"], services["flower"]
    for service in (redis, flower):
        assert [port["host_ip"] for port in service["ports"]] == ["127.0.0.1"]

    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert "--requirepass" in command
    assert any(volume["target"] == "/data" and volume["type"] == "volume" for volume in redis["volumes"])

    assert BUCKETS_FLAG in flower["command"]
    assert "flower" in flower["command"]
    environment = flower["environment"]
    user, _, password = environment["FLOWER_BASIC_AUTH"].partition(":")
    assert user and password
    flower_argv = " ".join(flower["command"])
    assert password not in flower_argv and "basic" not in flower_argv
    assert environment["SCIENCEBENCH_BROKER_URL"].startswith("redis://:")
    assert environment["SCIENCEBENCH_BROKER_URL"].endswith("@redis:6379/0")
    assert environment["FLOWER_READ_ONLY"] == "true"


def test_worker_mounts_shared_paths_at_the_same_path() -> None:
    worker = _rendered("worker-host.yml")["services"]["worker"]
    env = worker["environment"]
    mounts = {volume["target"]: volume for volume in worker["volumes"]}

    assert "/var/run/docker.sock" in mounts
    jobs = mounts[env["SCIENCEBENCH_JOBS_DIR"]]
    assert jobs["source"] == jobs["target"] and not jobs.get("read_only", False)
    for shared in ("/shared/sciencebench/selections", "/shared/sciencebench/profiles"):
        assert mounts[shared]["source"] == shared and mounts[shared]["read_only"] is True

    assert worker["init"] is True
    assert worker["platform"] == "linux/amd64"
    assert worker["hostname"] == env["SCIENCEBENCH_HOSTNAME"]
    # The entrypoint drops from root to this account (and the socket's group) itself.
    assert "user" not in worker and "group_add" not in worker
    assert (env["SCIENCEBENCH_UID"], env["SCIENCEBENCH_GID"]) == ("1000", "1000")
    # An empty SCIENCEBENCH_RESULT_BACKEND falls back to the broker, never to "".
    assert env["SCIENCEBENCH_RESULT_BACKEND"] == env["SCIENCEBENCH_BROKER_URL"]
    assert worker["image"] == "sciencebench-worker:local" and "build" not in worker
    # The roots this worker serves are exactly what it mounts.
    assert env["SCIENCEBENCH_JOBS_ROOTS"] == env["SCIENCEBENCH_JOBS_DIR"]
    assert env["SCIENCEBENCH_SELECTION_ROOTS"] == "/shared/sciencebench/selections"
    assert env["SCIENCEBENCH_ENV_FILE_ROOTS"] == "/shared/sciencebench/profiles"


def test_every_image_builds_without_network_from_the_offline_inputs() -> None:
    services = _rendered("build.yml")["services"]
    assert sorted(services) == ["flower", "proxy", "worker"]
    for name, service in services.items():
        assert service["build"]["network"] == "none", name
    for name in ("worker", "flower"):
        build = services[name]["build"]
        assert build["additional_contexts"] == {"inputs": "/srv/sciencebench/build-inputs"}
        assert build["args"]["BASE_IMAGE"].startswith("registry.example.internal/sciencebench/python")
    assert services["worker"]["build"]["dockerfile"] == "workers/Dockerfile"
    assert services["flower"]["build"]["dockerfile"] == "compose/flower.Dockerfile"


def test_the_override_puts_the_worker_on_the_control_plane_network() -> None:
    done = _compose_many(["worker-host.yml", "worker-joins-control-plane.yml"], "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    rendered = json.loads(done.stdout)
    assert list(rendered["services"]["worker"]["networks"]) == ["control-plane"]
    network = rendered["networks"]["control-plane"]
    assert network["external"] is True and network["name"] == "sciencebench-control-plane_default"


def test_the_policy_pids_limit_merges_with_piers_resource_limits(tmp_path: Path) -> None:
    # Every released task asks for cpus and memory, which Pier writes as deploy.resources.limits; the
    # policy's pids limit must merge with them (compose refused a distinct pids_limit: every trial failed).
    from pier.environments.docker import write_resources_compose_file

    from sciencebench.core.settings import DEFAULT_PIDS_LIMIT
    from sciencebench.network.compose import policy_compose

    base = tmp_path / "docker-compose.yaml"
    base.write_text("services:\n  main:\n    image: busybox\n")
    resources = write_resources_compose_file(tmp_path / "resources.json", cpu_limit=2, memory_limit_mb=8192)
    task = tmp_path / "task.yaml"  # a task that asks for no limit on processes at all
    task.write_text("services:\n  main:\n    pids_limit: -1\n")
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(policy_compose("none")))
    files = [arg for path in (base, resources, task, policy) for arg in ("-f", str(path))]
    done = subprocess.run(["docker", "compose", *files, "config", "--format", "json"], cwd=tmp_path,
                          env=_clean_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    main = json.loads(done.stdout)["services"]["main"]
    assert main["pids_limit"] == DEFAULT_PIDS_LIMIT, main
    assert main["deploy"]["resources"]["limits"]["pids"] == DEFAULT_PIDS_LIMIT, main
    assert main["deploy"]["resources"]["limits"]["cpus"] == 2.0, main


def test_the_tls_overrides_speak_tls_only_and_log_each_role_in() -> None:
    done = _compose_many(["control-plane.yml", "control-plane-tls.yml"], "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    redis, flower = services["redis"], services["flower"]
    command = redis["command"]
    assert command[command.index("--port") + 1] == "0"  # no plain-text port at all
    assert command[command.index("--tls-port") + 1] == "6379"
    assert command[command.index("--tls-auth-clients") + 1] == "yes"
    assert command[command.index("--aclfile") + 1] == "/run/sciencebench/redis-users.acl"
    assert "--requirepass" not in command and "REDISCLI_AUTH" not in redis.get("environment", {})
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert "--tls" in redis["healthcheck"]["test"][1]
    assert flower["environment"]["SCIENCEBENCH_BROKER_URL"].startswith("rediss://flower:")
    for service in (redis, flower):
        tls = next(v for v in service["volumes"] if v["target"] == "/run/sciencebench/tls")
        assert tls["read_only"] is True and tls["source"] == "/etc/sciencebench/broker-tls"

    done = _compose_many(["worker-host.yml", "worker-host-tls.yml"], "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    worker = json.loads(done.stdout)["services"]["worker"]
    env = worker["environment"]
    assert env["SCIENCEBENCH_BROKER_CA"] == "/run/sciencebench/tls/ca.crt"
    assert (env["SCIENCEBENCH_BROKER_CERT"], env["SCIENCEBENCH_BROKER_KEY"]) == (
        "/run/sciencebench/tls/client.crt", "/run/sciencebench/tls/client.key")  # fmt: skip
    tls = next(v for v in worker["volumes"] if v["target"] == "/run/sciencebench/tls")
    assert tls["read_only"] is True and tls["source"] == "/etc/sciencebench/worker-tls"


def test_the_mirror_is_an_optional_loopback_pull_through_cache() -> None:
    assert "mirror" not in _rendered("control-plane.yml")["services"]  # only with its profile
    done = _compose("control-plane.yml", "--profile", "mirror", "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    mirror = json.loads(done.stdout)["services"]["mirror"]
    assert mirror["profiles"] == ["mirror"] and mirror["image"] == "registry:2"
    assert [port["host_ip"] for port in mirror["ports"]] == ["127.0.0.1"]
    assert mirror["environment"] == {
        "REGISTRY_PROXY_REMOTEURL": "https://registry-1.docker.io",
        "REGISTRY_HTTP_ADDR": ":5000",
        "REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY": "/var/lib/registry",
    }
    (volume,) = mirror["volumes"]
    assert volume["type"] == "volume" and volume["target"] == "/var/lib/registry"


def test_every_worker_setting_reaches_the_containerized_worker(tmp_path: Path) -> None:
    """Each `sciencebench worker` option's variable is passed into the worker's container, with its value."""
    import re

    from sciencebench.cli.hosts import worker as worker_command

    named = {name for param in worker_command.params for name in re.findall(
        r"env: (SCIENCEBENCH_[A-Z_]+)", getattr(param, "help", "") or "")}  # fmt: skip
    assert {"SCIENCEBENCH_GATEWAYS", "SCIENCEBENCH_PIER_MEMORY", "SCIENCEBENCH_HOST_ADDRESSES"} <= named
    values = {"SCIENCEBENCH_GATEWAYS": "https://gw.example:443", "SCIENCEBENCH_HOST_ADDRESSES": "203.0.113.7",
              "SCIENCEBENCH_PIDS_LIMIT": "512", "SCIENCEBENCH_PIER_MEMORY": "2G"}  # fmt: skip
    env_file = tmp_path / "worker.env"
    env_file.write_text(EXAMPLE_ENV.read_text() + "".join(f"{k}={v}\n" for k, v in values.items()))
    done = _compose("worker-host.yml", "config", "--format", "json", env_file=env_file)
    assert done.returncode == 0, done.stderr
    environment = json.loads(done.stdout)["services"]["worker"]["environment"]
    assert sorted(named - set(environment)) == []
    assert {k: environment[k] for k in values} == values
