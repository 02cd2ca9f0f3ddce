"""Pull-through caches of registries: which mirror serves which upstream, the refs they name (pure).

A worker with `--registry-mirror` pulls each pinned task image of a mirrored
registry through its mirror (the Distribution registry in proxy mode, which
serves one upstream: `[UPSTREAM=]HOST:PORT`, docker.io when not named), and
the trial runs it by that name: `docker.io/library/python@sha256:D` becomes
`HOST:PORT/library/python@sha256:D` (`through_mirror`). The digest pins the
content: the Engine checks the manifest it gets hashes to it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sciencebench.core.images import image_digest, image_repository, normalize_repository

DOCKER_HUB = "docker.io"
# The policy environment's keyword (`--ek`) that carries the worker's mirrors (`mirrors_keyword`).
MIRRORS_KEYWORD = "registry_mirrors"
# Docker Hub's other names for itself (the API host, the old index).
_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"})
# A registry as an image reference names it: a host (with a dot, or localhost) or an IPv4/[IPv6] address,
# an optional port. Without a dot or a port, the Engine would read the name as a Docker Hub namespace.
_REGISTRY = re.compile(
    r"^(?:(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*"
    r"|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?$"
)


@dataclass(frozen=True)
class Mirror:
    """A pull-through cache: `host` (`host[:port]`, as an image reference names it) serves `upstream`."""

    upstream: str
    host: str

    def __str__(self) -> str:
        return f"{self.upstream}={self.host}"


def _registry(text: str, what: str) -> str:
    """A registry name as references name it: scheme and a trailing `/` dropped, lowercased; ValueError."""
    name = text.strip().lower()
    for scheme in ("https://", "http://"):
        name = name.removeprefix(scheme)
    name = name.rstrip("/")
    if "/" in name:
        raise ValueError(f"{what} {text.strip()!r} has a path; a registry is served from its root")
    port = name.rpartition(":")[2] if not name.endswith("]") and ":" in name else "0"
    if not _REGISTRY.fullmatch(name) or int(port) > 65535:
        raise ValueError(f"{what} {text.strip()!r} is not a registry host[:port]")
    return DOCKER_HUB if name in _HUB_ALIASES else name


def _distinct_registry(name: str) -> bool:
    """Whether the Engine reads `name` as a registry in a reference (not a Docker Hub namespace)."""
    return "." in name or ":" in name or name == "localhost"


def parse_mirror(text: str) -> Mirror:
    """`[UPSTREAM=]HOST[:PORT]` (a scheme may lead the host; UPSTREAM defaults to docker.io); ValueError."""
    upstream, sep, host = text.partition("=")
    if not sep:
        upstream, host = DOCKER_HUB, text
    up = _registry(upstream, "upstream registry")
    mirror = _registry(host, "mirror")
    if not _distinct_registry(up):
        raise ValueError(f"upstream registry {upstream.strip()!r} needs a port or a dotted name")
    if mirror == DOCKER_HUB:
        raise ValueError(f"mirror {host.strip()!r} is Docker Hub itself")
    if not _distinct_registry(mirror):
        raise ValueError(f"mirror {host.strip()!r} needs a port or a dotted name (else: docker.io)")
    if up == mirror:
        raise ValueError(f"mirror {host.strip()!r} is its own upstream")
    return Mirror(up, mirror)


def parse_mirrors(values: Iterable[str]) -> tuple[Mirror, ...]:
    """Mirrors of an operator's list: each value may hold several, comma- or space-separated; ValueError.

    An upstream named twice is refused: a registry has one mirror.
    """
    mirrors = tuple(parse_mirror(item) for value in values for item in re.split(r"[,\s]+", value) if item)
    seen: set[str] = set()
    for mirror in mirrors:
        if mirror.upstream in seen:
            raise ValueError(f"registry {mirror.upstream} has more than one mirror")
        seen.add(mirror.upstream)
    return mirrors


def through_mirror(ref: str, mirrors: Iterable[Mirror]) -> str:
    """`ref` as its registry's mirror serves it (`MIRROR/path@sha256:...`, tag dropped); `ref` without one.

    Raises ValueError for a ref that is not pinned.
    """
    by_upstream = {mirror.upstream: mirror.host for mirror in mirrors}
    if not by_upstream:
        return ref
    registry, _, path = normalize_repository(image_repository(ref)).partition("/")
    host = by_upstream.get(registry)
    return f"{host}/{path}@{image_digest(ref)}" if host else ref


def upstream_name(repository: str, mirrors: Iterable[Mirror]) -> str:
    """A normalized repository name, a mirror's named as its upstream's (`docker.io/library/python`)."""
    registry, _, path = repository.partition("/")
    for mirror in mirrors:
        if mirror.host == registry:
            return normalize_repository(f"{mirror.upstream}/{path}")
    return repository


def mirrors_keyword(mirrors: Iterable[Mirror]) -> str:
    """The `--ek` value handing the worker's mirrors to the trial's environment (JSON: upstream -> host)."""
    return json.dumps({mirror.upstream: mirror.host for mirror in mirrors}, sort_keys=True)


def parse_mirrors_keyword(value: object) -> tuple[Mirror, ...]:
    """The mirrors of a `registry_mirrors` keyword (None: none); ValueError for a bad one.

    Pier hands `--ek` values over JSON-decoded when they parse: a dict, or its JSON text.
    """
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{MIRRORS_KEYWORD}: not JSON") from None
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"{MIRRORS_KEYWORD}: expected an object of upstream registry -> mirror host")
    return parse_mirrors(f"{upstream}={host}" for upstream, host in value.items())
