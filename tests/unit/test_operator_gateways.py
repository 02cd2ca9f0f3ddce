"""Gateways are the operator's: a job may not point the proxy at the worker's own network.

A gateway whose host is an internal IP literal (loopback, link-local,
private, shared, unique-local, unspecified, multicast, reserved) is refused
at submit and by the worker unless the operator lists it (`worker --gateway`,
`SCIENCEBENCH_GATEWAYS`, `submit --local --gateway`); with a list, a job's
gateway must be one of it (scheme, host and port).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.core.errors import ProfileError, RefusedError, SettingsError
from sciencebench.core.gateways import internal_kind, parse_gateway
from sciencebench.core.paths import JobPaths
from sciencebench.core.settings import Settings
from sciencebench.login.cluster import Cluster
from sciencebench.login.options import SubmitOptions
from sciencebench.login.runrecord import build_run_record
from sciencebench.login.submit import Prepared, persist
from sciencebench.worker.admission import admit
from sciencebench.worker.main import host_kit
from tests.fixtures.hosts import EVERYTHING, PROXY_IMAGE, prepare
from tests.fixtures.selection import make_selection
from tests.unit.test_trust_submit import _submit as submit_cli

pytestmark = pytest.mark.unit

KEY = "sk-operator-gateways-7d1e"

# The reproduction, and one of each range `ipaddress` knows.
INTERNAL = [
    "https://172.17.0.1:2375/v1",  # the worker's Docker port on the default bridge
    "http://169.254.169.254:80/v1",  # cloud metadata
    "https://10.0.0.5:6379",  # the LAN's Redis
    "http://127.0.0.1:4000/v1",
    "http://192.168.1.10:4000/v1",
    "http://100.64.0.1:4000/v1",  # shared address space
    "http://0.0.0.0:4000/v1",
    "http://224.0.0.1:4000/v1",
    "http://240.0.0.1:4000/v1",
    "http://[fd00::5]:4000/v1",
    "http://[::1]:4000/v1",
    "http://[fe80::1]:4000/v1",
    "http://2130706433:4000/v1",  # 127.0.0.1 written as one number
    "http://0x7f.1:4000/v1",  # and in hex
]


def _cluster(*allowed: str) -> Cluster:
    kit = EVERYTHING.model_copy(update={"gateways": allowed})
    return Cluster(kits={"w1": kit}, where="live worker hosts")


def _prepare(tmp_path: Path, url: str, cluster: Cluster) -> Prepared:
    selection = make_selection(tmp_path / "sel", ["001"])
    env_file = tmp_path / "provider.env"
    env_file.write_text(f"OPENAI_API_KEY={KEY}\nOPENAI_BASE_URL={url}\n")
    opts = SubmitOptions(path=selection, agent="mini-swe-agent", models=["openai/m"], env_file=env_file,
                         jobs_dir=tmp_path / "jobs", job_name="g")  # fmt: skip
    return prepare(opts, cluster=cluster, local=cluster.local)


@pytest.mark.parametrize("url", INTERNAL)
def test_an_internal_address_is_named_by_kind(url: str) -> None:
    assert internal_kind(parse_gateway(url, "X").host) is not None


@pytest.mark.parametrize("host", ["gw.example.edu", "github.com", "8.8.8.8", "2001:4860::8888", "localhost"])
def test_a_name_or_a_public_address_is_not_internal(host: str) -> None:
    # A name is checked where it resolves, which is not here.
    assert internal_kind(host) is None


@pytest.mark.parametrize("url", INTERNAL)
def test_an_internal_gateway_is_refused_at_submit_naming_how_to_allow_it(tmp_path: Path, url: str) -> None:
    gateway = parse_gateway(url, "X")
    with pytest.raises(ProfileError) as caught:
        _prepare(tmp_path, url, _cluster())
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"gateway {gateway.url}: ")
    assert f"sciencebench worker --gateway {gateway.origin}" in message and "SCIENCEBENCH_GATEWAYS" in message
    assert KEY not in message


def test_a_public_gateway_needs_no_list(tmp_path: Path) -> None:
    prepared = _prepare(tmp_path, "https://gw.example.edu/v1", _cluster())
    assert [g.url for g in prepared.job.agent.gateways] == ["https://gw.example.edu:443/v1"]


def test_a_listed_gateway_is_allowed_by_scheme_host_and_port(tmp_path: Path) -> None:
    cluster = _cluster("http://10.0.0.5:4000")
    _prepare(tmp_path / "a", "http://10.0.0.5:4000/v1", cluster)  # any path under the listed origin
    refused = r"\(allowed: http://10.0.0.5:4000\); no live worker host allows it"
    for n, url in enumerate(
        ["https://10.0.0.5:4000/v1", "http://10.0.0.5:4001/v1", "https://gw.example.edu/v1"]
    ):
        with pytest.raises(ProfileError, match=refused):  # another scheme, another port, another host
            _prepare(tmp_path / str(n), url, cluster)


def test_one_host_that_allows_the_gateway_is_enough(tmp_path: Path) -> None:
    listed = EVERYTHING.model_copy(update={"gateways": ("http://10.0.0.5:4000",)})
    cluster = Cluster(kits={"w1": EVERYTHING, "w2": listed}, where="live worker hosts")
    _prepare(tmp_path / "a", "http://10.0.0.5:4000/v1", cluster)
    _prepare(tmp_path / "b", "https://gw.example.edu/v1", cluster)


def test_the_cli_refuses_an_internal_gateway_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    env_file = tmp_path / "provider.env"
    env_file.write_text(f"OPENAI_API_KEY={KEY}\nOPENAI_BASE_URL=https://172.17.0.1:2375/v1\n")
    args = ["--agent", "mini-swe-agent", "--model", "openai/m", "--env-file", str(env_file), "--local"]
    result = submit_cli(tmp_path, selection, *args)
    assert result.exit_code == 2, result.output
    assert "gateway https://172.17.0.1:2375/v1: a private address" in result.stderr
    assert "--gateway https://172.17.0.1:2375" in result.stderr


def test_submit_local_gateway_allows_it_and_a_broker_submit_refuses_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCIENCEBENCH_PROXY_IMAGE", PROXY_IMAGE)
    selection = make_selection(tmp_path / "sel", ["001"])
    env_file = tmp_path / "provider.env"
    env_file.write_text(f"OPENAI_API_KEY={KEY}\nOPENAI_BASE_URL=http://10.0.0.5:4000/v1\n")
    args = ["--agent", "mini-swe-agent", "--model", "openai/m", "--env-file", str(env_file)]
    allow = ("--gateway", "http://10.0.0.5:4000")
    local = submit_cli(tmp_path, selection, *args, "--local", "--skip-pull", "--dry-run", *allow)
    assert local.exit_code == 0, local.stderr
    broker = submit_cli(tmp_path / "b", selection, *args, *allow)
    assert broker.exit_code == 2
    assert "--gateway applies to --local only" in broker.stderr
    assert "sciencebench worker --gateway" in broker.stderr


def test_the_gateways_setting_is_comma_or_space_separated_and_reported_in_the_kit() -> None:
    listed = "http://10.0.0.5:4000/v1, https://gw.example.edu \tHTTP://[fd00::1]:81"
    settings = Settings.from_env({"SCIENCEBENCH_GATEWAYS": listed})
    origins = ("http://10.0.0.5:4000", "https://gw.example.edu:443", "http://[fd00::1]:81")
    assert tuple(g.origin for g in settings.gateways) == origins
    assert host_kit(settings).gateways == origins
    with pytest.raises(SettingsError, match=r"^SCIENCEBENCH_GATEWAYS: "):
        Settings.from_env({"SCIENCEBENCH_GATEWAYS": "ftp://gw.example.edu"})


def test_the_worker_refuses_an_internal_gateway_in_job_json_unless_listed(tmp_path: Path) -> None:
    # job.json is untrusted: whoever writes the shared filesystem could point the proxy anywhere.
    listed = "http://10.0.0.5:4000"
    prepared = _prepare(tmp_path, "https://gw.example.edu/v1", _cluster())
    done = persist(prepared, build_run_record(prepared.job, prepared.trials[0], "redis://x", []))
    roots = {"jobs_roots": (tmp_path / "jobs",), "selection_roots": (tmp_path / "sel",),
             "env_file_roots": (tmp_path,)}  # fmt: skip
    settings = Settings(**roots)
    admit(done.trials[0], settings)
    job_json = JobPaths(done.job.jobs_dir, done.job.job_name).job_spec
    data = json.loads(job_json.read_text())
    data["agent"]["gateways"] = [{"scheme": "http", "host": "10.0.0.5", "port": 4000, "path": "/v1"}]
    job_json.write_text(json.dumps(data))
    with pytest.raises(RefusedError) as caught:
        admit(done.trials[0], settings)
    assert "gateway http://10.0.0.5:4000/v1: a private address" in str(caught.value)
    assert f"sciencebench worker --gateway {listed}" in str(caught.value)
    admit(done.trials[0], Settings(**roots, gateways=(parse_gateway(listed, "X"),)))
    # With a list, anything else is refused, a public gateway too.
    other = Settings(**roots, gateways=(parse_gateway("http://10.0.0.5:4001", "X"),))
    with pytest.raises(RefusedError, match=r"a private address \(allowed: http://10.0.0.5:4001\)"):
        admit(done.trials[0], other)
    data["agent"]["gateways"] = [{"scheme": "https", "host": "gw.example.edu", "port": 443, "path": "/v1"}]
    job_json.write_text(json.dumps(data))
    admit(done.trials[0], settings)
    with pytest.raises(RefusedError, match="not one of the allowed gateways"):
        admit(done.trials[0], other)


def test_worker_gateway_options_are_the_hosts_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from sciencebench.worker import main as worker_main

    seen: list[Settings] = []
    monkeypatch.setattr(worker_main, "run_worker", lambda **kw: seen.append(kw["settings"]))
    monkeypatch.setenv("SCIENCEBENCH_PROXY_IMAGE", PROXY_IMAGE)
    monkeypatch.setenv("SCIENCEBENCH_GATEWAYS", "https://replaced.example.edu")
    args = ["worker", "--jobs-root", "/srv/jobs", "--selection-root", "/srv/sel",
            "--gateway", "http://10.0.0.5:4000/v1", "--gateway", "https://gw.example.edu:8443"]  # fmt: skip
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    assert host_kit(seen[0]).gateways == ("http://10.0.0.5:4000", "https://gw.example.edu:8443")
    bad = CliRunner().invoke(cli.main, [*args, "--gateway", "ftp://x"])
    assert bad.exit_code == 2 and "--gateway: only http:// and https:// gateways" in bad.stderr
