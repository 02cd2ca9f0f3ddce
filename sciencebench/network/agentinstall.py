"""How a trial's agent gets into its image: a baked image, or Pier's online install under checks.

A baked image (`agent_image`, `sciencebench images bake`) is started as the
prebuilt image, so Pier skips its install. Otherwise every build runs with
no network, except Pier's online agent install (`agent_install="online"`):
it may build with the network only `FROM` the task's pinned image, in a
context holding nothing but Pier's Dockerfile, and only when that image has
no `ONBUILD` triggers (checked before the build).
"""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import requests
import yaml
from docker.errors import DockerException
from pier.environments.agent_setup import write_agent_dockerfile

from sciencebench.core.agentimages import parse_agent_image_keyword
from sciencebench.core.compose_policy import AGENT_SERVICE
from sciencebench.core.errors import AgentImageMismatch, PolicyRefused
from sciencebench.core.taskreview import task_user_problem
from sciencebench.network.containerfiles import ContainerFilesEnvironment
from sciencebench.network.onbuild import onbuild_triggers

# The `agent_install` keyword: whether Pier's agent install may build with the network.
AGENT_INSTALL_MODES = ("online", "baked")


def _read_no_follow(path: Path) -> bytes:
    """The bytes of the regular file `path` (not a symlink, not special); OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path.name}: not a regular file")
        return handle.read()


class AgentInstallEnvironment(ContainerFilesEnvironment):
    """The agent's install: a baked image started as the prebuilt one, or Pier's, checked first."""

    def __init__(
        self, *args: Any, agent_image: object = None, agent_install: object = None, **kwargs: Any
    ) -> None:
        self._agent_image = agent_image
        self._agent_install = agent_install
        self._force_build = False
        super().__init__(*args, **kwargs)

    async def _start_with_agent(self, force_build: bool) -> None:
        """Pier's start, on the baked image when there is one, else after the online install's check."""
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
