"""Whether a job's pinned images exist in their registries, asked from here without pulling them.

A dry run no worker host pre-warms (no broker, or `--local`) checks its
images this way: one `HEAD /v2/<repository>/manifests/<digest>` per image
(the Registry HTTP API), with an anonymous token when the registry asks for
one. A manifest the registry does not have is bad input; a registry that
cannot be asked (unreachable, or wants credentials) is named as not checked.
Loopback registries are spoken to over plain HTTP and never through a
proxy, as the Docker Engine treats them.
"""

from __future__ import annotations

import ipaddress
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field

from sciencebench.core.errors import TaskSpecError
from sciencebench.core.images import image_digest, image_repository, normalize_repository

TIMEOUT_SEC = 10.0
# The manifest kinds a pinned digest may name: an index (multi-platform) or one image's manifest.
_ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_DOCKER_HUB = "registry-1.docker.io"
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class RegistryCheck:
    """What asking the registries found: images checked, and those that could not be (with why)."""

    checked: int = 0
    unchecked: dict[str, str] = field(default_factory=dict)  # ref -> why it could not be asked

    def line(self) -> str | None:
        """`N image(s) not checked in their registries: ref (why), ...`, or None when all were."""
        if not self.unchecked:
            return None
        shown = ", ".join(f"{ref} ({why})" for ref, why in list(self.unchecked.items())[:3])
        more = f" and {len(self.unchecked) - 3} more" if len(self.unchecked) > 3 else ""
        return f"{len(self.unchecked)} image(s) not checked in their registries: {shown}{more}"


def check_images(refs: Iterable[str]) -> RegistryCheck:
    """Ask each image's registry whether it has the pinned manifest; pull nothing.

    Raises TaskSpecError (exit 2) naming the first image its registry does
    not have. Images whose registry cannot be asked are returned as unchecked.
    """
    checked = 0
    unchecked: dict[str, str] = {}
    for ref in dict.fromkeys(refs):
        found = _has_manifest(ref)
        if found is None:
            checked += 1
        elif found.startswith("missing"):
            raise TaskSpecError(f"image {ref}: {found.removeprefix('missing: ')}")
        else:
            unchecked[ref] = found
    return RegistryCheck(checked=checked, unchecked=unchecked)


def _has_manifest(ref: str) -> str | None:
    """None when the registry has `ref`'s manifest; else "missing: ..." or why it could not be asked."""
    registry, _, repository = normalize_repository(image_repository(ref)).partition("/")
    host = _DOCKER_HUB if registry == "docker.io" else registry
    loopback = _is_loopback(host)
    url = f"{'http' if loopback else 'https'}://{host}/v2/{repository}/manifests/{image_digest(ref)}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({})) if loopback else _default_opener()
    token: str | None = None
    for _ in range(2):
        headers = {"Accept": _ACCEPT}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            request = urllib.request.Request(url, headers=headers, method="HEAD")  # noqa: S310 (http(s) only)
            with opener.open(request, timeout=TIMEOUT_SEC):
                return None
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return f"missing: {registry} has no such manifest (asked without pulling)"
            if exc.code == 401 and token is None:
                token = _anonymous_token(opener, exc.headers.get("WWW-Authenticate", ""), loopback)
                if token:
                    continue
            if exc.code in (401, 403):
                return f"{registry} wants credentials"
            return f"{registry} answered HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            why = reason.__class__.__name__ if isinstance(reason, BaseException) else str(reason)
            return f"{registry} unreachable: {why}"
    return f"{registry} wants credentials"


def _anonymous_token(opener: urllib.request.OpenerDirector, challenge: str, loopback: bool) -> str | None:
    """The bearer token a registry's `WWW-Authenticate: Bearer realm=...` challenge hands anyone, or None.

    The realm must be HTTPS (plain HTTP only for a loopback registry); no credential is sent.
    """
    if not challenge.lower().startswith("bearer "):
        return None
    params = dict(_CHALLENGE_PARAM.findall(challenge))
    realm = params.pop("realm", "")
    if not realm.startswith("https://") and not (loopback and realm.startswith("http://")):
        return None
    query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
    try:
        with opener.open(f"{realm}?{query}" if query else realm, timeout=TIMEOUT_SEC) as answer:
            body = json.loads(answer.read(1 << 20))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
    return token if isinstance(token, str) else None


def _default_opener() -> urllib.request.OpenerDirector:
    """The opener for registries beyond this host: the environment's proxy settings apply."""
    return urllib.request.build_opener()


def _is_loopback(host: str) -> bool:
    """Whether `host[:port]` names this host (localhost, 127.0.0.0/8, ::1)."""
    name = urllib.parse.urlsplit(f"//{host}").hostname or host
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
