"""The inference proxy resolves nothing it was not told, and opens exactly the gateway's port (real squid).

The pinned squid image runs squid.conf files rendered from real plans
(`plan_egress` -> `render_squid_conf`), each with one line appended by the
test, `dns_nameservers <logging resolver>`, on an internal network this
test creates. On it:

    resolver   udp/53   tests/fixtures/logging_resolver.py: logs every query
                        (with the asking proxy's address) and answers
                        gw.test and provider.test with the gateway's address,
                        NXDOMAIN for everything else
    gateway    80, 443, 4000   one HTTP fixture, the gateway at an IP literal or
                        at gw.test, and the plain provider provider.test
    client     curl, sending every request through one proxy at a time
    proxies    ip       gateway http://<gateway IP>:4000/v1
               name     gateway http://gw.test:4000/v1 (Pier's allowlist adds provider.test)
               tls      gateway https://<gateway IP>:4000/v1
               plain    no gateway, allowlist provider.test
               pinned   gateway http://gw.test:4000/v1, pinned by the worker to
                        the decoy's address (compose's extra_hosts, squid's dst)
    decoy      4000     a second HTTP fixture, answering "decoy"

A denied request must cause no DNS query at all: a query for a denied name
carries whatever an agent put into the name to the resolver. Names are
`.test` names only this test's resolver knows; nothing leaves the network.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sciencebench.network.compose import PROXY_SERVICE, ProxyFiles, policy_compose
from sciencebench.network.egress import plan_egress
from sciencebench.network.squid import PROXY_PORT, passwd_line, render_squid_conf

pytestmark = pytest.mark.docker

RESOLVER_SCRIPT = Path(__file__).parents[1] / "fixtures" / "logging_resolver.py"
TOKEN = "proxy-dns-test-token"
# One HTTP server on each of the gateway's ports; /v1/models answers "gateway".
GATEWAY_FIXTURE = (
    "mkdir -p /srv/v1 && echo gateway > /srv/v1/models && cd /srv && "
    "(python3 -m http.server 80 &) && (python3 -m http.server 443 &) && exec python3 -m http.server 4000"
)
# Denied destinations: (label, curl arguments after the proxy; {d} is a fresh label per request).
DENIED_NAMES = [
    ("gateway port", "http://{d}.denied.test:4000/v1/models"),
    ("port 80", "http://{d}.denied.test/"),
    ("CONNECT 443", "-p http://{d}.denied.test:443/"),
    ("port 443 plain", "http://{d}.denied.test:443/"),
    ("random port", "http://{d}.denied.test:8181/"),
    ("CONNECT random port", "-p http://{d}.denied.test:8181/"),
    ("CONNECT gateway port", "-p http://{d}.denied.test:4000/"),
]


def docker(*args: str, check: bool = True) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


@dataclass
class Lab:
    tag: str
    network: str
    log: Path
    gateway_ip: str
    client: str
    proxies: dict[str, str] = field(default_factory=dict)  # name -> proxy IP

    def ip(self, container: str) -> str:
        fmt = f"{{{{(index .NetworkSettings.Networks {json.dumps(self.network)}).IPAddress}}}}"
        return docker("inspect", "-f", fmt, container)

    def requests(self, proxy: str, targets: list[str], *, credentials: bool = True) -> list[str]:
        """Send each request through `proxy` (one `docker exec`); per request 'CONNECT-code HTTP-code'."""
        auth = f"agent:{TOKEN}@" if credentials else ""
        via = f"http://{auth}{self.proxies[proxy]}:{PROXY_PORT}"
        script = "\n".join(
            f"curl -s -m 5 -o /dev/null -w '%{{http_connect}} %{{http_code}}\\n' -x {via} {target}"
            for target in targets
        )
        # A refused CONNECT makes curl exit 56: what counts is the codes it printed.
        out = docker("exec", self.client, "bash", "-c", script + "\ntrue")
        return out.splitlines()

    def body(self, proxy: str, target: str) -> str:
        """What `target` answers through `proxy`."""
        via = f"http://agent:{TOKEN}@{self.proxies[proxy]}:{PROXY_PORT}"
        return docker("exec", self.client, "curl", "-s", "-m", "5", "-x", via, target)

    def queries(self, proxy: str) -> list[str]:
        """Every name the resolver was asked by `proxy` since it started, as 'TYPE name'."""
        time.sleep(1)  # a lookup squid started last has reached the resolver by now
        address = self.proxies[proxy]
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [
            f"{q.get('type', '?')} {q.get('name', q.get('malformed'))}" for q in lines if q["peer"] == address
        ]


def start_proxy(
    lab: Lab, root: Path, name: str, conf: str, resolver_ip: str, image: str, hosts: list[str] | None = None
) -> None:
    directory = root / name
    directory.mkdir()
    (directory / "squid.conf").write_text(conf + f"dns_nameservers {resolver_ip}\n")
    (directory / "squid.passwd").write_text(passwd_line(TOKEN))
    for path in directory.iterdir():
        path.chmod(0o644)  # squid and its auth helper run as `proxy`
    container = f"{lab.tag}-{name}"
    docker("run", "-d", "--name", container, "--label", f"sciencebench.test={lab.tag}",
           "--network", lab.network, *(f"--add-host={entry}" for entry in hosts or []),
           "-v", f"{directory / 'squid.conf'}:/etc/squid/squid.conf:ro",
           "-v", f"{directory / 'squid.passwd'}:/etc/squid/sciencebench.passwd:ro",
           image, "squid", "-N", "-d", "1", "-f", "/etc/squid/squid.conf")  # fmt: skip
    lab.proxies[name] = lab.ip(container)


def wait_listening(container: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        logs = subprocess.run(["docker", "logs", container], capture_output=True, text=True, timeout=30)
        if "Accepting HTTP Socket connections" in logs.stdout + logs.stderr:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{container} did not start: {(logs.stdout + logs.stderr)[-2000:]}")


def conf_for(allowlist: list[str], inference_urls: list[str], image: str, pins: str | None = None) -> str:
    plan = plan_egress(
        allow_internet=False,
        uses_compose=False,
        allowlist_domains=allowlist,
        inference_urls=inference_urls,
        proxy_image=image,
        gateway_pins=pins,
    )
    return render_squid_conf(plan.domains, plan.gateways, dict(plan.pins))


def pinned_hosts(pins: str, image: str) -> list[str]:
    """The proxy's extra hosts as the policy's compose override gives them."""
    plan = plan_egress(
        allow_internet=False, uses_compose=False, allowlist_domains=["gw.test"],
        inference_urls=["http://gw.test:4000/v1"], proxy_image=image, gateway_pins=pins,
    )  # fmt: skip
    proxy = ProxyFiles(image=image, squid_conf="/dev/null", passwd="/dev/null", hosts=plan.pins)
    hosts: list[str] = policy_compose("isolated-allowlist", proxy)["services"][PROXY_SERVICE]["extra_hosts"]
    return hosts


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, base_image: str) -> Iterator[Lab]:
    squid_image = os.environ.get("SB_SQUID_IMAGE")
    if not squid_image:
        raise RuntimeError("SB_SQUID_IMAGE is unset: run the tests through scripts/test.sh")
    root = tmp_path_factory.mktemp("proxy-dns")
    tag = f"sbproxydns-{uuid.uuid4().hex[:8]}"
    label = f"sciencebench.test={tag}"
    (root / "resolver").mkdir()
    (root / "resolver" / "logging_resolver.py").write_text(RESOLVER_SCRIPT.read_text())
    (root / "log").mkdir()
    (root / "log").chmod(0o777)
    containers: list[str] = []

    def run(name: str, *args: str) -> str:
        full = f"{tag}-{name}"
        docker("run", "-d", "--name", full, "--label", label, "--network", tag, *args)
        containers.append(full)
        return full

    docker("network", "create", "--internal", "--label", label, tag)
    try:
        gateway = run("gateway", base_image, "bash", "-c", GATEWAY_FIXTURE)
        decoy = run("decoy", base_image, "bash", "-c", GATEWAY_FIXTURE.replace("echo gateway", "echo decoy"))
        client = run("client", base_image, "sleep", "infinity")
        lab = Lab(tag=tag, network=tag, log=root / "log" / "queries.jsonl", gateway_ip="", client=client)
        lab.gateway_ip = lab.ip(gateway)
        resolver = run(
            "resolver", "-v", f"{root / 'resolver'}:/resolver:ro", "-v", f"{root / 'log'}:/log",
            base_image, "python3", "/resolver/logging_resolver.py", "--log", "/log/queries.jsonl",
            "--answer", f"gw.test={lab.gateway_ip}", "--answer", f"provider.test={lab.gateway_ip}",
        )  # fmt: skip
        resolver_ip = lab.ip(resolver)
        gw = lab.gateway_ip
        confs = {
            # The Codex adapter's allowlist is the gateway host; the worker passes the gateway URL.
            "ip": conf_for([gw], [f"http://{gw}:4000/v1"], squid_image),
            # Pier's own allowlist may name more than the gateway: the plan keeps the gateway only.
            "name": conf_for(["gw.test", "provider.test"], ["http://gw.test:4000/v1"], squid_image),
            "tls": conf_for([gw], [f"https://{gw}:4000/v1"], squid_image),
            "plain": conf_for(["provider.test"], [], squid_image),
        }
        # The worker checked gw.test and pinned it; the resolver now says otherwise (a rebinding).
        pins = json.dumps({"gw.test": lab.ip(decoy)})
        confs["pinned"] = conf_for(["gw.test"], ["http://gw.test:4000/v1"], squid_image, pins)
        hosts = {"pinned": pinned_hosts(pins, squid_image)}
        for name, conf in confs.items():
            start_proxy(lab, root, name, conf, resolver_ip, squid_image, hosts.get(name))
            containers.append(f"{tag}-{name}")
        for name in confs:
            wait_listening(f"{tag}-{name}")
        ready = docker("exec", client, "bash", "-c",
                       f"for i in $(seq 50); do curl -sf -m 1 http://{gw}:4000/v1/models && "
                       f"curl -sf -m 1 http://{gw}/v1/models && curl -sf -m 1 http://{gw}:443/v1/models "
                       "&& exit 0; sleep 0.2; done; exit 1")  # fmt: skip
        assert ready.split() == ["gateway"] * 3, ready
        yield lab
    finally:
        for name in containers:
            docker("rm", "-f", name, check=False)
        docker("network", "rm", tag, check=False)


def denied_targets(prefix: str) -> list[str]:
    return [target.format(d=f"{prefix}{index}") for index, (_, target) in enumerate(DENIED_NAMES)]


def assert_all_refused(codes: list[str], targets: list[str]) -> None:
    # CONNECT refused: "403 000"; a plain request refused: "000 403".
    for code, target in zip(codes, targets, strict=True):
        assert "403" in code.split(), f"{target}: {code}"


# --- an IP-literal gateway: no DNS at all ------------------------------------------------


@pytest.mark.parametrize("credentials", [True, False], ids=["with-credentials", "without"])
def test_ip_literal_gateway_proxy_resolves_no_denied_name(lab: Lab, credentials: bool) -> None:
    targets = denied_targets(f"ip{int(credentials)}-")
    assert_all_refused(lab.requests("ip", targets, credentials=credentials), targets)
    assert lab.queries("ip") == []


def test_ip_literal_gateway_is_reachable_on_exactly_its_port(lab: Lab) -> None:
    gw = lab.gateway_ip
    codes = lab.requests(
        "ip",
        [
            f"http://{gw}:4000/v1/models",
            f"http://{gw}/v1/models",
            f"-p http://{gw}:443/",
            f"-p http://{gw}:4000/",
            f"http://{gw}:443/v1/models",
        ],
    )
    assert codes == ["000 200", "000 403", "403 000", "403 000", "000 403"]
    assert lab.requests("ip", [f"http://{gw}:4000/v1/models"], credentials=False) == ["000 407"]
    assert lab.queries("ip") == []


# --- a hostname gateway: its own name only -------------------------------------------------


def test_hostname_gateway_proxy_queries_only_the_gateway_name(lab: Lab) -> None:
    targets = denied_targets("name-")
    assert_all_refused(lab.requests("name", targets), targets)
    assert_all_refused(lab.requests("name", targets, credentials=False), targets)
    # Pier's allowlist named provider.test too; with a gateway configured it is not allowed.
    others = ["http://provider.test/", "-p http://provider.test:443/", "http://provider.test:4000/v1/models"]
    assert_all_refused(lab.requests("name", others), others)
    own = ["http://gw.test/v1/models", "-p http://gw.test:443/", "-p http://gw.test:4000/"]
    assert_all_refused(lab.requests("name", own), own)
    assert lab.queries("name") == []  # nothing so far was allowed, so nothing was resolved
    assert lab.requests("name", ["http://gw.test:4000/v1/models"]) == ["000 200"]
    queried = lab.queries("name")
    assert queried and {q.split()[1] for q in queried} == {"gw.test"}, queried


# --- an https gateway: CONNECT to its port only ----------------------------------------------


def test_https_gateway_gets_connect_to_its_own_port_only(lab: Lab) -> None:
    gw = lab.gateway_ip
    # curl -p tunnels plain HTTP through CONNECT: the tunnel reaches the fixture.
    codes = lab.requests(
        "tls", [f"-p http://{gw}:4000/v1/models", f"http://{gw}:4000/v1/models", f"-p http://{gw}:443/"]
    )
    assert codes == ["200 200", "000 403", "403 000"]
    assert lab.queries("tls") == []


# --- a plain allowlist domain (no gateway): 80 and 443 as before ------------------------------


def test_plain_allowlist_domain_keeps_80_and_connect_443(lab: Lab) -> None:
    codes = lab.requests(
        "plain",
        [
            "http://provider.test/v1/models",
            "-p http://provider.test:443/v1/models",
            "http://provider.test:4000/v1/models",
            "-p http://provider.test:80/",
        ],
    )
    assert codes == ["000 200", "200 200", "000 403", "403 000"]
    targets = denied_targets("plain-")
    assert_all_refused(lab.requests("plain", targets), targets)
    assert {q.split()[1] for q in lab.queries("plain")} == {"provider.test"}


# --- a pinned gateway name: the address the worker checked, whatever DNS says later -----------


def test_pinned_gateway_name_reaches_only_its_pinned_address(lab: Lab) -> None:
    assert lab.body("name", "http://gw.test:4000/v1/models") == "gateway"  # what DNS says
    assert lab.body("pinned", "http://gw.test:4000/v1/models") == "decoy"  # what the worker checked
    assert lab.queries("pinned") == []  # the hosts file answered: the resolver was never asked
    other_ports = ["-p http://gw.test:4000/", "http://gw.test/v1/models"]
    assert lab.requests("pinned", other_ports) == ["403 000", "000 403"]
    targets = denied_targets("pinned-")
    assert_all_refused(lab.requests("pinned", targets), targets)
    assert lab.queries("pinned") == []
