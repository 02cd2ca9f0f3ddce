"""The offline network policy on a real Engine: what an agent container can and cannot reach.

One IsolatedDockerEnvironment trial in egress mode (a harness allowlist
naming a provider default and the gateway, plus the gateway on port 4000) is
started; fixture servers join only networks this test created (the trial's
egress network and an IPv6 test network):

    provider   api.openai.com:80     HTTP fixture ("provider"), the harness's provider
                                     default: the configured gateway replaces it
    source     github.com:80, :4000  HTTP fixture ("source"), a denied source host
    gateway    gw:4000               HTTP fixture ("gateway")
    resolver   udp/53                a DNS responder answering every A query
    host       <egress gateway>:port HTTP server in this test process, on the host side

A control container on the egress network proves every fixture answers, so a
failure seen from the agent is the policy, not a dead fixture. No traffic
goes anywhere but loopback and these networks: names the agent uses either
go through the proxy (which resolves them to the fixtures' aliases) or are
pinned with `curl --resolve`.
"""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports Pier

import http.server
import json
import shlex
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pier.models.agent.network import NetworkAllowlist
from pier.models.task.config import EnvironmentConfig
from pier.models.trial.paths import TrialPaths

from sciencebench.network.environment import IsolatedDockerEnvironment

pytestmark = pytest.mark.docker

# `-b ::` listens on IPv4 and IPv6 (the provider is also on the IPv6 test network).
HTTP_FIXTURE = (
    "mkdir -p /srv && echo {name} > /srv/index.html && exec python3 -m http.server {port} -b :: -d /srv"
)
TWO_PORT_FIXTURE = (
    "mkdir -p /srv && echo {name} > /srv/index.html && "
    "(python3 -m http.server 80 -d /srv &) && exec python3 -m http.server 4000 -d /srv"
)
# A DNS responder: echoes the question and answers A 192.0.2.53 (a documentation
# address, never contacted: it is only data in the reply).
DNS_FIXTURE = r"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 53))
while True:
    q, peer = s.recvfrom(512)
    end = 12
    while q[end]:
        end += q[end] + 1
    question = q[12:end + 5]
    answer = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + bytes([192, 0, 2, 53])
    s.sendto(q[:2] + b"\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00" + question + answer, peer)
"""
CONNECT_FAILURES = (7, 28)  # curl: couldn't connect / timed out


def docker(*args: str, check: bool = True) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def ip_of(container: str, network: str, family: str = "IPAddress") -> str:
    fmt = f"{{{{(index .NetworkSettings.Networks {json.dumps(network)}).{family}}}}}"
    return docker("inspect", "-f", fmt, container)


@dataclass
class Result:
    code: int
    out: str


@dataclass
class Lab:
    env: IsolatedDockerEnvironment
    tag: str
    egress_network: str
    v6_network: str
    provider_ip: str
    provider_v6: str
    source_ip: str
    resolver_ip: str
    host_url: str
    control: str

    def agent(self, command: str, *, proxy: bool = True) -> Result:
        """Run `command` in the agent container as an agent command runs (proxy env set)."""
        env = self.env.agent_process_env(None) if proxy else None
        result = asyncio.run(self.env.exec(command, env=env, timeout_sec=60))
        return Result(result.return_code, (result.stdout or "") + (result.stderr or ""))

    def from_control(self, command: str) -> Result:
        proc = subprocess.run(
            ["docker", "exec", self.control, "bash", "-c", command],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return Result(proc.returncode, proc.stdout + proc.stderr)

    def curl(self, args: str, *, proxy: bool = True) -> Result:
        """curl printing only the HTTP status; the exit code tells connection failures apart."""
        return self.agent(f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' {args}", proxy=proxy)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, base_image: str) -> Iterator[Lab]:
    squid_image = os.environ.get("SB_SQUID_IMAGE")
    if not squid_image:
        raise RuntimeError("SB_SQUID_IMAGE is unset: run the tests through scripts/test.sh")
    root = tmp_path_factory.mktemp("policy-e2e")
    tag = f"sbnet-{uuid.uuid4().hex[:8]}"
    env_dir = root / "environment"
    env_dir.mkdir()
    (env_dir / "Dockerfile").write_text(f"FROM {base_image}\n")
    trial_paths = TrialPaths(trial_dir=root / "trial")
    trial_paths.mkdir()  # type: ignore[no-untyped-call]
    env = IsolatedDockerEnvironment(
        environment_dir=env_dir,
        environment_name="policy-e2e",
        session_id=tag,
        trial_paths=trial_paths,
        task_env_config=EnvironmentConfig(docker_image=base_image, allow_internet=False),
        network_allowlist=NetworkAllowlist(domains=["api.openai.com", "gw"]),
        inference_urls=["http://gw:4000/v1"],
        proxy_image=squid_image,
    )
    containers: list[str] = []
    v6_network = f"{tag}-v6"
    server: http.server.ThreadingHTTPServer | None = None
    try:
        asyncio.run(env.start(force_build=False))
        egress = f"{env.compose_project}_sb-egress"
        docker("network", "create", "--ipv6", "--label", f"sciencebench.test={tag}", v6_network)

        def run(name: str, command: list[str], *aliases: str) -> str:
            full = f"{tag}-{name}"
            alias_args = [a for alias in aliases for a in ("--network-alias", alias)]
            docker("run", "-d", "--name", full, "--label", f"sciencebench.test={tag}", "--network", egress,
                   *alias_args, base_image, *command)  # fmt: skip
            containers.append(full)
            return full

        provider = run(
            "provider", ["bash", "-c", HTTP_FIXTURE.format(name="provider", port=80)], "api.openai.com"
        )
        docker("network", "connect", v6_network, provider)
        source = run("source", ["bash", "-c", TWO_PORT_FIXTURE.format(name="source")], "github.com")
        run("gateway", ["bash", "-c", HTTP_FIXTURE.format(name="gateway", port=4000)], "gw")
        resolver = run("resolver", ["python3", "-c", DNS_FIXTURE])
        control = run("control", ["sleep", "infinity"])
        docker("network", "connect", v6_network, control)

        # The host side of the egress network: its gateway address, on a test-owned network.
        host_ip = docker("network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", egress)
        server = http.server.ThreadingHTTPServer((host_ip, 0), _QuietHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()

        lab = Lab(
            env=env,
            tag=tag,
            egress_network=egress,
            v6_network=v6_network,
            provider_ip=ip_of(provider, egress),
            provider_v6=ip_of(provider, v6_network, "GlobalIPv6Address"),
            source_ip=ip_of(source, egress),
            resolver_ip=ip_of(resolver, egress),
            host_url=f"http://{host_ip}:{server.server_address[1]}/",
            control=control,
        )
        ready = lab.from_control(
            "for i in $(seq 50); do curl -sf -m 1 http://api.openai.com/ >/dev/null && "
            "curl -sf -m 1 http://github.com:4000/ >/dev/null && curl -sf -m 1 http://gw:4000/ >/dev/null && "
            "exit 0; sleep 0.2; done; exit 1"
        )
        assert ready.code == 0, f"fixtures did not come up: {ready.out}"
        yield lab
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        for name in containers:
            docker("rm", "-f", name, check=False)
        asyncio.run(env.stop(delete=False))
        docker("network", "rm", v6_network, check=False)


# --- the fixtures answer where the policy does not apply ---------------------------


def test_control_container_reaches_every_fixture_directly(lab: Lab) -> None:
    assert lab.from_control(f"curl -sf -m 5 http://{lab.provider_ip}/").out.strip() == "provider"
    assert lab.from_control(f"curl -sf -m 5 http://{lab.source_ip}/").out.strip() == "source"
    assert lab.from_control("curl -sf -m 5 http://gw:4000/").out.strip() == "gateway"
    assert lab.from_control(f"curl -sf -m 5 -g 'http://[{lab.provider_v6}]/'").out.strip() == "provider"
    assert lab.from_control(f"dig +short +time=2 +tries=1 @{lab.resolver_ip} example.test").out.strip() == (
        "192.0.2.53"
    )
    assert lab.from_control(f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' {lab.host_url}").out == "200"


def test_policy_record_was_written(lab: Lab) -> None:
    record = json.loads(lab.env.policy_record_path.read_text())
    assert record["network_mode"] == "isolated-allowlist"
    assert record["internal_network"] == f"{lab.env.compose_project}_sb-internal"
    assert record["gateway_authorities"] == ["gw:4000"]
    assert record["host_gateway"] is None and record["proxy_forwarding"] is False


# --- through the proxy -------------------------------------------------------------


def test_harness_provider_default_is_refused_when_a_gateway_is_configured(lab: Lab) -> None:
    # The harness's allowlist names api.openai.com; with a gateway the proxy allows the gateway only.
    result = lab.curl("http://api.openai.com/")
    assert (result.code, result.out) == (0, "403")


def test_allowed_gateway_on_its_nonstandard_port(lab: Lab) -> None:
    result = lab.agent("curl -sS -m 5 http://gw:4000/")
    assert (result.code, result.out.strip()) == (0, "gateway")


@pytest.mark.parametrize("url", ["http://github.com/", "http://github.com:4000/"])
def test_source_host_is_refused_on_80_and_on_the_gateway_port(lab: Lab, url: str) -> None:
    result = lab.curl(url)
    assert (result.code, result.out) == (0, "403")


def test_provider_on_the_gateway_port_is_refused(lab: Lab) -> None:
    # 4000 is open for gw only.
    assert lab.curl("http://api.openai.com:4000/").out == "403"


def test_gateway_host_on_a_standard_port_is_refused(lab: Lab) -> None:
    # The gateway host gets exactly its own port, though the harness's allowlist names it.
    assert lab.curl("http://gw/").out == "403"


def test_ip_literal_through_the_proxy_is_refused(lab: Lab) -> None:
    # dstdomain -n: no reverse lookup can turn an IP into an allowed name.
    assert lab.curl(f"http://{lab.provider_ip}/").out == "403"


@pytest.mark.parametrize("target", ["github.com:443", "gw:4000"])
def test_connect_tunnels_to_denied_hosts_or_plain_http_ports_are_refused(lab: Lab, target: str) -> None:
    host, port = target.split(":")
    result = lab.agent(f"curl -sS -m 5 -p -o /dev/null http://{host}:{port}/")
    assert result.code != 0 and "403" in result.out, result.out


def test_proxy_requires_the_trial_token(lab: Lab) -> None:
    result = lab.curl("--proxy http://sb-egress-proxy:8080 http://gw:4000/", proxy=False)
    assert result.out == "407"


# --- bypass attempts -------------------------------------------------------------------


def assert_no_connection(result: Result) -> None:
    assert result.code in CONNECT_FAILURES, f"expected no connection, got exit {result.code}: {result.out}"


def test_noproxy_flag_cannot_reach_the_provider(lab: Lab) -> None:
    assert_no_connection(
        lab.curl(f"--noproxy '*' --resolve api.openai.com:80:{lab.provider_ip} http://api.openai.com/")
    )


def test_cleared_proxy_variables_cannot_reach_the_provider(lab: Lab) -> None:
    unset = "env -u HTTP_PROXY -u http_proxy -u HTTPS_PROXY -u https_proxy -u ALL_PROXY -u all_proxy"
    assert_no_connection(lab.agent(f"{unset} curl -sS -m 5 http://{lab.provider_ip}/"))


def test_no_proxy_star_cannot_reach_the_provider(lab: Lab) -> None:
    assert_no_connection(lab.agent(f"NO_PROXY='*' no_proxy='*' curl -sS -m 5 http://{lab.provider_ip}/"))


def test_git_with_an_empty_proxy_cannot_reach_the_source_host(lab: Lab) -> None:
    command = (
        "env -u HTTP_PROXY -u http_proxy -u HTTPS_PROXY -u https_proxy "
        f"GIT_HTTP_LOW_SPEED_TIME=5 git -c http.proxy= ls-remote http://{lab.source_ip}/repo.git"
    )
    result = lab.agent(command)
    assert result.code != 0
    assert any(
        s in result.out for s in ("Failed to connect", "Couldn't connect", "unreachable", "timed out")
    ), result.out


@pytest.mark.parametrize("port", [80, 4000])
def test_direct_tcp_to_a_fixture_ip_fails(lab: Lab, port: int) -> None:
    result = lab.agent(f"timeout 5 bash -c {shlex.quote(f'</dev/tcp/{lab.source_ip}/{port}')}")
    assert result.code != 0, result.out


def test_ipv6_attempt_fails(lab: Lab) -> None:
    assert lab.agent("ip -6 -o addr show scope global").out.strip() == ""
    assert_no_connection(lab.curl(f"--noproxy '*' -6 -g 'http://[{lab.provider_v6}]/'"))


def test_dns_query_to_a_reachable_resolver_fails(lab: Lab) -> None:
    result = lab.agent(f"dig +time=2 +tries=1 @{lab.resolver_ip} example.test")
    assert result.code == 9, result.out  # dig: no reply from any server


def test_host_gateway_address_is_unreachable(lab: Lab) -> None:
    assert_no_connection(lab.curl(f"--noproxy '*' {lab.host_url}"))


def test_no_default_route_and_no_docker_socket(lab: Lab) -> None:
    assert "default" not in lab.agent("ip route").out
    assert lab.agent("test -e /var/run/docker.sock").code == 1


def test_agent_cannot_add_a_route_or_open_raw_sockets(lab: Lab) -> None:
    route = lab.agent("ip route add default dev eth0")
    assert route.code != 0 and "Operation not permitted" in route.out, route.out
    raw = lab.agent(
        "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)'"
    )
    assert raw.code != 0 and "PermissionError" in raw.out, raw.out


def test_policy_files_live_in_the_trial_directory(lab: Lab) -> None:
    policy_dir = Path(lab.env.policy_dir)
    assert {p.name for p in policy_dir.iterdir()} == {
        "docker-compose-policy.json",
        "squid.conf",
        "squid.passwd",
    }
