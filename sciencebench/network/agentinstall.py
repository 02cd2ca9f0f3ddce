"""How a trial's agent gets into its image: a baked image, or the online install, both with no network.

A baked image (`agent_image`, `sciencebench images bake`) is started as the
prebuilt image, so Pier skips its install. Otherwise, where this worker
installs agents online (`agent_install="online"`), the harness is installed
into the task's pinned image with no network (`network.offlineinstall`) and
that local image is started the same way. Pier's own install build (its
`RUN` steps run the task image's bash, environment and binaries) runs only
where online installs are off, and then, like every build, with no network.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from sciencebench.bake.offline import BakeError
from sciencebench.bake.recipes import RecipeError
from sciencebench.core.agentimages import parse_agent_image_keyword
from sciencebench.core.compose_policy import AGENT_SERVICE
from sciencebench.core.errors import AgentImageMismatch, PolicyRefused
from sciencebench.core.harnesses import bake_of
from sciencebench.core.mirrors import Mirror, parse_mirrors_keyword, through_mirror
from sciencebench.core.settings import DEFAULT_AGENT_ARTIFACTS, raw_setting
from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL, MANAGED_LABEL
from sciencebench.network.containerfiles import ContainerFilesEnvironment
from sciencebench.network.offlineinstall import install_offline


def _mirrors_of(value: object) -> tuple[tuple[Mirror, ...], str]:
    """The `registry_mirrors` keyword's mirrors, and why it is refused ("" when it is not)."""
    try:
        return parse_mirrors_keyword(value), ""
    except ValueError as exc:
        return (), str(exc)


# The `agent_install` keyword: whether this worker installs agents online (with no network in any build).
AGENT_INSTALL_MODES = ("online", "baked")


class AgentInstallEnvironment(ContainerFilesEnvironment):
    """The agent's install: a baked image, or the online install's (made offline), started as prebuilt."""

    def __init__(
        self,
        *args: Any,
        agent_image: object = None,
        agent_install: object = None,
        agent_artifacts: object = None,
        npm_registry: object = None,
        registry_mirrors: object = None,
        **kwargs: Any,
    ) -> None:
        self._mirrors, self._mirrors_problem = _mirrors_of(registry_mirrors)
        config = kwargs.get("task_env_config")
        if self._mirrors and config is not None and config.docker_image:
            # Before Pier's own setup, which names the prebuilt image from it (`PREBUILT_IMAGE_NAME`).
            image = self._local_image(config.docker_image)
            kwargs["task_env_config"] = config.model_copy(update={"docker_image": image})
        self._agent_image = agent_image
        self._agent_install = agent_install
        self._agent_artifacts = Path(
            str(agent_artifacts or raw_setting("agent_artifacts") or DEFAULT_AGENT_ARTIFACTS)
        )
        self._npm_registry = str(npm_registry or raw_setting("npm_registry") or "") or None
        self._force_build = False
        super().__init__(*args, **kwargs)

    def _local_image(self, image: str) -> str:
        """The name the worker pulled `image` by: through its registry's mirror when the worker has one.

        The worker pulls every pinned task image through the mirror of its
        registry (`core.mirrors`), so the trial runs the image by that name:
        the same digest, no pull from the upstream registry. An unpinned name
        (a local image, a build) is left as it is.
        """
        try:
            return through_mirror(image, self._mirrors)
        except ValueError:
            return image

    async def _start_with_agent(self, force_build: bool) -> None:
        """Pier's start, on the baked image when there is one, else on the online install's image."""
        if self._mirrors_problem:
            raise PolicyRefused(self._mirrors_problem)
        self._force_build = force_build
        baked = self._baked_image()
        if baked is None:
            self._check_online_install()
            if self._online_install:
                baked = await self._install_offline()
        if baked is None:
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
        return self._local_image(image)

    def _task_compose_image(self) -> str | None:
        """The image the task's own compose file (as written, already reviewed) names for `main`, if any."""
        try:
            main = self._task_compose_main()
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return None  # compose refuses what cannot be read
        image = main.get("image") if main is not None else None
        return image if isinstance(image, str) else None

    @property
    def _online_install(self) -> bool:
        """Whether the agent is installed online (this worker allows it, and there is an install)."""
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
            main = self._task_compose_main()
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return True  # compose refuses what cannot be read; offline if it builds anyway
        return main is not None and "build" in main

    def _task_compose_main(self) -> dict[str, Any] | None:
        """The `main` service of the task's own compose file, None without one; the reader's errors raise."""
        if not self._uses_compose:
            return None
        compose = yaml.safe_load(self._environment_docker_compose_path.read_text(encoding="utf-8"))
        services = compose.get("services") if isinstance(compose, dict) else None
        main = services.get(AGENT_SERVICE) if isinstance(services, dict) else None
        return main if isinstance(main, dict) else None

    def _check_online_install(self) -> None:
        """Refuse (PolicyRefused) a bad `agent_install` keyword, or an online install into no pinned image."""
        if self._agent_install not in (None, "", *AGENT_INSTALL_MODES):
            raise PolicyRefused(f"agent_install: expected one of {', '.join(AGENT_INSTALL_MODES)}")
        if self._online_install and not self.task_env_config.docker_image:
            raise PolicyRefused(
                "an online agent install needs a task with a pinned docker_image (a Dockerfile-only task's "
                "image is built for the trial); bake the agent image instead"
            )

    def _install_labels(self) -> dict[str, str]:
        """The labels of the online install's containers: the trial's compose project, and the role `install`.

        The task image's code runs there: the trial's disk watch and cleanup find
        its containers by the compose project (`dockerhost.labels`).
        """
        return {COMPOSE_PROJECT_LABEL: self.compose_project, MANAGED_LABEL: "install"}

    async def _install_offline(self) -> str:
        """The task image with the agent installed with no network (`network.offlineinstall`); its local name.

        The version is the one Pier was asked for, else (none, `latest`) the harness's pin.
        Raises PolicyRefused for a harness with no recipe, RuntimeError (as
        Pier's own failed install build) when its artifacts or the install fail.
        """
        install = self.agent_install_spec
        image = self.task_env_config.docker_image
        assert install is not None and image  # `_online_install` and `_check_online_install`
        try:
            pin = bake_of(install.agent_name).version
            version = pin if install.version in (None, "", "latest") else install.version
        except KeyError:
            raise PolicyRefused(
                f"{install.agent_name} cannot be installed online: sciencebench pins no artifacts of it"
            ) from None
        try:
            return await asyncio.to_thread(
                install_offline, image, install.agent_name, version, self._agent_artifacts,
                self._npm_registry, self._install_labels(),
            )  # fmt: skip
        except (RecipeError, BakeError) as exc:
            raise RuntimeError(f"Agent install failed: {exc}") from None
