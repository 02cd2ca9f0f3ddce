"""The `ONBUILD` triggers of a pinned image: what a derived build `FROM` it would run first."""

from __future__ import annotations

import docker
from docker.errors import ImageNotFound

INSPECT_TIMEOUT_SEC = 300  # a pull of a missing image may take that long


def onbuild_triggers(image: str, timeout_sec: int = INSPECT_TIMEOUT_SEC) -> list[str]:
    """The image's `Config.OnBuild` instructions (empty: none); pulled first when it is not present.

    Raises docker.errors.DockerException (or requests' errors beneath it)
    when the Engine or the registry cannot answer.
    """
    client = docker.from_env(timeout=timeout_sec)
    try:
        try:
            found = client.images.get(image)
        except ImageNotFound:
            found = client.images.pull(image)
        config = found.attrs.get("Config") or {}
        return [str(trigger) for trigger in config.get("OnBuild") or []]
    finally:
        client.close()
