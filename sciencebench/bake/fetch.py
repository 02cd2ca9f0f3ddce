"""Agent artifacts fetched by trusted code on this host: a harness's npm tarball, checked, its binaries kept.

The layout is `recipes.artifact_dir`'s (scripts/agent-artifacts.sh calls this
for Codex and Claude Code): the package's native binaries, `TARBALL` (its
sha256) and `MANIFEST`, renamed into place last. The tarball comes from the
npm registry (default registry.npmjs.org) and must match the sha512
integrity its packument gives, as npm checks it; nothing of it runs here.
`python -m sciencebench.bake.fetch AGENT VERSION ARTIFACTS [REGISTRY]`.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sciencebench.bake.recipes import RecipeError, artifact_dir

DEFAULT_NPM_REGISTRY = "https://registry.npmjs.org"
FETCH_TIMEOUT_SEC = 300
MAX_TARBALL_BYTES = 2 << 30
# agent -> (npm package, its version for the harness's `{version}`, archive member -> kept file name)
NPM_BINARIES: dict[str, tuple[str, str, dict[str, str]]] = {
    "codex": (
        "@openai/codex",
        "{version}-linux-x64",
        {
            "package/vendor/x86_64-unknown-linux-musl/bin/codex": "codex",
            "package/vendor/x86_64-unknown-linux-musl/codex-path/rg": "rg",
        },
    ),
    "claude-code": ("@anthropic-ai/claude-code-linux-x64", "{version}", {"package/claude": "claude"}),
}


class FetchError(RecipeError):
    """The registry did not give the pinned artifacts, or gave ones that fail their integrity."""


def has_artifacts(directory: Path) -> bool:
    """Whether `directory` holds a complete artifact set (its MANIFEST is written last)."""
    return (directory / "MANIFEST").is_file()


@contextlib.contextmanager
def artifacts_lock(artifacts: Path) -> Iterator[None]:
    """One fetch at a time per artifact cache (the lock scripts/agent-artifacts.sh takes too)."""
    artifacts.mkdir(parents=True, exist_ok=True)
    with open(artifacts / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _get(url: str) -> Any:
    """The open response to GET `url` (http or https only); FetchError otherwise."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise FetchError(f"{url}: not an http(s) URL")
    headers = {"Accept": "application/json", "User-Agent": "sciencebench"}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (the scheme is checked above)
    try:
        return urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_SEC)  # noqa: S310
    except (OSError, ValueError) as exc:
        raise FetchError(f"fetching {url}: {exc}") from None


def _tarball(registry: str, package: str, version: str) -> tuple[str, str]:
    """The tarball URL and sha512 integrity the registry's packument gives for `package` `version`."""
    url = f"{registry.rstrip('/')}/{package.replace('/', '%2f')}"
    with _get(url) as response:
        try:
            packument = json.loads(response.read(64 << 20))
            dist = packument["versions"][version]["dist"]
            tarball, integrity = str(dist["tarball"]), str(dist["integrity"])
        except (ValueError, KeyError, TypeError):
            raise FetchError(f"{url}: no version {version} with a tarball and its integrity") from None
    if not integrity.startswith("sha512-"):
        raise FetchError(f"{package}@{version}: integrity {integrity[:20]!r} is not sha512")
    return tarball, integrity


def _download(url: str, integrity: str, target: Path) -> str:
    """Write the tarball at `url` to `target`; check its sha512 against `integrity`; return its sha256."""
    sha512, sha256, size = hashlib.sha512(), hashlib.sha256(), 0
    with _get(url) as response, target.open("wb") as out:
        while chunk := response.read(1 << 20):
            size += len(chunk)
            if size > MAX_TARBALL_BYTES:
                raise FetchError(f"{url}: larger than {MAX_TARBALL_BYTES} bytes")
            sha512.update(chunk)
            sha256.update(chunk)
            out.write(chunk)
    if "sha512-" + base64.b64encode(sha512.digest()).decode() != integrity:
        raise FetchError(f"{url}: the tarball does not match its sha512 integrity")
    return sha256.hexdigest()


def _extract(tarball: Path, members: dict[str, str], into: Path) -> None:
    """Copy each named regular member of `tarball` to `into/<name>`, executable."""
    try:
        with tarfile.open(tarball, "r:*") as tar:
            for member, name in members.items():
                info = tar.getmember(member)
                source = tar.extractfile(info) if info.isreg() else None
                if source is None:
                    raise FetchError(f"{tarball.name}: {member} is not a regular file")
                with source, (into / name).open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
                (into / name).chmod(0o755)
    except (KeyError, tarfile.TarError, OSError) as exc:
        raise FetchError(
            f"{tarball.name}: {sorted(members)} not all readable ({exc.__class__.__name__})"
        ) from None


def _manifest(directory: Path, source: str) -> str:
    """What `scripts/agent-artifacts.sh` writes: the source, then `sha256sum` of each file, sorted by name."""
    lines = [f"source {source}"]
    for path in sorted(directory.iterdir(), key=lambda p: p.name.encode()):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        lines.append(f"{digest.hexdigest()}  {path.name}")
    return "\n".join(lines) + "\n"


def fetch_npm(agent: str, version: str, artifacts: Path, registry: str | None = None) -> Path:
    """`agent` `version`'s artifacts under `artifacts`, fetched when missing; return their directory.

    Raises FetchError (a RecipeError) when the agent has no npm binaries or
    the registry gives nothing usable.
    """
    if agent not in NPM_BINARIES:
        raise FetchError(f"{agent}: its artifacts are not an npm package; use scripts/agent-artifacts.sh")
    dest = artifact_dir(artifacts, agent, version)
    if has_artifacts(dest):
        return dest
    package, version_format, members = NPM_BINARIES[agent]
    npm_version = version_format.format(version=version)
    try:
        with artifacts_lock(artifacts):
            return dest if has_artifacts(dest) else _fetch_into(dest, package, npm_version, members, registry)
    except OSError as exc:
        raise FetchError(f"fetching into {artifacts}: {exc.strerror or exc.__class__.__name__}") from None


def _fetch_into(
    dest: Path, package: str, npm_version: str, members: dict[str, str], registry: str | None
) -> Path:
    """Fetch `package` `npm_version` into `dest` (the cache's lock held); return `dest`."""
    artifacts = dest.parent.parent
    tmp = Path(tempfile.mkdtemp(prefix=f".fetch-{dest.parent.name}-", dir=artifacts))
    try:
        tarball_url, integrity = _tarball(registry or DEFAULT_NPM_REGISTRY, package, npm_version)
        with tempfile.TemporaryDirectory(dir=artifacts) as scratch:
            tarball = Path(scratch) / "package.tgz"
            sha256 = _download(tarball_url, integrity, tarball)
            _extract(tarball, members, tmp)
        (tmp / "TARBALL").write_text(f"tarball {sha256}\n")
        manifest = _manifest(tmp, f"npm:{package}@{npm_version}")
        (tmp / "MANIFEST").write_text(manifest)
        tmp.chmod(0o755)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def main(argv: list[str]) -> int:
    """`python -m sciencebench.bake.fetch AGENT VERSION ARTIFACTS [REGISTRY]` (scripts/agent-artifacts.sh)."""
    if len(argv) not in (3, 4):
        print("usage: python -m sciencebench.bake.fetch AGENT VERSION ARTIFACTS [REGISTRY]", file=sys.stderr)
        return 2
    try:
        print(fetch_npm(argv[0], argv[1], Path(argv[2]), argv[3] if len(argv) == 4 else None))
    except RecipeError as exc:
        print(f"agent-artifacts: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
