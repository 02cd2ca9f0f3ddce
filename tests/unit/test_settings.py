"""Settings from SCIENCEBENCH_* variables: validated, one line and exit 2 when bad."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.core.errors import SettingsError
from sciencebench.core.settings import VISIBILITY_TIMEOUT_FLOOR_SEC, Settings
from tests.fixtures.selection import make_selection

pytestmark = pytest.mark.unit


def test_defaults_and_layering() -> None:
    settings = Settings.from_env({"SCIENCEBENCH_BROKER_URL": "redis://:pw@broker:6379/1", "OTHER": "x"})
    assert settings.broker_url == "redis://:pw@broker:6379/1"
    assert settings.backend_url == settings.broker_url
    assert settings.public_broker_url == "redis://broker:6379/1"
    assert settings.lease_seconds == 60.0
    assert settings.visibility_timeout_sec == VISIBILITY_TIMEOUT_FLOOR_SEC
    assert settings.state_dir == Path("/var/tmp/sciencebench")
    assert settings.warm_pier is True
    assert settings.hostname


def test_values_are_parsed() -> None:
    settings = Settings.from_env({
        "SCIENCEBENCH_RESULT_BACKEND": "redis://backend:6379/2",
        "SCIENCEBENCH_LEASE_SECONDS": "2.5",
        "SCIENCEBENCH_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT_FLOOR_SEC * 2),
        "SCIENCEBENCH_STATE_DIR": "/srv/state",
        "SCIENCEBENCH_HOSTNAME": "w7",
        "SCIENCEBENCH_WARM_PIER": "off",
    })  # fmt: skip
    assert settings.backend_url == "redis://backend:6379/2"
    assert settings.lease_seconds == 2.5
    assert settings.visibility_timeout_sec == VISIBILITY_TIMEOUT_FLOOR_SEC * 2
    assert settings.state_dir == Path("/srv/state")
    assert settings.hostname == "w7"
    assert settings.warm_pier is False


def test_empty_values_mean_unset() -> None:
    settings = Settings.from_env({"SCIENCEBENCH_VISIBILITY_TIMEOUT": "", "SCIENCEBENCH_HOSTNAME": ""})
    assert settings.visibility_timeout_sec == VISIBILITY_TIMEOUT_FLOOR_SEC
    assert settings.hostname


def test_the_process_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCIENCEBENCH_LEASE_SECONDS", "7")
    assert Settings.from_env().lease_seconds == 7.0


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SCIENCEBENCH_LEASE_SECONDS", "abc"),
        ("SCIENCEBENCH_LEASE_SECONDS", "-1.5"),
        ("SCIENCEBENCH_VISIBILITY_TIMEOUT", "-5"),
        ("SCIENCEBENCH_VISIBILITY_TIMEOUT", "6h"),
        ("SCIENCEBENCH_WARM_PIER", "maybe"),
        ("SCIENCEBENCH_BROKER_URL", "amqp://user:hunter2@rabbit//"),
    ],
)
def test_a_bad_value_names_the_variable_not_the_value(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=f"^{variable}: ") as err:
        Settings.from_env({variable: value})
    assert value not in str(err.value)


def test_the_cli_says_so_in_one_line_and_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    selection = make_selection(tmp_path / "sel", ["001"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCIENCEBENCH_LEASE_SECONDS", "abc")
    result = CliRunner().invoke(cli.main, ["submit", "--path", str(selection), "--dry-run"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "sciencebench: error: SCIENCEBENCH_LEASE_SECONDS: Input should be a valid number, unable to parse "
        "string as a number"
    ]
    assert not (selection / "batch-run.json").exists()
    assert not (tmp_path / "jobs").exists()


def _pem_files(tmp_path: Path) -> dict[str, str]:
    files = {}
    for name in ("ca", "cert", "key"):
        (tmp_path / f"{name}.pem").write_text("-----BEGIN X-----\n")
        files[f"SCIENCEBENCH_BROKER_{name.upper()}"] = str(tmp_path / f"{name}.pem")
    return files


def test_tls_settings_reach_every_client_of_a_rediss_broker(tmp_path: Path) -> None:
    files = _pem_files(tmp_path)
    settings = Settings.from_env({"SCIENCEBENCH_BROKER_URL": "rediss://login:pw@broker:6379/0", **files})
    options = settings.broker_ssl(settings.broker_url)
    assert options["ssl_ca_certs"] == files["SCIENCEBENCH_BROKER_CA"]
    assert (options["ssl_certfile"], options["ssl_keyfile"]) == (
        files["SCIENCEBENCH_BROKER_CERT"], files["SCIENCEBENCH_BROKER_KEY"])  # fmt: skip
    assert settings.broker_ssl("redis://other:6379/0") == {}
    url = settings.broker_client_url(settings.broker_url)
    assert url.startswith("rediss://login:pw@broker:6379/0?ssl_cert_reqs=required&ssl_ca_certs=")
    assert settings.public_broker_url == "rediss://broker:6379/0"

    from sciencebench.coordination.celery_app import create_app

    conf = create_app(settings).conf
    assert conf.broker_use_ssl == options and conf.redis_backend_use_ssl == options
    # Without a CA the broker is still verified, against the system's CAs.
    plain = Settings.from_env({"SCIENCEBENCH_BROKER_URL": "rediss://broker:6379/0"})
    assert plain.broker_ssl(plain.broker_url) == {"ssl_cert_reqs": __import__("ssl").CERT_REQUIRED}


@pytest.mark.parametrize(
    ("drop", "url", "message"),
    [
        (
            "",
            "redis://broker:6379/0",
            "SCIENCEBENCH_BROKER_CA/CERT/KEY: TLS to the broker needs rediss:// URLs",
        ),
        ("SCIENCEBENCH_BROKER_KEY", "rediss://broker:6379/0", "SCIENCEBENCH_BROKER_KEY: needs"),
        ("SCIENCEBENCH_BROKER_CERT", "rediss://broker:6379/0", "SCIENCEBENCH_BROKER_CERT: needs"),
    ],
)
def test_tls_settings_that_cannot_work_are_refused(tmp_path: Path, drop: str, url: str, message: str) -> None:
    env = {"SCIENCEBENCH_BROKER_URL": url, **_pem_files(tmp_path)}
    env.pop(drop, None)
    with pytest.raises(SettingsError, match=f"^{message}"):
        Settings.from_env(env)


def test_a_tls_file_that_cannot_be_read_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        SettingsError, match=r"^SCIENCEBENCH_BROKER_CA: must be an absolute path of a readable"
    ):
        Settings.from_env({"SCIENCEBENCH_BROKER_URL": "rediss://b:6379/0",
                           "SCIENCEBENCH_BROKER_CA": str(tmp_path / "missing.pem")})  # fmt: skip
