"""The Redis ACL users per role (`coordination.acl`): from the scripts, the login user kept off leases."""

from __future__ import annotations

import hashlib
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from sciencebench.coordination import acl, scripts
from sciencebench.coordination.keys import JobKeys
from tests.fixtures.services import REPO

pytestmark = pytest.mark.unit

JOB, KEY = "0b4f6d0e-5c1e-4a57-9b8e-2d3c1f6a7e90", "task_001#1"


def _role(name: str) -> acl.Role:
    return next(role for role in acl.ROLES if role.name == name)


def _writable(role: acl.Role, key: str) -> bool:
    patterns = [p.split("~", 1)[1] for p in role.keys if p.startswith(("~", "%RW~", "%W~"))]
    return any(fnmatchcase(key, pattern) for pattern in patterns)


def _sha(script: scripts.Script) -> str:
    return hashlib.sha1(script.source().encode()).hexdigest()


def test_the_committed_file_is_what_the_scripts_give() -> None:
    # A changed Lua script changes its hash: `python -m sciencebench.coordination.acl --out <that file>`.
    assert (REPO / "compose" / "redis-users.acl").read_text() == acl.render()


def test_the_login_user_can_neither_run_nor_write_what_takes_a_lease() -> None:
    login, worker = _role("login").rules(), _role("worker").rules()
    for script in (
        scripts.TAKE_ORPHAN,
        scripts.START,
        scripts.RENEW,
        scripts.COMMIT,
        scripts.FINISH,
        scripts.PARK,
    ):
        assert f"+evalsha|{_sha(script)}" not in login
    for script in scripts.ALL:
        assert f"+evalsha|{_sha(script)}" in worker
    keys = JobKeys(JOB)
    for name in (keys.lease(KEY), keys.result(KEY), keys.counted(KEY), keys.budget_started):
        assert not _writable(_role("login"), name), name
        assert _writable(_role("worker"), name), name
    assert not any(_writable(_role("flower"), name) for name in (keys.lease(KEY), keys.state))
    for rules in (login, worker, _role("flower").rules()):
        assert "+@all" not in rules and "+eval" not in rules and "+@scripting" not in rules


def test_passwords_are_stored_as_hashes_and_users_without_one_are_off(tmp_path: Path) -> None:
    text = acl.render({"login": "s3cret-login"})
    assert "s3cret-login" not in text
    lines = {line.split()[1]: line.split() for line in text.splitlines()}
    assert lines["login"][2:4] == ["on", "#" + hashlib.sha256(b"s3cret-login").hexdigest()]
    assert lines["worker"][2] == "off"
    assert lines["default"][2:4] == ["on", "nopass"] and lines["default"][-2:] == ["-@all", "+ping"]

    passwords = tmp_path / "passwords"
    passwords.write_text("login=s3cret-login\nworker=w0rker\n")
    out = tmp_path / "users.acl"
    assert acl.main(["--passwords", str(passwords), "--out", str(out)]) == 0
    assert out.read_text() == acl.render({"login": "s3cret-login", "worker": "w0rker"})


@pytest.mark.parametrize("content", ["nobody=pw\n", "login\n", "login=two words\n"])
def test_a_bad_passwords_file_is_one_line_and_exit_2(
    tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    passwords = tmp_path / "passwords"
    passwords.write_text(content)
    out = tmp_path / "users.acl"
    assert acl.main(["--passwords", str(passwords), "--out", str(out)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert not out.exists()
