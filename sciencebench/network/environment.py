r"""`IsolatedDockerEnvironment`: Pier's Docker environment under the offline network policy.

Selected with::

    pier run ... --environment-import-path \\
        sciencebench.network.environment:IsolatedDockerEnvironment \\
        --ek 'inference_urls=["http://gw:4000/v1"]'

Pier builds the separate verifier environment from the same class and
keywords. Each environment decides its mode from the agent's provider
allowlist: an allowlist (codex, claude-code, ...) gives `isolated-allowlist`
(agent on an internal isolated bridge, a pinned squid proxy as the only way
out); no allowlist (nop, oracle, verifiers) gives `network_mode: none`.

Lifecycle (`start`): plan (refuse what the policy cannot run) -> check the
task's files as written (`core.compose_policy.review_task_dir`) -> Pier's own
start with the policy compose override, where each compose command that
could build, create or start anything is preceded by its own `docker compose
config` over Pier's exact file list and environment, and the rendered model
is checked against the same allowlist -> inspect the real containers and networks
within 15 s -> stop and raise on any deviation, otherwise write
`network-policy-<session>.json` into the trial directory. The agent is set up
by Pier only after `start` returns.

Builds: every image build the trial causes (a Dockerfile-only task, a task's
own compose `build:`, a verifier without an image, Pier's derived agent
build) gets `build.network: none` from the policy override, and the rendered
model of any trial that builds is checked for it before `build`. The one
exception is Pier's online agent install (`agent_install="online"`): it may
build with the network only `FROM` the task's pinned image, in a context
holding nothing but Pier's Dockerfile, and only when that image has no
`ONBUILD` triggers (checked before the build).

Every `docker compose` runs with an allowlisted environment
(`network.composeenv`), never Pier's whole one with the task's env on top,
and with `--env-file /dev/null`, so a `.env` file in the task is never read.

Host-side files: no host directory is mounted into a trial container (no
log mounts, `capabilities.mounted` false, so Pier copies logs, rewards and
artifacts explicitly), and every copy goes through the Engine's archive API
and `network.transfer`: nothing a container wrote (a link, a device) is
ever followed or created on the host, and what was refused is written to
the trial's `transfer-refusals.json`.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import posixpath
import stat
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker
import requests
import yaml
from docker.errors import DockerException, NotFound
from pier.environments.agent_setup import new_proxy_token, proxy_environment, write_agent_dockerfile
from pier.environments.base import ExecResult
from pier.environments.capabilities import EnvironmentCapabilities
from pier.environments.docker.docker import _sanitize_docker_compose_project_name

from sciencebench.core.agentimages import parse_agent_image_keyword
from sciencebench.core.compose_policy import (
    AGENT_SERVICE,
    compose_problems,
    interpolation,
    review_task,
    review_task_dir,
    task_user_problem,
)
from sciencebench.core.envfile import harness_key_problem
from sciencebench.core.errors import ProfileError
from sciencebench.core.gateways import Gateway, parse_gateway
from sciencebench.core.images import check_image_ref
from sciencebench.core.settings import PROXY_IMAGE_ENV, raw_setting
from sciencebench.network.compose import (
    PROXY_SERVICE,
    Mode,
    ProxyFiles,
    build_network_problems,
    policy_compose,
)
from sciencebench.network.composeenv import compose_environment, exec_names, explicit_exec_values, from_worker
from sciencebench.network.errors import AgentImageMismatch, PolicyRefused, PolicyViolation, TransferRefused
from sciencebench.network.execenv import SecretSafeExecEnvironment
from sciencebench.network.inspection import (
    INSPECT_TIMEOUT_SEC,
    collect_snapshot,
    inspect_policy,
    policy_record,
)
from sciencebench.network.onbuild import onbuild_triggers
from sciencebench.network.squid import (
    PROXY_PORT,
    normalize_domains,
    passwd_line,
    render_squid_conf,
)
from sciencebench.network.transfer import (
    ChunkReader,
    Refusal,
    Transfer,
    build_tar,
    directory_headers,
    extract,
    extract_file,
    open_dir,
    open_trial_dir,
    posix_parts,
    record_refusals,
    trial_relative,
)
from sciencebench.worker.docker.hostlocks import owner_id
from sciencebench.worker.docker.labels import COMPOSE_PROJECT_LABEL, COMPOSE_SERVICE_LABEL

# Compose commands that build, create or run nothing: they need no rendered-model check first.
_INERT_COMMANDS = frozenset({"config", "down", "stop", "ps"})
# The `agent_install` keyword: whether Pier's agent install may build with the network.
AGENT_INSTALL_MODES = ("online", "baked")
# Compose commands that build, create, pull or start something: each is preceded by its own check.
_STARTING_COMMANDS = frozenset({"build", "up", "create", "start", "run", "restart", "pull"})
# Per-request timeout of the Engine's archive API (a transfer of up to 2 GiB streams within it).
TRANSFER_TIMEOUT_SEC = 300
# The proxy's access log, kept in the trial's policy directory when the trial stops.
PROXY_ACCESS_LOG = "squid-access.log"
SQUID_ACCESS_LOG = "/tmp/squid-access.log"  # noqa: S108 (inside the proxy container, squid.conf's access_log)
PROXY_LOG_MAX_BYTES = 16 * 1024 * 1024
PROXY_LOG_SETTLE_SEC = 0.5  # for squid to log the calls the agent's container left open
_LOG_DIR_MODE = 0o777


@dataclass(frozen=True)
class EgressPlan:
    """What one environment will run: its mode and, in egress mode, what the proxy allows."""

    mode: Mode
    domains: tuple[str, ...] = ()
    gateways: tuple[Gateway, ...] = ()
    proxy_image: str | None = None

    @property
    def inference_domains(self) -> list[str]:
        """Every host the proxy lets through (allowlist entries and gateway hosts)."""
        return sorted(set(self.domains) | {g.host for g in self.gateways})

    @property
    def gateway_authorities(self) -> list[str]:
        """`host:port` of every configured gateway, sorted."""
        return sorted({g.authority for g in self.gateways})


def parse_inference_urls(value: object) -> list[Gateway]:
    """Gateways from the `inference_urls` environment keyword.

    Pier hands `--ek` values over JSON-decoded when they parse, so `value` is
    a list of URLs, a single URL, a JSON list still in a string, or None.
    Raises PolicyRefused for anything that is not an http(s) URL with a valid
    host and port (the URL itself is not echoed: it may embed a credential).
    """
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.lstrip().startswith("[") else [value]
        except json.JSONDecodeError:
            raise PolicyRefused("inference_urls: not a JSON list of URLs") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyRefused("inference_urls: expected a list of URL strings")
    gateways: list[Gateway] = []
    for position, url in enumerate(value, start=1):
        try:
            gateways.append(parse_gateway(url, f"inference_urls[{position}]"))
        except ProfileError as exc:
            raise PolicyRefused(str(exc)) from None
    return list(dict.fromkeys(gateways))


def plan_egress(
    *,
    allow_internet: bool,
    uses_compose: bool,
    allowlist_domains: Sequence[str],
    inference_urls: object,
    proxy_image: str | None,
) -> EgressPlan:
    """Decide the mode of one environment, or refuse it.

    Egress exists only when the harness declares a provider allowlist. With a
    gateway configured (`inference_urls`, the job profile's gateways) the
    proxy allows those gateways and nothing else: the harness's own
    allowlist (Pier's provider defaults such as `api.openai.com` or
    `.amazonaws.com`) is replaced, not added to. Without one, the allowlist's
    exact hosts are allowed on 80/443. A digest-pinned proxy image is
    required. Raises PolicyRefused when the task allows internet, a gateway
    URL is invalid or names an IPv6 host, the allowlist used has a suffix or
    an invalid entry, the proxy image is missing or not pinned, or a task's own
    docker-compose.yaml would be combined with egress.
    """
    if allow_internet:
        raise PolicyRefused("task sets allow_internet = true; the offline network policy refuses it")
    gateways = parse_inference_urls(inference_urls)
    if not allowlist_domains:
        return EgressPlan(mode="none")
    domains = [] if gateways else _exact_hosts(allowlist_domains)
    if uses_compose:
        raise PolicyRefused("inference egress is not supported for tasks with their own docker-compose.yaml")
    if not proxy_image:
        raise PolicyRefused(
            f"no inference proxy image configured: set {PROXY_IMAGE_ENV} "
            "(or --ek proxy_image=...) to a digest-pinned squid image"
        )
    try:
        check_image_ref(proxy_image)
    except ValueError as exc:
        raise PolicyRefused(f"proxy image: {exc}") from None
    render_squid_conf(domains, gateways)  # refuses what the proxy cannot express (an IPv6 gateway), now
    return EgressPlan(
        mode="isolated-allowlist",
        domains=tuple(domains),
        gateways=tuple(gateways),
        proxy_image=proxy_image,
    )


def _exact_hosts(allowlist_domains: Sequence[str]) -> list[str]:
    """The harness's allowlist as the proxy's hosts, used when no gateway is configured (or PolicyRefused)."""
    try:
        return normalize_domains(allowlist_domains)
    except PolicyRefused as exc:
        raise PolicyRefused(
            f"the harness's network allowlist cannot be used without a gateway: {exc}; "
            "configure the provider's gateway URL in the job's --env-file (docs/gateways.md)"
        ) from None


def _read_no_follow(path: Path) -> bytes:
    """The bytes of the regular file `path` (not a symlink, not special); OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path.name}: not a regular file")
        return handle.read()


class IsolatedDockerEnvironment(SecretSafeExecEnvironment):
    """Pier's DockerEnvironment with the offline network policy enforced and verified.

    Extra keywords (from `--ek`): `inference_urls`, the gateway base URLs
    whose `host:port` the proxy allows; `proxy_image`, the proxy image ref
    (default: the `SCIENCEBENCH_PROXY_IMAGE` environment variable, for a
    direct `pier run`); `owner`, the worker host state's id that labels every
    container (default: computed from this host's state dir); `agent_image`,
    `{agent, version, image}` of the task image with the agent preinstalled
    (`sciencebench images bake`), run instead of Pier's per-trial install
    build; `agent_install`, `online` (the default) when this worker lets
    Pier's agent install build with the network, `baked` when every build
    runs with none. A worker passes `proxy_image` and `owner`, so Pier's process
    environment holds none of its settings. `start` raises PolicyRefused or
    PolicyViolation (both PolicyError), and AgentImageMismatch for an image
    baked for another agent or version.
    """

    def __init__(
        self,
        *args: Any,
        inference_urls: object = None,
        proxy_image: str | None = None,
        owner: str | None = None,
        agent_image: object = None,
        agent_install: object = None,
        **kwargs: Any,
    ) -> None:
        # Decisions that can fail wait for start(): an exception raised here
        # would abort Pier's whole job instead of being recorded on the trial.
        self._agent_image = agent_image
        self._agent_install = agent_install
        self._force_build = False
        self._inference_urls = inference_urls
        self._proxy_image = proxy_image or raw_setting("proxy_image") or None
        self._owner = str(owner) if owner else None
        self._plan: EgressPlan | None = None
        self._policy_compose_path: Path | None = None
        self._interpolated: dict[tuple[Path, ...], frozenset[str]] = {}
        # The last rendered verdict: the file list it was for, and its refusal (None: it passed).
        self._rendered: tuple[tuple[Path, ...], str | None] | None = None
        self._docker_client: docker.DockerClient | None = None
        self._main_id: str | None = None
        self._log_dirs_made = False
        # No host directory is mounted: Pier's own log mounts (the separate
        # verifier's included) are dropped; the logs are copied instead.
        self._dropped_mounts = list(kwargs.pop("mounts_json", None) or [])
        kwargs["mounts_json"] = []
        super().__init__(*args, **kwargs)
        self._mounts_json = []

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """Pier's Docker capabilities, except that nothing is mounted: Pier copies every file explicitly."""
        capabilities: EnvironmentCapabilities = super().capabilities
        return capabilities.model_copy(update={"mounted": False})

    def _default_log_mounts(self) -> list[Any]:
        """No log mounts: a container never writes into a host directory."""
        return []

    async def prepare_logs_for_host(self) -> None:
        """Nothing to do: the host's copies are created by this process, never by a container."""

    async def _chown_to_host_user(self, path: str, recursive: bool = False) -> None:
        """Nothing to do (see `prepare_logs_for_host`)."""

    @property
    def policy_dir(self) -> Path:
        """Per-session directory, inside the trial directory, for the policy's files."""
        return Path(self.trial_paths.trial_dir) / "network-policy" / self.session_id

    @property
    def policy_record_path(self) -> Path:
        """Where the trial keeps `network-policy-<session>.json`."""
        return Path(self.trial_paths.trial_dir) / f"network-policy-{self.session_id}.json"

    @property
    def compose_project(self) -> str:
        """This environment's compose project, as Pier names it."""
        return str(_sanitize_docker_compose_project_name(self.session_id))

    @property
    def _docker_compose_paths(self) -> list[Path]:
        paths: list[Path] = list(super()._docker_compose_paths)
        # Last, so its scalars (network_mode, stop_signal, ...) win.
        if self._policy_compose_path is not None and self._policy_compose_path not in paths:
            paths.append(self._policy_compose_path)
        return paths

    def _make_plan(self) -> EgressPlan:
        return plan_egress(
            allow_internet=bool(self.task_env_config.allow_internet),
            uses_compose=bool(self._uses_compose),
            allowlist_domains=list(self.network_allowlist.domains),
            inference_urls=self._inference_urls,
            proxy_image=self._proxy_image,
        )

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
            squid_conf.write_text(render_squid_conf(plan.domains, plan.gateways))
            passwd.write_text(passwd_line(token))
            # squid's auth helper runs as the unprivileged `proxy` user.
            for path in (squid_conf, passwd):
                path.chmod(0o644)
            proxy = ProxyFiles(
                image=plan.proxy_image,
                squid_conf=str(squid_conf.resolve()),
                passwd=str(passwd.resolve()),
            )
            self._egress_proxy_env = proxy_environment(token, PROXY_SERVICE, PROXY_PORT)
        compose_path = directory / "docker-compose-policy.json"
        owner = self._owner or owner_id()
        offline_build = self._builds and not self._online_install
        compose = policy_compose(plan.mode, proxy, owner, offline_build=offline_build)
        compose_path.write_text(json.dumps(compose, indent=2))
        self._policy_compose_path = compose_path
        if plan.mode == "isolated-allowlist":
            # Pier appends its no-network file only when no egress file is set.
            self._egress_proxy_compose_path = compose_path

    @property
    def _task_dir(self) -> Path:
        """The task directory this environment's files come from (the nearest one holding task.toml).

        Found lexically from the directory Pier names (`<task>/environment`,
        `<task>/tests`, `<task>/steps/<name>/tests`), never through a symlink's
        target: `_check_task_files` refuses a symlink on the way.
        """
        start = Path(os.path.normpath(Path(self.environment_dir).absolute()))
        return next((d for d in start.parents if (d / "task.toml").is_file()), start.parent)

    @property
    def _mount_roots(self) -> list[Path]:
        """Where bind mounts may come from: the trial directory (Pier's logs) and the task directory."""
        return [Path(self.trial_paths.trial_dir).resolve(), self._task_dir.resolve()]

    def _check_task_files(self) -> None:
        """Refuse a task whose files the policy refuses (`review_task_dir`), before anything starts.

        On a worker the task directory is the try's snapshot (`worker.snapshot`,
        Pier's `--path`): what is checked here is what Pier builds, mounts and copies.
        """
        task_dir = self._task_dir
        here = Path(os.path.normpath(Path(self.environment_dir).absolute()))
        while here != task_dir and task_dir in here.parents:
            if here.is_symlink():
                raise PolicyRefused(f"{here.name} is a symlink; a task's files must be inside it")
            here = here.parent
        if task_dir.is_symlink():  # `_task_dir` and `_mount_roots` would follow it
            raise PolicyRefused(f"the task directory {task_dir.name} is a symlink; refused")
        try:
            # Pier needs a task.toml; without one (the class used directly) there are no env tables.
            has_toml = os.path.lexists(task_dir / "task.toml")
            review = review_task_dir(task_dir) if has_toml else review_task(task_dir, {})
        except (OSError, ValueError) as exc:
            raise PolicyRefused(f"the task's files are unreadable ({exc.__class__.__name__})") from None
        if review.problems:
            raise PolicyRefused(f"the task asks for what the policy refuses: {'; '.join(review.problems)}")

    def _interpolated_names(self, paths: tuple[Path, ...]) -> frozenset[str]:
        """Every variable the compose files interpolate (unreadable files add none: compose fails on them)."""
        if paths not in self._interpolated:
            names: set[str] = set()
            for path in paths:
                try:
                    names |= interpolation(path.read_text(encoding="utf-8"))[0]
                except (OSError, UnicodeDecodeError):
                    continue
            self._interpolated[paths] = frozenset(names)
        return self._interpolated[paths]

    def _compose_env(self, command: list[str]) -> tuple[list[str], dict[str, str]]:
        """The command and environment of one `docker compose` (`network.composeenv`)."""
        values = self._compose_process_env()  # what Pier would have given: the source of named values
        pier_variables = self._env_vars.to_env_dict(include_os_env=False)
        if self._windows_container_name:
            pier_variables["PIER_CONTAINER_NAME"] = self._windows_container_name
        names = self._interpolated_names(tuple(self._docker_compose_paths)) | set(exec_names(command))
        env = compose_environment(os.environ, pier_variables, values, names)
        return explicit_exec_values(command, env, values), env

    async def _run_docker_compose_command(
        self, command: list[str], check: bool = True, timeout_sec: int | None = None
    ) -> ExecResult:
        """Pier's compose runner with an allowlisted environment, after the rendered-model check.

        Raises PolicyRefused, before running `command`, when the model
        `docker compose config` renders for a task compose file is refused.
        A command that builds, creates or starts anything is checked on its
        own rendering, never on an earlier command's verdict.
        """
        if command[:1] and command[0] not in _INERT_COMMANDS:
            await self._check_rendered(fresh=command[0] in _STARTING_COMMANDS)
        return await self._compose(command, check=check, timeout_sec=timeout_sec)

    async def _compose(
        self, command: list[str], check: bool = True, timeout_sec: int | None = None, stderr: bool = False
    ) -> ExecResult:
        # Pier's `_run_docker_compose_command`, except for the environment and the `.env` file;
        # `stderr`: keep it apart (compose's warnings would corrupt `config`'s JSON).
        command, env = self._compose_env(command)
        full_command = [
            "docker", "compose", "--env-file", os.devnull,
            "--project-name", self.compose_project,
            "--project-directory", str(Path(self.environment_dir).resolve().absolute()),
        ]  # fmt: skip
        for path in self._docker_compose_paths:
            full_command += ["-f", str(path.resolve().absolute())]
        full_command += command
        process = await asyncio.create_subprocess_exec(
            *full_command,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE if stderr else asyncio.subprocess.STDOUT,
        )
        try:
            output = await asyncio.wait_for(process.communicate(), timeout=timeout_sec or None)
        except TimeoutError:
            process.terminate()
            try:
                await asyncio.wait_for(process.communicate(), timeout=5)
            except TimeoutError:
                process.kill()
                await process.communicate()
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
        stdout_bytes, stderr_bytes = output
        result = ExecResult(
            stdout=stdout_bytes.decode(errors="replace") if stdout_bytes else None,
            stderr=stderr_bytes.decode(errors="replace") if stderr_bytes else None,
            return_code=process.returncode or 0,
        )
        if check and result.return_code != 0:
            raise RuntimeError(
                f"Docker compose command failed for environment {self.environment_name}. "
                f"Command: {' '.join(full_command)}. Return code: {result.return_code}. "
                f"Stdout: {result.stdout}. "
            )
        return result

    async def _check_rendered(self, fresh: bool = True) -> None:
        """Check the model compose will run, rendered from Pier's exact files and environment.

        Only a task's own compose file can put anything of the task into the
        model: without one every file is Pier's or the policy's, and the
        environment holds only Pier's variables. `fresh`: render it now (for
        a command that builds, creates or starts anything: what the files
        name may have changed since an earlier command); otherwise the last
        verdict for the same file list stands (`exec`, `cp`). Raises PolicyRefused.
        """
        paths = tuple(self._docker_compose_paths)
        if not self._uses_compose and not self._builds:
            return
        if fresh or self._rendered is None or self._rendered[0] != paths:
            self._rendered = (paths, await self._rendered_refusal())
        if self._rendered[1] is not None:
            raise PolicyRefused(self._rendered[1])

    async def _rendered_refusal(self) -> str | None:
        """Why the model `docker compose config` renders is refused, or None when it may run."""
        rendered = await self._compose(["config", "--format", "json"], check=False, stderr=True)
        secrets = self._job_values()
        if rendered.return_code != 0:
            tail = (rendered.stderr or "").strip().splitlines()[-1:] or ["no output"]
            return f"docker compose config refused the task's compose file: {_masked(tail[0][:300], secrets)}"
        try:
            model = json.loads(rendered.stdout or "")
        except json.JSONDecodeError:
            return "docker compose config printed no JSON model"
        # No bind mount may be written: Pier's log mounts are gone (logs are copied), the task's read-only.
        problems = build_network_problems(model, self._online_context())
        if self._uses_compose:
            problems += compose_problems(
                model,
                Path(self.environment_dir),
                self._mount_roots,
                rendered=True,
                project=self.compose_project,
            )
        if problems := list(dict.fromkeys(problems)):
            return "the rendered compose model asks for what the policy refuses: " + _masked(
                "; ".join(problems), secrets
            )
        return None

    def _job_values(self) -> list[str]:
        """Values of Pier's environment a job may have set (env file, `--agent-env`): masked in messages.

        A job can set no name that steers the harness: those, like the names compose
        takes from the worker (user, locale), are the worker's own.
        """
        return [v for k, v in os.environ.items() if harness_key_problem(k) is None and not from_worker(k)]

    async def start(self, force_build: bool) -> None:
        """Start under the policy, then verify it before Pier sets up the agent.

        Raises PolicyRefused before anything is started (including a task
        whose files, or whose rendered compose model, the policy refuses),
        and PolicyViolation
        (after stopping the environment) when inspection fails or cannot
        finish within 15 s.
        """
        self._plan = self._make_plan()
        if self._dropped_mounts:
            targets = ", ".join(str(m.get("target")) for m in self._dropped_mounts if isinstance(m, dict))
            self.logger.debug(f"mounts not made (their files are copied instead): {targets}")
        self._check_task_files()
        self._force_build = force_build
        baked = self._baked_image()
        if baked is None:
            await self._check_online_install()
            await super().start(force_build=force_build)
        else:
            # Pier builds a derived image whenever the environment has an install
            # spec; the baked image is that build, done once. The spec is back
            # before the agent's setup, which sees its own name and skips the install.
            install = self.agent_install_spec
            self.task_env_config = self.task_env_config.model_copy(update={"docker_image": baked})
            self._env_vars.prebuilt_image_name = baked
            self.agent_install_spec = None
            try:
                await super().start(force_build=force_build)
            finally:
                self.agent_install_spec = install
        await self._enforce(self._plan)
        if not self._log_dirs_made:
            await asyncio.to_thread(self._make_log_dirs)

    def _baked_image(self) -> str | None:
        """The baked image to run for this environment's agent, None to run Pier's way."""
        try:
            parsed = parse_agent_image_keyword(self._agent_image)
        except ValueError as exc:
            raise AgentImageMismatch(str(exc)) from None
        install = self.agent_install_spec
        if parsed is None or install is None:  # no baked image, or the verifier's environment
            return None
        agent, version, image = parsed
        if install.agent_name != agent or install.version not in (None, version):
            raise AgentImageMismatch(
                f"agent_image was baked for {agent} {version}; this trial's agent is "
                f"{install.agent_name} {install.version or '(any version)'}"
            )
        return image

    @property
    def _online_install(self) -> bool:
        """Whether Pier's agent install builds with the network (this worker allows it, and there is one)."""
        mode = "online" if self._agent_install in (None, "") else self._agent_install
        return mode == "online" and self.agent_install_spec is not None

    @property
    def _builds(self) -> bool:
        """Whether `main` is built for this trial (not Pier's `_use_prebuilt`, or the task's own `build:`)."""
        prebuilt = (
            not self._force_build and self.task_env_config.docker_image and self.agent_install_spec is None
        )
        return not prebuilt or self._task_compose_builds()

    def _task_compose_builds(self) -> bool:
        """Whether the task's own compose file (as written, already reviewed) gives `main` a build."""
        if not self._uses_compose:
            return False
        try:
            compose = yaml.safe_load(self._environment_docker_compose_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return True  # compose refuses what cannot be read; offline if it builds anyway
        services = compose.get("services") if isinstance(compose, dict) else None
        main = services.get(AGENT_SERVICE) if isinstance(services, dict) else None
        return isinstance(main, dict) and "build" in main

    async def _check_online_install(self) -> None:
        """Refuse an online agent install that would run anything of the task's with the network.

        Pier's install build is `FROM` the task's pinned image in an otherwise
        empty context; a Dockerfile-only task would have its own Dockerfile in
        it, and `ONBUILD` triggers of the image would run first. Raises
        PolicyRefused (nothing built) or, for a bad keyword, PolicyRefused too.
        """
        if self._agent_install not in (None, "", *AGENT_INSTALL_MODES):
            raise PolicyRefused(f"agent_install: expected one of {', '.join(AGENT_INSTALL_MODES)}")
        if not self._online_install:
            return
        image = self.task_env_config.docker_image
        if not image:
            raise PolicyRefused(
                "an online agent install needs a task with a pinned docker_image (a Dockerfile-only task's "
                "own build steps would run with the network); bake the agent image instead"
            )
        try:
            triggers = await asyncio.to_thread(onbuild_triggers, image)
        except (DockerException, requests.RequestException, OSError) as exc:
            raise PolicyRefused(
                f"the task image {image} could not be inspected for ONBUILD triggers "
                f"({exc.__class__.__name__})"
            ) from None
        if triggers:
            raise PolicyRefused(
                f"the task image {image} has {len(triggers)} ONBUILD trigger(s), which Pier's online agent "
                "install build would run with the network; refused"
            )

    def _online_context(self) -> Path | None:
        """Pier's online agent-install build context, if it holds only the Dockerfile Pier writes for it.

        That Dockerfile is written again here, by Pier's own
        `write_agent_dockerfile`, from the same install spec, the task's
        pinned image and the agent's user (which must be a plain name or
        `uid[:gid]`, as the task review requires): the context's must be
        byte for byte the same, so no line of anyone else's builds with the
        network.
        """
        context = self._agent_build_context_dir
        image = self.task_env_config.docker_image
        install = self.agent_install_spec
        if not self._online_install or context is None or not image or install is None:
            return None
        user = self._resolve_user(None)
        if task_user_problem("agent.user", user) is not None:
            return None
        try:
            if os.listdir(context) != ["Dockerfile"]:
                return None
            written = _read_no_follow(Path(context) / "Dockerfile")
            with tempfile.TemporaryDirectory(prefix="sciencebench-online-") as scratch:
                expected = write_agent_dockerfile(
                    build_dir=Path(scratch), source_environment_dir=Path(scratch),
                    prebuilt_image_name=image, install=install, user=user,
                ).read_bytes()  # fmt: skip
        except OSError:
            return None
        return Path(context).resolve() if written == expected else None

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
            mount_roots=[str(root) for root in self._mount_roots],
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

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run a command; Pier's post-`up` chmod of its (unmounted) log directories creates them instead."""
        if not self._log_dirs_made and command == self._pier_log_chmod:
            await asyncio.to_thread(self._make_log_dirs)
            return ExecResult(stdout=None, stderr=None, return_code=0)
        return await super().exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)

    @property
    def _pier_log_chmod(self) -> str:
        # What DockerEnvironment.start runs after `up` (Pier 0.3.0).
        return f"chmod 777 {self._env_paths.agent_dir} {self._env_paths.verifier_dir}"

    def _make_log_dirs(self) -> None:
        """Create the container's log directories (root-owned, mode 777: non-root agents write there)."""
        paths = [self._env_paths.agent_dir, self._env_paths.verifier_dir, self._env_paths.artifacts_dir]
        headers = {h.name: h for p in paths for h in directory_headers(posix_parts(str(p)))}
        leaves = {"/".join(posix_parts(str(p))) for p in paths}
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for name, header in sorted(headers.items()):
                header.mode = _LOG_DIR_MODE if name in leaves else header.mode
                tar.addfile(header)
        self._client().api.put_archive(self._main_container(), "/", archive.getvalue())
        self._log_dirs_made = True

    def _client(self) -> docker.DockerClient:
        if self._docker_client is None:
            self._docker_client = docker.from_env(timeout=TRANSFER_TIMEOUT_SEC)
        return self._docker_client

    def _close_docker(self) -> None:
        # Also drops a connection left with an unread archive (a transfer stopped at a bound).
        if self._docker_client is not None:
            self._docker_client.close()
            self._docker_client = None

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

    @property
    def _main_labels(self) -> list[str]:
        return [f"{COMPOSE_PROJECT_LABEL}={self.compose_project}", f"{COMPOSE_SERVICE_LABEL}=main"]

    def _main_container(self) -> str:
        """The id of this project's `main` container (found by its compose labels)."""
        if self._main_id is None:
            found = self._client().containers.list(all=True, filters={"label": self._main_labels})
            if len(found) != 1:
                raise RuntimeError(f"{self.compose_project}: {len(found)} main containers, expected 1")
            self._main_id = str(found[0].id)
        return self._main_id

    def _archive(self, source: str) -> IO[bytes]:
        chunks, _stat = self._client().api.get_archive(self._main_container(), source)
        return io.BufferedReader(ChunkReader(chunks), buffer_size=1024 * 1024)

    def _refused(self, direction: str, source: str, target: str, refusals: Sequence[Refusal]) -> None:
        """Keep `refusals` in the trial's transfer-refusals.json and the trial's log."""
        if not refusals:
            return
        self.logger.warning(f"{direction} {source} -> {target}: refused {len(refusals)} item(s)")
        try:
            record_refusals(Path(self.trial_paths.trial_dir), direction, source, target, refusals)
        except OSError as exc:
            self.logger.warning(f"could not record transfer refusals: {exc}")

    def _target_fd(self, target: Path, *, parent: bool) -> tuple[int, str]:
        """A no-follow fd of `target` (or of its parent, and the last component) in the trial directory."""
        parts = trial_relative(Path(self.trial_paths.trial_dir), target)
        if parent and len(parts) < 2:
            raise TransferRefused([Refusal(str(target), "a file cannot replace a trial directory")])
        trial_fd = open_trial_dir(Path(self.trial_paths.trial_dir))
        try:
            return open_dir(trial_fd, parts[:-1] if parent else parts), parts[-1]
        except OSError as exc:
            raise TransferRefused([Refusal(str(target), f"host path refused ({exc.strerror})")]) from None
        finally:
            os.close(trial_fd)

    def _download(self, source: str, target: Path, exclude: Sequence[str] = (), *, file: bool) -> Transfer:
        source = posixpath.normpath(source)
        try:
            fd, name = self._target_fd(target, parent=file)
            try:
                stream = self._archive(source)
                if file:
                    return extract_file(stream, fd, name)
                result = extract(stream, fd, strip=posixpath.basename(source), exclude=exclude)
                self._refused("download", source, str(target), result.refusals)
                if any("extraction stopped" in r.reason for r in result.refusals):
                    self._close_docker()
                return result
            finally:
                os.close(fd)
        except TransferRefused as exc:
            self._close_docker()
            self._refused("download", source, str(target), [_as_refusal(r) for r in exc.refusals])
            raise

    def _path_mode(self, path: str) -> int | None:
        """The Go `FileMode` bits of a container path (its last element not followed), None when absent.

        The Engine's archive HEAD request: a stat, no archive, no exec.
        """
        api = self._client().api
        url = api._url("/containers/{0}/archive", self._main_container())  # type: ignore[attr-defined]
        response = api.head(url, params={"path": path})
        if response.status_code == 404:
            return None
        response.raise_for_status()
        header = response.headers.get("X-Docker-Container-Path-Stat", "")
        return int(json.loads(base64.b64decode(header)).get("mode", 0))

    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        """Whether `path` is a directory in the container (a link is not one: it would be refused anyway)."""
        mode = await asyncio.to_thread(self._path_mode, path)
        return mode is not None and bool(mode & _GO_MODE_DIR)

    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        """Whether `path` is a regular file in the container (no type bit in its mode)."""
        mode = await asyncio.to_thread(self._path_mode, path)
        return mode is not None and not mode & _GO_MODE_TYPE

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy one regular file of the container to exactly `target_path` (inside the trial directory).

        Raises TransferRefused (recorded in transfer-refusals.json) when the
        source is a link, a device or a directory, or the target is outside
        the trial directory or reached through a link.
        """
        await asyncio.to_thread(self._download, str(source_path), Path(target_path), file=True)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy the contents of a container directory into `target_dir` (merged, files overwritten).

        Links, devices and other special members are refused one by one
        (recorded); raises TransferRefused when the source itself is not a
        directory or the target is not a trial directory reachable without links.
        """
        await asyncio.to_thread(self._download, str(source_dir), Path(target_dir), file=False)

    async def download_dir_with_exclusions(
        self, *, source_dir: str, target_dir: Path | str, exclude: list[str]
    ) -> None:
        """`download_dir`, leaving out members `exclude` matches (`tar --exclude` patterns)."""
        await asyncio.to_thread(self._download, str(source_dir), Path(target_dir), exclude, file=False)

    def _existing_ancestor(self, path: str) -> tuple[str, list[str]]:
        """The nearest existing directory of `path` in the container, and the components below it."""
        parts = posix_parts(posixpath.normpath(path))
        for keep in range(len(parts), 0, -1):
            candidate = "/" + "/".join(parts[:keep])
            try:
                self._client().api.put_archive(self._main_container(), candidate, _EMPTY_TAR)
            except NotFound:
                continue
            return candidate, parts[keep:]
        return "/", parts

    def _upload(self, source: Path, target: str, *, file: bool) -> None:
        directory = posixpath.dirname(posixpath.normpath(target)) if file else target
        base, missing = self._existing_ancestor(directory)
        try:
            archive, result = build_tar(
                source, missing, file_name=posixpath.basename(target) if file else None
            )
        except TransferRefused as exc:
            self._refused("upload", str(source), target, [_as_refusal(r) for r in exc.refusals])
            raise
        with archive:
            self._refused("upload", str(source), target, result.refusals)
            self._client().api.put_archive(self._main_container(), base, archive)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy one host file to `target_path` in the container (parents created), no link followed."""
        await asyncio.to_thread(self._upload, Path(source_path), str(target_path), file=True)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a host directory's contents into `target_dir` (created if missing); links skipped."""
        await asyncio.to_thread(self._upload, Path(source_dir), str(target_dir), file=False)


# Go's os.FileMode type bits, as the Engine's path stat reports them.
_GO_MODE_DIR = 1 << 31
_GO_MODE_TYPE = sum(
    1 << bit for bit in (31, 27, 26, 25, 24, 21, 19)
)  # dir, symlink, device, pipe, socket, char device, irregular
_EMPTY_TAR = bytes(1024)  # two zero blocks: a valid empty archive (probes that a directory exists)


def _as_refusal(item: object) -> Refusal:
    return item if isinstance(item, Refusal) else Refusal("", str(item))


def _masked(text: str, secrets: Sequence[str]) -> str:
    """`text` with every secret of 4 characters or more replaced by `<redacted>`."""
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "<redacted>")
    return text
