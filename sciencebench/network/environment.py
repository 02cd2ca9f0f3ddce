"""`IsolatedDockerEnvironment`: Pier's Docker environment under the offline network policy.

Selected with `pier run ... --environment-import-path
sciencebench.network.environment:IsolatedDockerEnvironment --ek
'inference_urls=["http://gw:4000/v1"]'`; Pier builds the separate verifier
environment from the same class and keywords. An agent with a provider
allowlist gets `isolated-allowlist` (an internal isolated bridge, a pinned
squid proxy as the only way out); nop, oracle and verifiers get
`network_mode: none`. The class is built in layers, one concept each (see
the class docstring); `start` checks, starts and inspects.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import requests
from docker.errors import DockerException
from pier.environments.agent_setup import new_proxy_token, proxy_environment

from sciencebench.core.errors import PolicyViolation, TransferRefused
from sciencebench.core.settings import raw_setting
from sciencebench.dockerhost.hostlocks import owner_id
from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL, COMPOSE_SERVICE_LABEL, OWNER_LABEL
from sciencebench.network.compose import PROXY_SERVICE, ProxyFiles, pids_limit_of, policy_compose
from sciencebench.network.egress import EgressPlan, plan_egress
from sciencebench.network.extract import extract_file
from sciencebench.network.handoff import VerifierHandoffEnvironment
from sciencebench.network.inspection import (
    INSPECT_TIMEOUT_SEC,
    collect_snapshot,
    inspect_policy,
    policy_record,
)
from sciencebench.network.squid import PROXY_PORT, passwd_line, render_squid_conf
from sciencebench.network.transfer import ChunkReader, open_dir, open_trial_dir

# The proxy's access log, kept in the trial's policy directory when the trial stops.
PROXY_ACCESS_LOG = "squid-access.log"
SQUID_ACCESS_LOG = "/tmp/squid-access.log"  # noqa: S108 (inside the proxy container, squid.conf's access_log)
PROXY_LOG_MAX_BYTES = 16 * 1024 * 1024
PROXY_LOG_SETTLE_SEC = 0.5  # for squid to log the calls the agent's container left open


class IsolatedDockerEnvironment(VerifierHandoffEnvironment):
    """Pier's DockerEnvironment with the offline network policy enforced and verified.

    Extra keywords (from `--ek`): `inference_urls`, the gateway base URLs
    whose `host:port` the proxy allows; `proxy_image`, the proxy image ref
    (default: the `SCIENCEBENCH_PROXY_IMAGE` environment variable, for a
    direct `pier run`); `owner`, the worker host state's id that labels every
    container (default: computed from this host's state dir); `agent_image`,
    `{agent, version, image}` of the task image with the agent preinstalled
    (`sciencebench images bake`), run instead of Pier's per-trial install
    build; `agent_install`, `online` (the default) when this worker installs
    the agent itself with no network (`network.offlineinstall`), `baked` when
    only Pier's install build (offline too) is left; `agent_artifacts` and
    `npm_registry`, where that install finds or fetches the harness's
    artifacts; `registry_mirrors`, the worker's registry mirrors (JSON,
    `core.mirrors`): the task's images run by the names the worker pulled them
    by, through a mirror, with the same digest. A worker passes these, so Pier's process environment holds
    none of its settings. `start` raises PolicyRefused or
    PolicyViolation (both PolicyError), and AgentImageMismatch for an image
    baked for another agent or version. `pids_limit` (the worker's `--pids-limit`;
    default `SCIENCEBENCH_PIDS_LIMIT`, else 4096) bounds each container's
    processes; inspection proves it, and the task's cpus and memory_mb.

    Lifecycle (`start`): plan (refuse what the policy cannot run) -> check the
    task's files as written (`core.taskreview.review_task_dir`) -> Pier's own
    start with the policy compose override, where each compose command that
    could build, create or start anything is preceded by its own `docker compose
    config` over Pier's exact file list and environment, and the rendered model
    is checked against the same allowlist -> inspect the real containers and networks
    within 15 s -> stop and raise on any deviation, otherwise write
    `network-policy-<session>.json` into the trial directory -> list the processes
    running (the ones a verifier here keeps). The agent is set up by Pier only
    after `start` returns.

    The layers: `ContainerFilesEnvironment` (`network.containerfiles`: nothing
    mounted, every copy through the archive API and `network.transfer`),
    `AgentInstallEnvironment` (`network.agentinstall`: a baked image, or the
    online install's, made with no network), `PolicyComposeEnvironment`
    (`network.policycompose`: the task's files and every rendered compose model
    checked, each `docker compose` with an allowlisted environment),
    `VerifierHandoffEnvironment` (`network.handoff`: a same-container verifier
    starts with no process of the agent's and an empty /logs/verifier), then this
    one: the egress plan (`network.egress`), the policy compose override and
    proxy, inspection and the record. Every image build the trial causes gets
    `build.network: none` from the policy override.
    """

    def __init__(
        self,
        *args: Any,
        inference_urls: object = None,
        proxy_image: str | None = None,
        owner: str | None = None,
        gateway_pins: object = None,
        pids_limit: object = None,
        **kwargs: Any,
    ) -> None:
        # Decisions that can fail wait for start(): an exception raised here
        # would abort Pier's whole job instead of being recorded on the trial.
        # (`agent_image` and `agent_install` are `AgentInstallEnvironment`'s.)
        self._inference_urls = inference_urls
        self._gateway_pins = gateway_pins
        self._proxy_image = proxy_image or raw_setting("proxy_image") or None
        self._owner = str(owner) if owner else None
        self._pids_limit = pids_limit if pids_limit is not None else raw_setting("pids_limit") or None
        self._plan: EgressPlan | None = None
        super().__init__(*args, **kwargs)

    @property
    def policy_dir(self) -> Path:
        """Per-session directory, inside the trial directory, for the policy's files."""
        return Path(self.trial_paths.trial_dir) / "network-policy" / self.session_id

    @property
    def policy_record_path(self) -> Path:
        """Where the trial keeps `network-policy-<session>.json`."""
        return Path(self.trial_paths.trial_dir) / f"network-policy-{self.session_id}.json"

    def _make_plan(self) -> EgressPlan:
        return plan_egress(
            allow_internet=bool(self.task_env_config.allow_internet),
            uses_compose=bool(self._uses_compose),
            allowlist_domains=list(self.network_allowlist.domains),
            inference_urls=self._inference_urls,
            proxy_image=self._proxy_image,
            gateway_pins=self._gateway_pins,
        )

    def _install_labels(self) -> dict[str, str]:
        """The online install's labels, with this host state's owner (a sweep after a crash removes them)."""
        return super()._install_labels() | {OWNER_LABEL: self._owner or owner_id()}

    def _checked_pids_limit(self) -> int:
        """The pids limit of the trial's containers: the worker's `pids_limit` keyword, else the default."""
        return pids_limit_of(self._pids_limit)

    def _prepare_egress_proxy_compose(self) -> None:
        # Replaces Pier's version, which builds a squid image from ubuntu:24.04
        # with apt at trial time (impossible offline) and has no policy checks.
        plan = self._plan if self._plan is not None else self._make_plan()
        self._plan = plan
        directory = self.policy_dir
        directory.mkdir(parents=True, exist_ok=True)
        proxy: ProxyFiles | None = None
        if plan.mode == "isolated-allowlist":
            assert plan.proxy_image is not None
            token = new_proxy_token()
            squid_conf = directory / "squid.conf"
            passwd = directory / "squid.passwd"
            squid_conf.write_text(render_squid_conf(plan.domains, plan.gateways, dict(plan.pins)))
            passwd.write_text(passwd_line(token))
            # squid's auth helper runs as the unprivileged `proxy` user.
            for path in (squid_conf, passwd):
                path.chmod(0o644)
            proxy = ProxyFiles(
                image=plan.proxy_image,
                squid_conf=str(squid_conf.resolve()),
                passwd=str(passwd.resolve()),
                hosts=plan.pins,
            )
            self._egress_proxy_env = proxy_environment(token, PROXY_SERVICE, PROXY_PORT)
        compose_path = directory / "docker-compose-policy.json"
        owner = self._owner or owner_id()
        offline_build = self._builds
        # A task compose file's own image for `main`, by the name the worker pulled it (its mirror's).
        task_image = self._task_compose_image()
        mirrored = self._local_image(task_image) if task_image else None
        compose = policy_compose(
            plan.mode, proxy, owner, offline_build=offline_build, pids_limit=self._checked_pids_limit(),
            memory_mb=self.task_env_config.memory_mb, main_image=mirrored if mirrored != task_image else None,
        )  # fmt: skip
        compose_path.write_text(json.dumps(compose, indent=2))
        self._policy_compose_path = compose_path
        if plan.mode == "isolated-allowlist":
            # Pier appends its no-network file only when no egress file is set.
            self._egress_proxy_compose_path = compose_path

    async def start(self, force_build: bool) -> None:
        """Start under the policy, then verify it before Pier sets up the agent.

        Raises PolicyRefused before anything is started (including a task
        whose files, or whose rendered compose model, the policy refuses),
        and PolicyViolation
        (after stopping the environment) when inspection fails or cannot
        finish within 15 s, or the processes running cannot be listed.
        """
        self._plan = self._make_plan()
        self._checked_pids_limit()  # a bad value is refused before anything starts
        if self._dropped_mounts:
            targets = ", ".join(str(m.get("target")) for m in self._dropped_mounts if isinstance(m, dict))
            self.logger.debug(f"mounts not made (their files are copied instead): {targets}")
        self._check_task_files()
        await self._start_with_agent(force_build)
        await self._enforce(self._plan)
        if not self._log_dirs_made:
            await asyncio.to_thread(self._make_log_dirs)
        try:
            await asyncio.to_thread(self._note_start_processes)
        except PolicyViolation:
            await self._stop_after_violation()
            raise

    async def _enforce(self, plan: EgressPlan) -> None:
        try:
            snapshot = await asyncio.wait_for(
                asyncio.to_thread(collect_snapshot, self.compose_project, INSPECT_TIMEOUT_SEC),
                timeout=INSPECT_TIMEOUT_SEC,
            )
        except TimeoutError:
            await self._stop_after_violation()
            raise PolicyViolation([f"inspection did not finish within {INSPECT_TIMEOUT_SEC:g} s"]) from None
        except (DockerException, requests.RequestException, OSError) as exc:
            await self._stop_after_violation()
            raise PolicyViolation([f"inspection failed: {exc}"]) from exc
        violations = inspect_policy(
            snapshot.engine_version, snapshot.containers, snapshot.networks, mode=plan.mode,
            mount_roots=[str(root) for root in self._mount_roots], pids_limit=self._checked_pids_limit(),
            cpus=self.task_env_config.cpus, memory_mb=self.task_env_config.memory_mb,
        )  # fmt: skip
        if violations:
            await self._stop_after_violation()
            raise PolicyViolation(violations)
        record = policy_record(
            snapshot,
            mode=plan.mode,
            session_id=self.session_id,
            inference_domains=plan.inference_domains,
            gateway_authorities=plan.gateway_authorities,
            proxy_image=plan.proxy_image,
        )
        self.policy_record_path.write_text(json.dumps(record, indent=2) + "\n")

    async def _stop_after_violation(self) -> None:
        # delete=False: never remove the shared task or proxy images here;
        # Pier's own cleanup runs `stop` again with the job's setting.
        try:
            await self.stop(delete=False)
        except Exception as exc:
            self.logger.warning(f"stopping after a policy violation failed: {exc}")

    async def stop(self, delete: bool) -> None:
        """Stop like Pier, except that `delete` never removes images named in compose.

        Pier's `down --rmi all` would also delete the pinned proxy image (and
        the task's prebuilt image) that other trials on this host share;
        `--rmi local` removes only the images compose built for this trial.
        """
        await asyncio.to_thread(self._keep_proxy_log)
        self._close_docker()
        if not delete or self._keep_containers:
            await super().stop(delete)
            return
        try:
            await self._run_docker_compose_command(
                ["down", "--rmi", "local", "--volumes", "--remove-orphans"]
            )
        except Exception as exc:
            self.logger.warning(f"Docker compose down failed: {exc}")
        self._cleanup_resources_compose_file()

    # --- file transfers: the Engine's archive API and network.transfer, never a mount or `compose cp` ---

    def _keep_proxy_log(self) -> None:
        """Copy the proxy's access log into the policy directory (`PROXY_ACCESS_LOG`), best effort.

        What the agent's plain-HTTP model calls got from the gateway (status,
        Retry-After, squid's error for a reset or refused connection) is read
        from it when the trial is collected (`worker.pier.provider`).
        """
        if self._plan is None or self._plan.mode != "isolated-allowlist":
            return
        try:
            labels = [
                f"{COMPOSE_PROJECT_LABEL}={self.compose_project}",
                f"{COMPOSE_SERVICE_LABEL}={PROXY_SERVICE}",
            ]
            found = self._client().containers.list(all=True, filters={"label": labels})
            if len(found) != 1:
                return
            # squid logs a call when it ends: one still waiting for the gateway (an agent that timed
            # out on it) ends, aborted, once the agent's container is gone, which it is about to be.
            main = self._client().containers.list(filters={"label": self._main_labels, "status": "running"})
            if main and not self._keep_containers:
                main[0].kill()
                time.sleep(PROXY_LOG_SETTLE_SEC)
            chunks, _stat = self._client().api.get_archive(str(found[0].id), SQUID_ACCESS_LOG)
            stream = io.BufferedReader(ChunkReader(chunks), buffer_size=1024 * 1024)
            # The policy directory is this process's own (`_prepare_egress_proxy_compose`); no link followed.
            trial_fd = open_trial_dir(Path(self.trial_paths.trial_dir))
            try:
                fd = open_dir(trial_fd, ["network-policy", self.session_id], create=False)
            finally:
                os.close(trial_fd)
            try:
                extract_file(stream, fd, PROXY_ACCESS_LOG, max_bytes=PROXY_LOG_MAX_BYTES)
            finally:
                os.close(fd)
        except (DockerException, requests.RequestException, OSError, TransferRefused) as exc:
            self.logger.warning(f"the proxy's access log was not kept: {exc}")
            self._close_docker()
