"""Agent-ready images: task images with a harness preinstalled, and the file recording them (pure).

Pier installs an installed agent by building a derived image that downloads
nvm, Node or uv and then the agent: impossible on offline worker hosts.
`sciencebench images bake` instead builds, once per (task image digest,
agent, version), the task image with the agent preinstalled, pushes it by
digest and records it in the selection (`AgentImages`). The login node
reads this file (never Docker) at submit: a missing baked image is refused
there, once. Workers run the recorded digest as the environment keyword
`agent_image`, so Pier skips its install.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sciencebench.core.images import ImageRef, check_image_ref, image_digest

# Which agents Pier installs, which can be baked, and their adapters: `sciencebench.core.harnesses`.
# The environment keyword (`--ek agent_image=<json>`) naming a trial's baked image.
AGENT_IMAGE_KEYWORD = "agent_image"


class BakedImage(BaseModel):
    """One task image with one agent version preinstalled, pushed and pinned by digest."""

    model_config = ConfigDict(frozen=True)

    base_image: ImageRef
    agent: str
    version: str
    image: ImageRef
    inputs_sha256: str
    wire_apis: list[str] | None = None  # Codex only: the wire APIs the baked binary accepts
    built_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    def matches(self, base_image: str, agent: str, version: str | None = None) -> bool:
        """Whether this image serves `agent` (at `version`, when given) on `base_image` (by digest)."""
        if self.agent != agent or image_digest(self.base_image) != image_digest(base_image):
            return False
        return version is None or self.version == version

    def keyword(self) -> str:
        """The `--ek` value that hands this image to the trial's environment (JSON)."""
        return json.dumps({"agent": self.agent, "version": self.version, "image": self.image}, sort_keys=True)


class AgentImages(BaseModel):
    """The recorded baked images of a selection.

    <selection>/.sciencebench/agent-images.json
    {"images": [{"base_image": "reg/task@sha256:...", "agent": "codex",
                 "version": "0.169.0", "image": "reg/sciencebench-agents/codex:...@sha256:...",
                 "inputs_sha256": "...", "wire_apis": ["responses"], "built_at": "..."}]}
    """

    images: list[BakedImage] = Field(default_factory=list)

    def find(self, base_image: str, agent: str, version: str | None = None) -> list[BakedImage]:
        """Every recorded image serving `agent` (at `version`, if given) on `base_image`."""
        return [image for image in self.images if image.matches(base_image, agent, version)]

    def replace(self, baked: BakedImage) -> AgentImages:
        """A copy in which `baked` is the one entry for its (base image, agent, version), in place."""
        images = [
            baked if i.matches(baked.base_image, baked.agent, baked.version) else i for i in self.images
        ]
        return AgentImages(images=images if baked in images else [*images, baked])


def load_agent_images(path: Path) -> AgentImages:
    """The recorded images at `path`; empty when the file does not exist.

    Raises ValueError (one line, naming the file) when it exists but is unreadable or malformed.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return AgentImages()
    except OSError as exc:
        raise ValueError(f"{path}: unreadable ({exc.strerror})") from None
    try:
        return AgentImages.model_validate_json(data)
    except ValidationError as exc:
        raise ValueError(f"{path}: not a valid agent image record ({exc.error_count()} error(s))") from None


def parse_agent_image_keyword(value: object) -> tuple[str, str, str] | None:
    """`(agent, version, image)` from the `agent_image` environment keyword, None when unset.

    Pier hands `--ek` values over JSON-decoded, so `value` is a dict (or a
    JSON string of one). Raises ValueError for anything else or an unpinned image.
    """
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{AGENT_IMAGE_KEYWORD}: not JSON") from None
    if not isinstance(value, dict) or not all(
        isinstance(value.get(k), str) for k in ("agent", "version", "image")
    ):
        raise ValueError(f"{AGENT_IMAGE_KEYWORD}: expected {{agent, version, image}} strings")
    check_image_ref(value["image"])
    return value["agent"], value["version"], value["image"]
