"""Digest-pinned image references and platforms (pure).

Every worker host must run the same bytes, so task images are named as
`name[:tag]@sha256:<64 hex>`; the helpers here validate and take apart such
references and `os/arch[/variant]` platform strings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, NamedTuple

from pydantic import AfterValidator

# name[:tag]@sha256:<64 hex>; the name may start with a registry host[:port].
_IMAGE_REF = re.compile(
    r"^(?P<name>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]{1,5})?"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+|[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"@(?P<digest>sha256:[0-9a-f]{64})$"
)


def check_image_ref(ref: str) -> str:
    """Return `ref` when it is pinned as `name[:tag]@sha256:<64 hex>`.

    Raises ValueError for an empty ref, a `pending` placeholder, a tag-only
    ref or anything else that is not a digest-pinned reference.
    """
    if not ref.strip():
        raise ValueError("image reference is empty")
    if "pending" in ref:
        raise ValueError(f"image reference {ref!r} is a pending placeholder")
    if "@" not in ref:
        raise ValueError(f"image reference {ref!r} is not pinned by digest (@sha256:...)")
    # fullmatch: `$` alone would accept a trailing newline after the digest.
    if not _IMAGE_REF.fullmatch(ref):
        raise ValueError(f"image reference {ref!r} is not of the form name[:tag]@sha256:<64 hex>")
    return ref


def image_digest(ref: str) -> str:
    """The `sha256:...` part of a pinned reference."""
    return ref.rsplit("@", 1)[1]


def image_repository(ref: str) -> str:
    """The repository of a pinned reference, without tag or digest."""
    match = _IMAGE_REF.fullmatch(ref)
    if not match:
        raise ValueError(f"not a pinned image reference: {ref!r}")
    return match.group("name")


ImageRef = Annotated[str, AfterValidator(check_image_ref)]


def normalize_repository(name: str) -> str:
    """A repository name as the engine stores it, registry made explicit.

    `ubuntu` and `docker.io/ubuntu` -> `docker.io/library/ubuntu`;
    `index.docker.io/x/y` -> `docker.io/x/y`; other registries unchanged.
    """
    first, _, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        first, rest = "docker.io", name
    if first == "index.docker.io":
        first = "docker.io"
    if first == "docker.io" and "/" not in rest:
        rest = f"library/{rest}"
    return f"{first}/{rest}"


# Where the benchmark's images run, and what a job asks for unless told otherwise.
DEFAULT_PLATFORM = "linux/amd64"


def repo_digest_name(ref: str) -> str:
    """`repository@sha256:...` of a pinned ref: tag dropped, registry normalized (as RepoDigests list it).

    Raises ValueError for a ref that is not pinned.
    """
    check_image_ref(ref)
    return f"{normalize_repository(image_repository(ref))}@{image_digest(ref)}"


def repo_digests_contain(repo_digests: Iterable[str], ref: str) -> bool:
    """True when `repo_digests` (an image's RepoDigests) holds the pinned `ref`; ValueError if not pinned."""
    want = repo_digest_name(ref)
    for entry in repo_digests:
        name, sep, digest = entry.rpartition("@")
        if sep and f"{normalize_repository(name)}@{digest}" == want:
            return True
    return False


class Platform(NamedTuple):
    """A platform `os/arch[/variant]`, lowercased; `variant` is '' when not named."""

    os: str
    arch: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(part for part in self if part)


def parse_platform(text: str) -> Platform | None:
    """`os/arch[/variant]` as a Platform, or None when `text` is not of that form."""
    parts = text.lower().split("/")
    if not 2 <= len(parts) <= 3 or not all(parts):
        return None
    return Platform(*parts)


def platform_matches(platform: str, image_os: str, image_arch: str, image_variant: str) -> bool:
    """Whether an image built for `image_os/image_arch[/variant]` serves `platform`.

    A variant is compared only when both sides name one.
    """
    want = parse_platform(platform)
    if want is None:
        return False
    if (image_os.lower(), image_arch.lower()) != (want.os, want.arch):
        return False
    return not (want.variant and image_variant and want.variant != image_variant.lower())
