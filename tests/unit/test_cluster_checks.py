"""What submit (and its dry run) checks against the hosts that would run the job (`login.cluster`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sciencebench import cli
from sciencebench.coordination.protocol import HostKit
from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.core.errors import ProfileError
from sciencebench.core.settings import Settings
from sciencebench.login.cluster import Cluster
from sciencebench.login.options import SubmitOptions
from sciencebench.login.submit import Prepared
from sciencebench.login.submit import prepare as prepare_on
from tests.fixtures.hosts import EVERYTHING, PROXY_IMAGE
from tests.fixtures.selection import make_selection
from tests.fixtures.services import RedisServer

pytestmark = pytest.mark.unit

KEY = "sk-cluster-canary-51c0"


def _cluster(**kits: HostKit) -> Cluster:
    return Cluster(kits=dict(kits), where="live worker hosts")


def _submit(tmp_path: Path, cluster: Cluster, agent: str = "codex", **kw: Any) -> Prepared:
    selection = make_selection(tmp_path / "sel", ["002", "005"])
    env_file = tmp_path / "provider.env"
    env_file.write_text(f"OPENAI_API_KEY={KEY}\n")
    opts = SubmitOptions(path=selection, agent=agent, env_file=env_file if agent != "nop" else None,
                         jobs_dir=tmp_path / "jobs", job_name="c", **kw)  # fmt: skip
    return prepare_on(opts, hosts=lambda: cluster, local=cluster.local)


def test_a_host_that_brings_everything_runs_a_codex_job_with_no_bake_step(tmp_path: Path) -> None:
    prepared = _submit(tmp_path, _cluster(w1=EVERYTHING))
    assert prepared.job.agent_images == {}  # Pier installs codex online, as the original's hosts do


def test_a_model_agent_needs_a_host_with_the_proxy_image(tmp_path: Path) -> None:
    without = EVERYTHING.model_copy(update={"proxy_image": ""})
    with pytest.raises(ProfileError) as caught:
        _submit(tmp_path, _cluster(w1=without))
    message = str(caught.value)
    assert "\n" not in message and "no live worker host has its image" in message
    assert "SCIENCEBENCH_PROXY_IMAGE" in message
    _submit(tmp_path / "two", _cluster(w1=without, w2=EVERYTHING))  # one host that has it is enough


def test_no_live_host_refuses_only_jobs_that_need_something_of_the_hosts(tmp_path: Path) -> None:
    _submit(tmp_path / "nop", _cluster(), agent="nop")  # nop trials wait for hosts to come
    with pytest.raises(
        ProfileError, match="no live worker host: this job needs one with the inference proxy"
    ):
        _submit(tmp_path / "codex", _cluster())


def test_baked_only_hosts_refuse_a_task_without_a_baked_image_naming_both_ways_out(tmp_path: Path) -> None:
    baked = EVERYTHING.model_copy(update={"agent_install": "baked"})
    with pytest.raises(ProfileError) as caught:
        _submit(tmp_path, _cluster(w1=baked))
    message = str(caught.value)
    assert "no baked codex image for task(s) 002, 005" in message
    assert "sciencebench images bake" in message and "--agent-install online" in message
    _submit(tmp_path / "mixed", _cluster(w1=baked, w2=EVERYTHING))


def test_the_requirements_are_met_by_one_host_not_by_several_together(tmp_path: Path) -> None:
    proxy_only = EVERYTHING.model_copy(update={"agent_install": "baked"})
    online_only = EVERYTHING.model_copy(update={"proxy_image": ""})
    with pytest.raises(ProfileError, match="installs agents online"):
        _submit(tmp_path, _cluster(w1=proxy_only, w2=online_only))


@pytest.mark.parametrize(
    ("field", "option"),
    [("jobs_roots", "--jobs-dir"), ("selection_roots", "--path"), ("env_file_roots", "--env-file")],
)
def test_a_path_no_live_host_serves_is_refused_naming_the_option(
    tmp_path: Path, field: str, option: str
) -> None:
    elsewhere = EVERYTHING.model_copy(update={field: ("/srv/elsewhere",)})
    with pytest.raises(ProfileError) as caught:
        _submit(tmp_path, _cluster(w1=elsewhere))
    message = str(caught.value)
    assert message.startswith(f"{option} ") and "no live worker host serves it" in message
    assert "/srv/elsewhere" in message


def test_local_checks_this_host_as_its_settings_say(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="this host has no proxy image"):
        _submit(tmp_path / "a", Cluster.this_host(Settings.from_env({})))
    baked = Settings.from_env(
        {"SCIENCEBENCH_PROXY_IMAGE": PROXY_IMAGE, "SCIENCEBENCH_AGENT_INSTALL": "baked"}
    )
    with pytest.raises(ProfileError, match="this host does not install agents online"):
        _submit(tmp_path / "b", Cluster.this_host(baked))
    online = Settings.from_env({"SCIENCEBENCH_PROXY_IMAGE": PROXY_IMAGE})
    assert _submit(tmp_path / "c", Cluster.this_host(online)).job.agent_images == {}


def test_the_live_hosts_are_those_that_beat_within_two_leases(store: RedisCoordinator) -> None:
    coord = store
    coord.describe_host("w1@a", EVERYTHING)
    coord.beat("w1@a")
    coord.beat("w2@b")  # an older worker that reported no kit: it brings nothing
    live = Cluster.live(coord, lease_seconds=60)
    assert live.kits == {"w1@a": EVERYTHING, "w2@b": HostKit(agent_install="online")}
    assert live.silent == {"w2@b"}
    time.sleep(0.05)
    assert Cluster.live(coord, lease_seconds=0.01).kits == {}


def test_an_agent_install_setting_other_than_online_or_baked_is_one_line() -> None:
    from sciencebench.core.errors import SettingsError

    with pytest.raises(SettingsError, match="SCIENCEBENCH_AGENT_INSTALL"):
        Settings.from_env({"SCIENCEBENCH_AGENT_INSTALL": "pier"})


# --- the dry run, through the CLI, against a real broker -------------------------------------


def _dry_run(tmp_path: Path, broker_url: str) -> Any:
    selection = make_selection(tmp_path / "sel", ["002"])
    env_file = tmp_path / "codex.env"
    env_file.write_text(f"OPENAI_API_KEY={KEY}\n")
    args = ["submit", "--path", str(selection), "--agent", "codex", "--env-file", str(env_file),
            "--jobs-dir", str(tmp_path / "jobs"), "--skip-pull", "--dry-run"]  # fmt: skip
    return CliRunner().invoke(cli.main, args, env={"SCIENCEBENCH_BROKER_URL": broker_url}), selection


def test_a_dry_run_is_refused_where_the_real_submit_is(tmp_path: Path, redis_server: RedisServer) -> None:

    coord = RedisCoordinator(redis_server.url)
    try:
        coord.describe_host("w9@noproxy", EVERYTHING.model_copy(update={"proxy_image": ""}))
        coord.beat("w9@noproxy")
        result, selection = _dry_run(tmp_path, redis_server.url)
    finally:
        coord.forget_host("w9@noproxy")
        coord.close()
    assert result.exit_code == 2, result.output
    assert "inference proxy" in result.stderr and result.stderr.count("\n") == 1
    assert not (selection / "batch-run.json").exists()


def test_a_dry_run_without_a_broker_says_in_one_line_which_checks_it_skipped(tmp_path: Path) -> None:
    from tests.fixtures.services import free_port

    result, selection = _dry_run(tmp_path, f"redis://127.0.0.1:{free_port()}/0")
    assert result.exit_code == 0, result.stderr
    skipped = [line for line in result.stdout.splitlines() if line.startswith("dry run: not checked here:")]
    assert len(skipped) == 1 and "the live worker hosts' roots" in skipped[0]
    assert (selection / "batch-run.json").is_file()


def test_a_submit_without_a_broker_names_its_url_and_variable(tmp_path: Path) -> None:
    from tests.fixtures.services import free_port

    selection = make_selection(tmp_path / "sel", ["002"])
    url = f"redis://:{KEY}@127.0.0.1:{free_port()}/0"
    args = ["submit", "--path", str(selection), "--jobs-dir", str(tmp_path / "jobs")]
    result = CliRunner().invoke(cli.main, args, env={"SCIENCEBENCH_BROKER_URL": url})
    assert result.exit_code == 1
    assert result.stderr == (
        f"sciencebench: error: broker unreachable: ConnectionError at {url.replace(KEY, '***')}; "
        "set SCIENCEBENCH_BROKER_URL to the cluster's Redis\n"
    )
    assert not (selection / "batch-run.json").exists() and not (tmp_path / "jobs").exists()


def test_a_host_that_reported_nothing_is_named_as_an_older_worker(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    coord = store
    coord.beat("w1@old")
    with pytest.raises(ProfileError, match=r"none reported; 1 host\(s\) reported nothing: a worker older"):
        _submit(tmp_path, Cluster.live(coord, lease_seconds=60), agent="nop")
