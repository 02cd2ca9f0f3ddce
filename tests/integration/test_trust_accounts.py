"""A job uses only its own submitter's secrets: two real accounts, one real worker.

Alice submits a job with her env file (mode 0600, hers). Bob, another
account on the same cluster, knows its path and SHA-256 (an earlier
world-readable job.json named them) and holds the broker password like every
submitter: he writes them into the job.json of a job of his own, in his own
jobs directory under the worker's jobs root, and sends a trial of it. The
worker refuses it, because the env file is not the account's that owns the
job's directory; alice's key reaches no Pier process, record, log or file
of bob's, and alice's own job still runs with it.

The worker runs as root here: the check compares owners, not permissions,
so a worker that can read every env file (as root can) still refuses.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from sciencebench.coordination.celery_app import create_app
from sciencebench.core.envfile import EnvFile
from sciencebench.core.models import JobSpec, TrialSpec
from sciencebench.core.settings import Settings
from sciencebench.core.wire import RUN_TRIAL
from tests.fixtures.services import FAKE_PIER, VENV_BIN, RedisServer, Worker
from tests.integration.conftest import Cluster
from tests.integration.test_secrets_and_local import _all_redis_text, _tree_text

pytestmark = pytest.mark.integration

ALICE, BOB = "sb-alice", "sb-bob"
KEY = "sk-alice-canary-5e0c2b7d91"
# This machine's interpreter lives under /root (mode 0700). An account's process keeps the
# capability to read past file modes (only that); what it creates is its own, as on a login node.
_AS = ["--clear-groups", "--inh-caps=+dac_override,+dac_read_search",
       "--ambient-caps=+dac_override,+dac_read_search"]  # fmt: skip


@pytest.fixture(scope="session")
def accounts() -> dict[str, pwd.struct_passwd]:
    """Two accounts of the test machine, created once (and left for the next run)."""
    for name in (ALICE, BOB):
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    return {name: pwd.getpwnam(name) for name in (ALICE, BOB)}


@pytest.fixture
def cluster(redis_server: RedisServer, state_dir: Path, base_image: str) -> Iterator[Cluster]:
    """The integration cluster, in a directory both accounts can reach (pytest's own is root's only)."""
    redis.Redis.from_url(redis_server.url).flushdb()
    root = Path(tempfile.mkdtemp(prefix="sb-trust-accounts-"))
    root.chmod(0o755)
    c = Cluster(redis=redis_server, root=root, state_dir=state_dir, base_image=base_image)
    try:
        yield c
    finally:
        for worker in c.workers:
            worker.stop()
        shutil.rmtree(root, ignore_errors=True)


def _as(
    account: pwd.struct_passwd, argv: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    ids = [f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", *_AS]
    return subprocess.run(["setpriv", *ids, *argv], env={**env, "HOME": str(cwd)}, cwd=cwd,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def _submit_as(account: pwd.struct_passwd, cluster: Cluster, jobs: Path, name: str, *extra: str) -> JobSpec:
    path = cluster.selection({"001": {"reward": 1.0}}, root=cluster.root / f"{name}-selection")
    for entry in [path, *path.rglob("*")]:  # the account's own selection
        os.chown(entry, account.pw_uid, account.pw_gid)
    argv = [str(VENV_BIN / "sciencebench"), "submit", "--path", str(path), "--agent", "nop",
            "--jobs-dir", str(jobs), "--job-name", name, "--wait", *extra]  # fmt: skip
    done = _as(account, argv, cluster.env, cluster.root)
    assert done.returncode == 0, done.stderr
    spec = jobs / name / ".sciencebench" / "job.json"
    assert (spec.stat().st_uid, spec.stat().st_mode & 0o777) == (account.pw_uid, 0o640)
    return JobSpec.model_validate_json(spec.read_bytes())


def _pier_wrapper(root: Path) -> tuple[Path, Path]:
    """The worker's Pier: the fake one, after noting which job's run saw which OPENAI_API_KEY (hashed)."""
    log, wrapper = root / "pier-env.jsonl", root / "pier"
    wrapper.write_text(
        f"#!{sys.executable}\n"
        "import hashlib, json, os, sys\n"
        "if sys.argv[1:2] == ['run']:\n"
        "    seen = hashlib.sha256(os.environ.get('OPENAI_API_KEY', '').encode()).hexdigest()\n"
        "    jobs = sys.argv[sys.argv.index('--jobs-dir') + 1]\n"
        f"    with open({str(log)!r}, 'a') as out:\n"
        "        out.write(json.dumps({'jobs_dir': jobs, 'key': seen}) + '\\n')\n"
        f"os.execv({str(FAKE_PIER)!r}, [{str(FAKE_PIER)!r}, *sys.argv[1:]])\n"
    )
    wrapper.chmod(0o755)
    return wrapper, log


def _send(cluster: Cluster, job: JobSpec, attempt: int) -> dict[str, Any]:
    """A trial of `job` as anyone holding the broker password sends it; the worker's answer."""
    spec = TrialSpec(
        job_id=job.job_id, job_name=job.job_name, jobs_dir=job.jobs_dir, task_id="001", attempt=attempt,
        task_dir=job.selection_path / "task_001", task_toml_sha256=job.task_hashes["001"], image_refs=[],
        expected_sec=30.0,
    )  # fmt: skip
    app = create_app(Settings.from_env(cluster.env))
    try:
        result = app.send_task(RUN_TRIAL, args=[spec.model_dump(mode="json")]).get(timeout=60)
    finally:
        app.close()  # its broker and backend connections, not left to the garbage collector
    assert isinstance(result, dict)
    return result


def test_a_job_cannot_use_another_accounts_env_file(
    cluster: Cluster, accounts: dict[str, pwd.struct_passwd]
) -> None:
    alice, bob = accounts[ALICE], accounts[BOB]
    wrapper, pier_log = _pier_wrapper(cluster.root)
    worker = Worker("w0", cluster.env, cluster.root, 1, ["--pier-bin", str(wrapper)]).start()
    cluster.workers.append(worker)
    worker.wait_ready()
    env_file = cluster.root / "alice.env"
    env_file.write_text(f"OPENAI_API_KEY={KEY}\n")
    os.chown(env_file, alice.pw_uid, alice.pw_gid)
    env_file.chmod(0o600)

    alices = _submit_as(alice, cluster, cluster.root / "alice-jobs", "alice-job", "--env-file", str(env_file))
    assert alices.env_file is not None
    # Bob's own job, in his own jobs directory (his), then his job.json naming alice's env file.
    bob_jobs = cluster.root / "bob-jobs"
    bobs = _submit_as(bob, cluster, bob_jobs, "bob-job")
    forged = bobs.model_copy(
        update={"env_file": EnvFile(path=alices.env_file.path, sha256=alices.env_file.sha256)}
    )
    spec = bob_jobs / "bob-job" / ".sciencebench" / "job.json"
    rewrite = [str(VENV_BIN / "python"), "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
               str(spec), forged.model_dump_json()]  # fmt: skip
    assert _as(bob, rewrite, cluster.env, cluster.root).returncode == 0
    assert spec.stat().st_uid == bob.pw_uid

    answer = _send(cluster, forged, attempt=2)
    assert answer["exception_type"] == "RefusedError", answer
    assert answer["exception_message"].startswith("refused: env file alice.env belongs to another account")
    assert str(cluster.root) not in answer["exception_message"]  # the file's name only
    # The key reached Pier for alice's job, and no Pier run of bob's ever saw it.
    runs = [json.loads(line) for line in pier_log.read_text().splitlines()]
    # A worker's Pier runs in its scratch, one directory per job id: a run not of alice's job is bob's.
    seen = {f"/{alices.job_id}/" not in run["jobs_dir"]: run["key"] for run in runs}
    assert len(runs) == 2 and seen == {
        False: hashlib.sha256(KEY.encode()).hexdigest(),
        True: hashlib.sha256(b"").hexdigest(),
    }
    assert KEY not in json.dumps(answer)
    assert KEY not in _tree_text(bob_jobs) + _tree_text(cluster.root / "alice-jobs")
    assert KEY not in worker.log_path.read_text() + _all_redis_text(cluster.redis.url)
    # Alice's own job still runs with her key.
    again = _send(cluster, alices, attempt=2)
    assert again["exception_type"] is None, again
    assert len(pier_log.read_text().splitlines()) == 3
