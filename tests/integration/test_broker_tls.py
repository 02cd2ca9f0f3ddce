"""The broker over TLS with a Redis ACL user per role: a real redis-server, certificates made here.

The server listens on a TLS port only (`--port 0`), asks every client for a
certificate signed by the test's CA, and loads the users of
`coordination.acl` (`--aclfile`). A job runs over rediss:// with the login
node as `login` and the worker as `worker`, and nothing either did was refused
(`ACL LOG`); the login user cannot take a worker's lease.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sciencebench.coordination import acl, connect, scripts
from sciencebench.coordination.keys import ClusterKeys, JobKeys, parking_token
from sciencebench.coordination.protocol import Coordinator, Held
from sciencebench.coordination.registries import first_pull
from sciencebench.core.models import Redispatch, TrialSpec
from sciencebench.core.settings import Settings
from tests.fixtures.flower import Flower
from tests.fixtures.services import VENV_BIN, RedisServer, redis_server_bin, stop_workers
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

PASSWORDS = {
    "login": "login-pw-5e1f",
    "worker": "worker-pw-77ab",
    "flower": "flower-pw-c0de",
    "admin": "admin-pw-9f21",
}


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[Path, Path]:
    key_path, cert_path = path.with_suffix(".key"), path.with_suffix(".crt")
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


Issuer = tuple[x509.Name, ec.EllipticCurvePrivateKey]


def _cert(
    name: str, key: ec.EllipticCurvePrivateKey, issuer: Issuer | None, server: bool = False
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, signer = issuer or (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )  # fmt: skip
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signer, hashes.SHA256())


class Pki:
    """A CA, the broker's certificate (127.0.0.1), a client's, and one from a CA the broker does not trust."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        ca_key = _key()
        ca = _cert("sciencebench test CA", ca_key, None)
        self.ca, _ = _write(root / "ca", ca_key, ca)
        issuer = (ca.subject, ca_key)
        server_key, client_key = _key(), _key()
        server = _cert("broker", server_key, issuer, server=True)
        self.server_cert, self.server_key = _write(root / "server", server_key, server)
        self.client_cert, self.client_key = _write(
            root / "client", client_key, _cert("client", client_key, issuer)
        )
        rogue_key = _key()
        self.rogue_cert, self.rogue_key = _write(root / "rogue", rogue_key, _cert("rogue", rogue_key, None))


class TlsRedis(RedisServer):
    """A redis-server on a TLS port only, asking clients for certificates, with the role users' ACL file."""

    def __init__(self, workdir: Path, pki: Pki) -> None:
        super().__init__(workdir)
        self.pki = pki

    def url_of(self, role: str, scheme: str = "rediss", password: str = "") -> str:
        return f"{scheme}://{role}:{password or PASSWORDS[role]}@127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        """The worker's URL (`Cluster` starts workers with it)."""
        return self.url_of("worker")

    def client(self, role: str = "admin", password: str = "", **kw: object) -> redis.Redis:
        tls = {"ssl_ca_certs": str(self.pki.ca), "ssl_certfile": str(self.pki.client_cert),
               "ssl_keyfile": str(self.pki.client_key)}  # fmt: skip
        url = self.url_of(role, password=password)
        return redis.Redis.from_url(url, decode_responses=True, **{**tls, **kw})  # type: ignore[arg-type]

    def argv(self) -> list[str]:
        users = self.workdir / "users.acl"
        users.write_text(acl.render(PASSWORDS))
        return [redis_server_bin(), "--bind", "127.0.0.1", "--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(self.pki.server_cert), "--tls-key-file", str(self.pki.server_key),
                "--tls-ca-cert-file", str(self.pki.ca), "--tls-auth-clients", "yes",
                "--aclfile", str(users), "--dir", str(self.workdir), "--save", "",
                "--logfile", str(self.workdir / "redis.log")]  # fmt: skip


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    root = tmp_path_factory.mktemp("tls-broker")
    server = TlsRedis(root / "redis", Pki(root / "pki"))
    server.start()
    yield server
    server.stop()


def _tls_env(broker: TlsRedis, role: str) -> dict[str, str]:
    return {"SCIENCEBENCH_BROKER_URL": broker.url_of(role), "SCIENCEBENCH_BROKER_CA": str(broker.pki.ca),
            "SCIENCEBENCH_BROKER_CERT": str(broker.pki.client_cert),
            "SCIENCEBENCH_BROKER_KEY": str(broker.pki.client_key)}  # fmt: skip


class TlsCluster(Cluster):
    """The integration cluster with the worker as `worker` and the login node's commands as `login`."""

    @property
    def env(self) -> dict[str, str]:
        assert isinstance(self.redis, TlsRedis)
        return {**super().env, **_tls_env(self.redis, "worker")}

    @property
    def login_env(self) -> dict[str, str]:
        assert isinstance(self.redis, TlsRedis)
        return {**super().env, **_tls_env(self.redis, "login")}

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(VENV_BIN / "sciencebench"), *args], env=self.login_env, cwd=self.root,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.fixture
def tls_cluster(broker: TlsRedis, tmp_path: Path, state_dir: Path, base_image: str) -> Iterator[TlsCluster]:
    broker.client().flushdb()
    broker.client().acl_log_reset()
    cluster = TlsCluster(redis=broker, root=tmp_path, state_dir=state_dir, base_image=base_image)
    yield cluster
    stop_workers(cluster.workers)


def _refused(admin: redis.Redis) -> list[tuple[str, str, str, str]]:
    """Whom the broker refused what (`ACL LOG`): the client's name, else its user; why, where and what."""
    return [(e["client-info"]["name"] or e["username"], e["reason"], e["context"], e["object"])
            for e in admin.acl_log(count=100)]  # fmt: skip


def test_a_job_runs_over_tls_and_the_login_user_cannot_take_a_lease(tls_cluster: TlsCluster,
                                                                    broker: TlsRedis) -> None:  # fmt: skip
    tls_cluster.start_workers(1)
    flower_env = {**tls_cluster.env, **_tls_env(broker, "flower")}
    flower = Flower.start(flower_env, tls_cluster.root, "viewer", "viewer-pw")
    try:
        _run_and_attack(tls_cluster, broker)
        tasks = flower.get_json("/api/tasks")
    finally:
        flower.stop()
    refused = _refused(broker.client())
    assert tasks and {task["state"] for task in tasks.values()} == {"SUCCESS"}, refused
    # Nothing the login node, the worker or Flower did was refused; each attack was.
    assert [entry for entry in refused if entry[0] != "attacker"] == [], refused


def _run_and_attack(tls_cluster: TlsCluster, broker: TlsRedis) -> None:
    path = tls_cluster.selection({"001": {"reward": 1.0, "sleep_sec": 3}})
    submit = subprocess.Popen(tls_cluster.submit_argv(path, "over-tls"), env=tls_cluster.login_env,
                              cwd=tls_cluster.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)  # fmt: skip
    admin = broker.client()
    deadline = time.monotonic() + 60
    while not tls_cluster.pier_runs_started() and submit.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert submit.poll() is None, (_refused(admin), submit.communicate()[0][-3000:])
    leases = list(admin.scan_iter("sciencebench:*:lease:*"))
    assert len(leases) == 1, _refused(admin)
    job, key = leases[0].split(":")[1], leases[0].split(":", 3)[3]
    holder = admin.get(leases[0])

    login = broker.client("login", client_name="attacker")  # its refusals are the ones expected
    with pytest.raises(redis.exceptions.NoPermissionError):
        login.set(leases[0], "login-node", xx=True)
    with pytest.raises(redis.exceptions.NoPermissionError):
        login.delete(leases[0])
    with pytest.raises(redis.exceptions.NoPermissionError):
        login.pexpire(leases[0], 1)
    with pytest.raises(redis.exceptions.NoPermissionError):  # moving the lease away
        login.renamenx(leases[0], JobKeys(job).parking("stolen"))
    # What a login node may do to a lease, create it when absent, leaves a held one as it is.
    login.set(JobKeys(job).parking(key), "login-node", px=60_000)
    assert login.renamenx(JobKeys(job).parking(key), leases[0]) is False
    park = scripts.Registered(login, scripts.PARK)
    assert park(job, key, ["login-node", 60_000, job]) == 0
    absent = JobKeys(job).lease("999#1")
    assert park(job, "999#1", ["parked:999", 30_000, job]) == 1
    assert admin.get(absent) == "parked:999"
    # Its own park again: the refresh is refused inside the script, the earlier park stays.
    assert park(job, "999#1", ["parked:999", 600_000, job]) == 1
    assert admin.pttl(absent) <= 30_000
    for script in (scripts.TAKE_ORPHAN, scripts.START, scripts.RENEW, scripts.COMMIT):
        with pytest.raises(redis.exceptions.NoPermissionError):
            scripts.Registered(login, script)(job, key, ["x"] * 8)
    with pytest.raises(redis.exceptions.NoPermissionError):
        login.eval("return redis.call('set', KEYS[1], 'login-node')", 1, leases[0])
    with pytest.raises(redis.exceptions.NoPermissionError):  # no revoke or shutdown broadcast to the workers
        login.publish("/0.celery.pidbox", "{}")
    assert admin.get(leases[0]) in (holder, None)

    output, _ = submit.communicate(timeout=120)
    assert submit.returncode == 0, output
    assert [run["task"] for run in tls_cluster.pier_runs()] == ["task_001"]
    # What else a login node does: read the job's state, cancel it, retry it.
    for command in (
        ["status", "over-tls"],
        ["share"],
        ["cancel", "over-tls"],
        ["retry", "over-tls", "--failed"],
    ):
        done = tls_cluster.cli(*command, "--jobs-dir", str(tls_cluster.jobs_dir))
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    refused = [entry for entry in _refused(admin) if entry[0] == "attacker"]
    assert {what for *_, what in refused} == {leases[0], absent, "evalsha", "eval", "/0.celery.pidbox"}


def test_a_client_without_a_certificate_is_refused(broker: TlsRedis, tmp_path: Path) -> None:
    with pytest.raises(redis.ConnectionError):
        broker.client("login", ssl_certfile=None, ssl_keyfile=None).ping()
    # A login node without its certificate: one line at once, not a wait or a traceback.
    env = {**os.environ, "SCIENCEBENCH_BROKER_URL": broker.url_of("login"),
           "SCIENCEBENCH_BROKER_CA": str(broker.pki.ca)}  # fmt: skip
    started = time.monotonic()
    done = subprocess.run([str(VENV_BIN / "sciencebench"), "share"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and time.monotonic() - started < 30
    assert done.stderr.splitlines() == [
        "sciencebench: error: broker unreachable: ConnectionError at "
        f"rediss://login:***@127.0.0.1:{broker.port}/0; set SCIENCEBENCH_BROKER_URL to the cluster's Redis"
    ], done.stderr  # the password masked


def test_a_client_with_a_certificate_of_another_ca_is_refused(broker: TlsRedis) -> None:
    rogue = broker.client(
        "login", ssl_certfile=str(broker.pki.rogue_cert), ssl_keyfile=str(broker.pki.rogue_key)
    )
    with pytest.raises(redis.ConnectionError):
        rogue.ping()


def test_plain_redis_is_refused(broker: TlsRedis) -> None:
    plain = redis.Redis.from_url(broker.url_of("login", scheme="redis"), socket_timeout=5)
    with pytest.raises(redis.ConnectionError):
        plain.ping()


def test_a_wrong_password_and_the_default_user_get_nothing(broker: TlsRedis) -> None:
    pki = broker.pki
    anonymous = redis.Redis(port=broker.port, ssl=True, ssl_ca_certs=str(pki.ca),
                            ssl_certfile=str(pki.client_cert), ssl_keyfile=str(pki.client_key))  # fmt: skip
    assert anonymous.ping() is True  # the compose healthcheck
    with pytest.raises(redis.exceptions.NoPermissionError):
        anonymous.get("sciencebench:jobs")
    with pytest.raises(redis.exceptions.AuthenticationError):  # as compose's default: no requirepass
        broker.client("login", "not-the-password").ping()


def _held(task_id: str) -> Held:
    trial = TrialSpec(
        job_id=uuid.UUID(int=7), job_name="held", jobs_dir=Path("/jobs"), task_id=task_id, attempt=1,
        task_dir=Path(f"/sel/task_{task_id}"), task_toml_sha256="x", image_refs=[], expected_sec=1.0,
    )  # fmt: skip
    payload = Redispatch(task_id=f"celery-{task_id}", trial=trial, group_id="g", group_index=0, host="")
    return Held(payload=payload, expected_sec=1.0)


def test_the_login_user_parks_the_held_trials_it_sends_and_no_held_lease(broker: TlsRedis) -> None:
    admin = broker.client()
    admin.flushdb()
    admin.acl_log_reset()
    job = str(uuid.UUID(int=7))
    # The login node's own store connection: Settings over TLS, as every command makes it.
    coord = connect(Settings.from_env(_tls_env(broker, "login")))
    coord.hold(job, [_held("001"), _held("002")], [], window=1)
    admin.set(JobKeys(job).lease("002#1"), "worker-owner", px=60_000)  # a worker runs 002 already
    sent = coord.release_held(job, 30.0)
    assert sorted(payload.trial.task_id for payload in sent) == ["001", "002"]
    assert admin.get(JobKeys(job).lease("001#1")) == parking_token("celery-001")
    assert 0 < admin.pttl(JobKeys(job).lease("001#1")) <= 30_000
    assert admin.get(JobKeys(job).lease("002#1")) == "worker-owner"
    assert not list(admin.scan_iter(JobKeys(job).parking("*")))
    assert _refused(admin) == []


def test_the_worker_user_takes_and_gives_back_a_mirrors_first_pull(broker: TlsRedis) -> None:
    """The first-pull lock works under the worker's ACL: given back at once, not left to lapse (another
    host would wait out its hold for every image)."""
    admin, worker = broker.client(), broker.client("worker")
    key = ClusterKeys.mirror_pull("sha256:" + "ab" * 32)
    store = cast(Coordinator, SimpleNamespace(client=worker))
    with first_pull(store, "sha256:" + "ab" * 32, hold_sec=60):
        assert 0 < admin.pttl(key) <= 60_000
    assert admin.exists(key) == 0
    admin.set(key, "another host's", px=60_000)  # held elsewhere: the wait ends with the other's release
    with first_pull(store, "sha256:" + "ab" * 32, hold_sec=0.5):
        pass
    assert admin.get(key) == "another host's"  # never given back by one who does not hold it
