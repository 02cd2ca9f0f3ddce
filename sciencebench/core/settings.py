"""Settings from SCIENCEBENCH_* environment variables layered over defaults, validated.

One `Settings` object (pydantic-settings) serves both sides. A bad value is
a `SettingsError` (exit 2) naming the variable, never a traceback. This
module owns every SCIENCEBENCH_* variable: each is a `Settings` field, its
name is `env_name(field)`, and no other module reads one from the
environment (`tests/unit/test_settings.py` checks the package's source).
Code that holds no Settings (Pier's plugins, `images bake`) reads one
setting alone with `state_dir_from_env` or `raw_setting`.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlencode, urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sciencebench.core.capacity import Request, host_capacity
from sciencebench.core.errors import ProfileError, SettingsError
from sciencebench.core.gateways import Gateway, parse_gateway_list, public_url
from sciencebench.core.mirrors import Mirror, parse_mirrors
from sciencebench.core.paths import ScratchPaths
from sciencebench.core.sizes import format_size, parse_size

ENV_PREFIX = "SCIENCEBENCH_"
DEFAULT_BROKER_URL = "redis://localhost:6379/0"
# A floor for the broker's visibility timeout: an unacknowledged message older
# than this is delivered again, so it must outlive the longest trial.
VISIBILITY_TIMEOUT_FLOOR_SEC = 6 * 3600
RESULT_EXPIRES_SEC = 14 * 24 * 3600
# A fixed host-local directory shared by every worker process of a host (not a temp file).
DEFAULT_STATE_DIR = Path("/var/tmp/sciencebench")  # noqa: S108
# Where `images bake` finds the agent artifacts scripts/agent-artifacts.sh fetched (a host cache).
DEFAULT_AGENT_ARTIFACTS = Path("/var/tmp/sciencebench-agents")  # noqa: S108
# Processes (tasks) per trial container: a fork bomb in one trial would otherwise
# exhaust the host's pid space for every trial on it. 4096 leaves room for a
# real agent, whose node/python toolchains spawn hundreds of processes.
DEFAULT_PIDS_LIMIT = 4096
# The pids limits a worker accepts: below 16 not even a shell and its verifier start.
MIN_PIDS_LIMIT, MAX_PIDS_LIMIT = 16, 1 << 22
# The most a trial container's writable layer may hold (`worker --disk-limit`): the released
# tasks' storage_mb is 20480.
DEFAULT_DISK_LIMIT = 20 << 30
# The most data (heap) each Pier process of a worker, and each docker CLI it runs, may take
# (`worker --pier-memory`; worker/pier/bounded.py): Pier parses a trial's logs in its own process on
# the host. Below the floor the real Pier's own start and a trial's compose commands are not proven
# to fit (tests/docker/test_pier_memory.py runs a trial at the floor).
DEFAULT_PIER_MEMORY = 4 << 30
MIN_PIER_MEMORY = 1 << 30


class Settings(BaseSettings):
    """The deployment's settings; each field is `SCIENCEBENCH_<FIELD NAME>`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_ignore_empty=True, frozen=True, extra="ignore"
    )

    broker_url: str = DEFAULT_BROKER_URL
    # Empty means: the broker URL.
    result_backend: str = ""
    # TLS to the broker (`rediss://` URLs): the CA file that signed the broker's certificate (empty: the
    # system's CAs), and this client's certificate and key when the broker asks for one (both or neither).
    broker_ca: Path | None = None
    broker_cert: Path | None = None
    broker_key: Path | None = None
    # The first back-off before a provider failure's rerun (doubling, capped; a Retry-After seen wins).
    provider_backoff_sec: float = Field(default=30.0, ge=0, le=24 * 3600)
    provider_backoff_max_sec: float = Field(default=600.0, ge=0, le=24 * 3600)
    # A pull a registry pushed back (429, 5xx, reset, refused, timed out) is tried again, after a back-off
    # shared per registry across the cluster (`coordination.registries`: the registry's Retry-After or
    # RateLimit headers, else doubling from the first back-off with jitter, capped), until this deadline
    # (from the trial's first refused pull); then the trial ends as a registry failure, not the model's.
    registry_deadline_sec: float = Field(default=2 * 3600.0, ge=0, le=7 * 24 * 3600)
    registry_backoff_sec: float = Field(default=30.0, ge=0, le=24 * 3600)
    registry_backoff_max_sec: float = Field(default=900.0, ge=0, le=24 * 3600)
    # A lost host's trial is dispatched again within two lease periods.
    lease_seconds: float = Field(default=60.0, gt=0, le=24 * 3600)
    # At least the floor; 0 (or unset) means the floor.
    visibility_timeout: int = Field(default=0, ge=0)
    state_dir: Path = DEFAULT_STATE_DIR
    # Where running trials' Pier jobs live: host-local, the worker's own (0700), at the same path on the
    # host as in a worker container (bind sources come from it). Empty: `<state_dir>/scratch`.
    scratch_dir: Path | None = None
    hostname: str = Field(default_factory=socket.gethostname, min_length=1)
    # Start Pier from a zygote that imported it once (see worker/pier/zygote.py).
    warm_pier: bool = True
    # A worker runs its own Pier, never one a job names.
    pier_bin: str = Field(default="pier", min_length=1)
    # The digest-pinned inference-proxy image of the network policy (worker hosts).
    proxy_image: str = ""
    # How this host gets agents: "online", the worker installs the pinned harness itself, fetched on
    # the host when missing and installed with no network; "baked", only baked agent images run.
    agent_install: Literal["online", "baked"] = "online"
    # Bytes the task images a worker host pulled may take (`50G`; 0: no budget); see worker/docker/budget.py.
    image_budget: int = Field(default=0, ge=0)
    # Processes each trial container may run (`worker --pids-limit`): the policy's pids limit.
    pids_limit: int = Field(default=DEFAULT_PIDS_LIMIT, ge=MIN_PIDS_LIMIT, le=MAX_PIDS_LIMIT)
    # Bytes a trial container's writable layer may hold (`worker --disk-limit`, `20G`; 0: no watch);
    # past it the trial ends with a ResourceLimitError (worker/diskwatch.py).
    disk_limit: int = Field(default=DEFAULT_DISK_LIMIT, ge=0)
    # Bytes of data each Pier process (and each docker CLI it runs) may take (`worker --pier-memory`,
    # `4G`; 0: unbounded); past it Pier stops and the trial ends with an OutputLimitError.
    pier_memory: int = Field(default=DEFAULT_PIER_MEMORY, ge=0)
    # A worker host's capacity: the CPUs and memory (bytes, `64G`) its running trials' requests may
    # take together (0: detected, less a reserve; `core.capacity`).
    cpus: float = Field(default=0.0, ge=0, le=1 << 16)
    memory: int = Field(default=0, ge=0)
    # Names of further variables of the worker's environment that Pier gets (colon-separated);
    # everything else of the worker's environment stays out of Pier's (see worker/pier/process.py).
    pier_env: Annotated[tuple[str, ...], NoDecode] = ()
    # What a worker serves: every path of a job must resolve under one of these
    # (colon-separated absolute paths in the environment).
    jobs_roots: Annotated[tuple[Path, ...], NoDecode] = ()
    selection_roots: Annotated[tuple[Path, ...], NoDecode] = ()
    env_file_roots: Annotated[tuple[Path, ...], NoDecode] = ()
    # The gateways this host's trials may reach (`worker --gateway`; comma- or space-separated URLs).
    # Empty: any gateway but an internal address; listed: only these (scheme, host, port).
    gateways: Annotated[tuple[Gateway, ...], NoDecode] = ()
    # The addresses of the machine a worker in a container runs on (`worker --host-address`; comma- or
    # space-separated IPs): a container sees only its own, and a gateway on one of these is refused
    # like one on the worker's own (worker/gatewaypins.py).
    host_addresses: Annotated[tuple[str, ...], NoDecode] = ()
    # Where `images bake` and a worker's online install find agent artifacts (`images bake --artifacts`).
    agent_artifacts: Path = DEFAULT_AGENT_ARTIFACTS
    # The npm registry a worker's online install fetches a missing harness tarball from (empty: npm's own).
    npm_registry: str = ""
    # Pull-through caches the task images of their registries are pulled through (`worker
    # --registry-mirror`; comma- or space-separated `[UPSTREAM=]HOST:PORT`, upstream docker.io when
    # not named): one mirror per upstream registry (`core.mirrors`).
    registry_mirror: Annotated[tuple[str, ...], NoDecode] = ()
    # `sciencebench demo --base-image` and `--registry` (click reads these two as the options' values).
    demo_base_image: str = ""
    demo_registry: str = ""

    @field_validator("jobs_roots", "selection_roots", "env_file_roots", "pier_env", mode="before")
    @classmethod
    def _path_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part for part in value.split(":") if part.strip()]
        return value

    @field_validator("gateways", mode="before")
    @classmethod
    def _gateway_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return parse_gateway_list([value], "a gateway")
            except ProfileError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("host_addresses", mode="before")
    @classmethod
    def _address_list(cls, value: Any) -> Any:
        values = value.replace(",", " ").split() if isinstance(value, str) else list(value)
        try:
            return tuple(str(ipaddress.ip_address(str(item).strip("[]"))) for item in values)
        except ValueError as exc:
            raise ValueError(f"not an IP address: {exc}") from None

    @field_validator("registry_mirror", mode="before")
    @classmethod
    def _mirror_list(cls, value: Any) -> Any:
        values = [value] if isinstance(value, str) else list(value)
        return tuple(str(mirror) for mirror in parse_mirrors(str(item) for item in values))

    @property
    def mirrors(self) -> tuple[Mirror, ...]:
        """The registry mirrors this host pulls through (`registry_mirror`, parsed)."""
        return parse_mirrors(self.registry_mirror)

    @field_validator("pier_env")
    @classmethod
    def _not_ours(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        ours = [name for name in value if name.upper().startswith(ENV_PREFIX)]
        if ours:
            raise ValueError(f"{ours[0]}: sciencebench's own settings never reach Pier")
        return value

    @property
    def scratch_root(self) -> Path:
        """The host-local scratch directory of running trials (`scratch_dir`, else `<state_dir>/scratch`)."""
        return self.scratch_dir or ScratchPaths.under(self.state_dir).root

    @field_validator("scratch_dir")
    @classmethod
    def _absolute_dir(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(f"must be an absolute path (got {str(value)!r})")
        return value

    @field_validator("jobs_roots", "selection_roots", "env_file_roots")
    @classmethod
    def _absolute(cls, value: tuple[Path, ...]) -> tuple[Path, ...]:
        relative = [str(path) for path in value if not path.is_absolute()]
        if relative:
            raise ValueError(f"must be absolute paths (got {relative[0]!r})")
        return value

    @field_validator("broker_url", "result_backend")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if value:
            check_redis_url(value)
        return value

    @field_validator("broker_ca", "broker_cert", "broker_key")
    @classmethod
    def _readable_file(cls, value: Path | None) -> Path | None:
        if value is not None and not (value.is_absolute() and os.access(value, os.R_OK) and value.is_file()):
            raise ValueError(f"must be an absolute path of a readable file (got {str(value)!r})")
        return value

    @model_validator(mode="after")
    def _tls_needs_rediss(self) -> Settings:
        if (self.broker_cert is None) != (self.broker_key is None):
            name = "broker_key" if self.broker_key is None else "broker_cert"
            raise ValueError(f"{ENV_PREFIX}{name.upper()}: needs SCIENCEBENCH_BROKER_CERT and _KEY both")
        if self.broker_ca or self.broker_cert:
            plain = [url for url in (self.broker_url, self.backend_url) if not _is_tls(url)]
            if plain:
                raise ValueError(f"{ENV_PREFIX}BROKER_CA/CERT/KEY: TLS to the broker needs rediss:// URLs")
        return self

    def broker_ssl(self, url: str) -> dict[str, Any]:
        """The TLS options of a client of `url` (redis-py's and kombu's names); {} for a plain URL.

        The broker's certificate is always verified: against `broker_ca`, else the system's CAs.
        """
        if not _is_tls(url):
            return {}
        options: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        if self.broker_ca:
            options["ssl_ca_certs"] = str(self.broker_ca)
        if self.broker_cert and self.broker_key:
            options.update(ssl_certfile=str(self.broker_cert), ssl_keyfile=str(self.broker_key))
        return options

    def broker_client_url(self, url: str) -> str:
        """`url` with its TLS options in the query (redis-py's `from_url`); `url` itself when plain."""
        options = {name: "required" if name == "ssl_cert_reqs" else value
                   for name, value in self.broker_ssl(url).items()}  # fmt: skip
        if not options:
            return url
        return f"{url}{'&' if urlsplit(url).query else '?'}{urlencode(options)}"

    @field_validator("state_dir", mode="before")
    @classmethod
    def _state_dir(cls, value: Any) -> Any:
        # " " is as unset as "": the worker and Pier's plugin (state_dir_from_env) must agree.
        return (value.strip() or DEFAULT_STATE_DIR) if isinstance(value, str) else value

    @field_validator("image_budget", "disk_limit", "memory", "pier_memory", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value) if isinstance(value, str) else value

    @field_validator("pier_memory")
    @classmethod
    def _pier_memory(cls, value: int) -> int:
        if problem := pier_memory_problem(value):
            raise ValueError(problem)
        return value

    @field_validator("warm_pier", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        return (value.strip() or True) if isinstance(value, str) else value

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from `env` (default: the process environment).

        Raises SettingsError naming the first bad variable; its value is not
        echoed (a broker URL holds a password).
        """
        try:
            if env is None:
                return cls()
            values: dict[str, Any] = {
                key.removeprefix(ENV_PREFIX).lower(): value
                for key, value in env.items()
                if key.startswith(ENV_PREFIX) and value != ""
            }
            return cls.model_validate(values)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else ""
            message = str(error["msg"]).removeprefix("Value error, ")
            if not field:  # a rule between settings: its message names them
                raise SettingsError(message) from None
            raise SettingsError(f"{ENV_PREFIX}{field.upper()}: {message}") from None

    @property
    def capacity(self) -> Request:
        """This host's capacity: `cpus` and `memory` when set, else detected less the reserve."""
        return host_capacity(self.cpus, self.memory)

    @property
    def backend_url(self) -> str:
        """The result backend: `SCIENCEBENCH_RESULT_BACKEND`, else the broker."""
        return self.result_backend or self.broker_url

    @property
    def visibility_timeout_sec(self) -> int:
        """The broker's visibility timeout: the configured one, at least the floor."""
        return max(self.visibility_timeout, VISIBILITY_TIMEOUT_FLOOR_SEC)

    @property
    def public_broker_url(self) -> str:
        """The broker URL without its password, fit to print or record."""
        return public_url(self.broker_url)


def pier_memory_problem(size: int) -> str | None:
    """Why `size` bytes cannot be Pier's memory bound (below the floor), else None; 0 is unbounded."""
    if 0 < size < MIN_PIER_MEMORY:
        return f"{format_size(size)} is below {format_size(MIN_PIER_MEMORY)}, what Pier needs (0: unbounded)"
    return None


def env_name(field: str) -> str:
    """The environment variable of a `Settings` field: `SCIENCEBENCH_<FIELD>`. KeyError for no field."""
    if field not in Settings.model_fields:
        raise KeyError(f"Settings has no field {field!r}")
    return f"{ENV_PREFIX}{field.upper()}"


STATE_DIR_ENV = env_name("state_dir")
SCRATCH_DIR_ENV = env_name("scratch_dir")
PROXY_IMAGE_ENV = env_name("proxy_image")
AGENT_ARTIFACTS_ENV = env_name("agent_artifacts")
DEMO_BASE_IMAGE_ENV = env_name("demo_base_image")
DEMO_REGISTRY_ENV = env_name("demo_registry")


def raw_setting(field: str) -> str:
    """One setting as the environment holds it ("" when unset), not validated.

    For code that holds no Settings and must not fail on another variable's
    bad value: Pier's plugins, `images bake`.
    """
    return os.environ.get(env_name(field), "")


def state_dir_from_env() -> Path:
    """The host state directory alone, for processes that hold no Settings (Pier's plugins).

    The same value `Settings.state_dir` gives for the same environment.
    """
    configured = raw_setting("state_dir").strip()
    return Path(configured) if configured else DEFAULT_STATE_DIR


def check_redis_url(url: str) -> None:
    """Raise ValueError unless `url` is a Redis URL (or a `;` failover list) with a numeric port and db."""
    for part in url.split(";"):
        parts = urlsplit(part)
        if parts.scheme not in ("redis", "rediss", "unix", "sentinel"):
            raise ValueError("must be a redis://, rediss://, unix:// or sentinel:// URL")
        try:
            parts.port  # noqa: B018 - parsing it is the check
        except ValueError:
            raise ValueError("has a port that is not a number in 0-65535") from None
        database = parts.path.strip("/") if parts.scheme != "unix" else ""
        if database and not database.isdigit():
            raise ValueError("names a database that is not a number")


def _is_tls(url: str) -> bool:
    """Whether every part of a broker URL (a `;` failover list) speaks TLS (`rediss://`)."""
    return all(urlsplit(part).scheme == "rediss" for part in url.split(";"))


def required_visibility_timeout(longest_trial_sec: float) -> int:
    """Visibility timeout a job needs: 1.5x its longest trial, at least the floor."""
    return max(int(longest_trial_sec * 1.5), VISIBILITY_TIMEOUT_FLOOR_SEC)
