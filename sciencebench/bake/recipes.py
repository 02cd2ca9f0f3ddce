"""How each harness is preinstalled into a task image from host-fetched artifacts (pure).

Pinned releases are fetched on the build host by `scripts/agent-artifacts.sh`
into an artifact directory (default `/var/tmp/sciencebench-agents`; its
layout: `artifact_dir`). A `Recipe` is a shell script that runs as root in a
network-less container of the task image with the artifacts mounted
read-only, and is then committed: nothing is downloaded, and the artifacts
never become a layer. It leaves the image as Pier's preinstalled-agent path
expects it: `codex`, `claude` and `mini-swe-agent` on the default PATH, and
`$HOME/.local/bin/env` for root (Pier's mini-swe-agent command sources it).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sciencebench.core.errors import SciencebenchError
from sciencebench.core.harnesses import Bake, bake_of, bakeable

# A wheels install's virtual environment: VENV_ROOT/<harness> (/opt/sciencebench/mini-swe-agent).
VENV_ROOT = PurePosixPath("/opt/sciencebench")
EXTRA_CA_PATH = PurePosixPath("/usr/local/share/ca-certificates/sciencebench-extra-ca.crt")
SYSTEM_CA_BUNDLE = PurePosixPath("/etc/ssl/certs/ca-certificates.crt")
LABEL_PREFIX = "dev.sciencebench.agent-image"
MOUNT_DIR = PurePosixPath("/mnt/sciencebench-artifacts")  # read-only, during the install only
# Bumped whenever the rendered recipe changes meaning: it is part of every image's key.
RECIPE_VERSION = "5"

_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$")


class RecipeError(SciencebenchError, ValueError):
    """An agent cannot be baked: unknown agent, version without artifacts, unsuitable image."""


@dataclass(frozen=True)
class Recipe:
    """How to bake one image: a root shell script run with no network, then a commit.

    `mounts` are host files or directories, mounted read-only under
    `MOUNT_DIR/<name>` for the script; `env` and `labels` are added to the
    committed image's configuration (everything else of the base image's
    configuration is kept).
    """

    agent: str
    version: str
    script: str
    mounts: dict[str, Path]
    env: dict[str, str]
    labels: dict[str, str]
    inputs_sha256: str
    python: str | None = None  # mini-swe-agent: the Python version its wheels are for


def artifact_dir(artifacts: Path, agent: str, version: str) -> Path:
    """The directory holding `agent` `version`'s artifacts.

        codex/<version>/{codex, rg, MANIFEST}              npm @openai/codex@<version>-linux-x64
        claude-code/<version>/{claude, MANIFEST}           npm @anthropic-ai/claude-code-linux-x64@<version>
        mini-swe-agent/<version>/py3.11/{*.whl, MANIFEST}  PyPI mini-swe-agent==<version> and its wheels

    `MANIFEST` is `sha256sum` output over the files beside it (plus the package
    spec): it identifies the artifacts without hashing hundreds of megabytes on
    every bake.
    """
    return artifacts / agent / version


def _manifest(directory: Path, fetch_hint: str) -> str:
    manifest = directory / "MANIFEST"
    try:
        return manifest.read_text(encoding="utf-8")
    except OSError:
        raise RecipeError(f"no artifacts in {directory}; fetch them with {fetch_hint}") from None


def bake_spec(agent: str, version: str) -> Bake:
    """How `agent` is baked (its registry entry's `bake`), or RecipeError."""
    try:
        spec = bake_of(agent)
    except KeyError:
        raise RecipeError(f"--agent {agent}: only {', '.join(bakeable())} can be baked") from None
    if not _VERSION.fullmatch(version):
        raise RecipeError(f"--agent-version {version!r}: not a version")
    return spec


def _fetch_hint(agent: str, version: str) -> str:
    return f"scripts/agent-artifacts.sh --agent {agent} --version {version}"


def labels(agent: str, version: str, base_image: str, inputs: str) -> dict[str, str]:
    """The labels a baked image carries: what it is and what it was made from."""
    return {
        f"{LABEL_PREFIX}.agent": agent,
        f"{LABEL_PREFIX}.version": version,
        f"{LABEL_PREFIX}.base": base_image,
        f"{LABEL_PREFIX}.inputs": inputs,
    }


def _ca_script() -> str:
    """Trust an extra CA (a private gateway's) system-wide; Node/Bun and Python get ENV below."""
    source = MOUNT_DIR / "extra-ca.crt"
    return (
        f"mkdir -p {EXTRA_CA_PATH.parent} && cp {source} {EXTRA_CA_PATH} && chmod 644 {EXTRA_CA_PATH} && "
        "if command -v update-ca-certificates >/dev/null 2>&1; then update-ca-certificates >/dev/null; "
        f"else mkdir -p {SYSTEM_CA_BUNDLE.parent} && cat {EXTRA_CA_PATH} >> {SYSTEM_CA_BUNDLE}; fi"
    )


def _wheel_steps(agent: str, version: str, spec: Bake) -> list[str]:
    """Install `agent==version` from its wheels into its own virtual environment, with the image's python3."""
    agent_dir = MOUNT_DIR / "agent"
    venv = VENV_ROOT / agent
    checked_env = " ".join(f"{key}={value}" for key, value in spec.env.items())
    # pip runs from its own wheel: the image needs no pip, and nothing is downloaded.
    return [
        f"python3 -m venv --without-pip {venv}",
        f'{venv}/bin/python "$(ls {agent_dir}/pip-*.whl | head -n 1)"/pip install --quiet --no-index '
        f"--no-compile --no-cache-dir --disable-pip-version-check --find-links {agent_dir} "
        + shlex.quote(f"{agent}=={version}"),
        # Byte-compiled once here, on every core, rather than at import in every trial.
        f"{venv}/bin/python -m compileall -q -j 0 {venv}/lib >/dev/null",
        *(f"ln -sf {venv}/bin/{program} /usr/local/bin/{program}" for program in spec.programs),
        # Pier's mini-swe-agent command sources uv's env script first.
        "mkdir -p /root/.local/bin",
        "printf '%s\\n' 'export PATH=\"$HOME/.local/bin:$PATH\"' > /root/.local/bin/env",
        f"{checked_env} {venv}/bin/python -c 'import {', '.join(spec.imports)}'".lstrip(),
    ]


def _binary_steps(spec: Bake) -> list[str]:
    """Copy the harness's programs onto the default PATH and run the first once."""
    agent_dir = MOUNT_DIR / "agent"
    sources = " ".join(str(agent_dir / name) for name in spec.programs)
    targets = " ".join(f"/usr/local/bin/{name}" for name in spec.programs)
    return [f"cp {sources} /usr/local/bin/", f"chmod 755 {targets}", f"{spec.programs[0]} --version"]


def render(
    agent: str,
    version: str,
    base_image: str,
    artifacts: Path,
    *,
    python: str | None = None,
    extra_ca: Path | None = None,
) -> Recipe:
    """How to preinstall `agent` `version` into `base_image`.

    `python` (`3.11`) is the base image's Python, needed for mini-swe-agent's
    wheels. Raises RecipeError for an agent that cannot be baked, missing
    artifacts, a base image without a suitable Python, or a bad CA file.
    """
    spec = bake_spec(agent, version)
    directory = artifact_dir(artifacts, agent, version)
    env = dict(spec.env)
    if spec.wheels:
        if python is None:
            raise RecipeError(f"{agent} needs python3 (3.10 or newer) in the task image")
        directory = directory / f"py{python}"
        manifest = _manifest(directory, f"{_fetch_hint(agent, version)} --python {python}")
        steps = _wheel_steps(agent, version, spec)
    else:
        manifest = _manifest(directory, _fetch_hint(agent, version))
        steps = _binary_steps(spec)
    mounts = {"agent": directory}
    ca_bytes = b""
    if extra_ca is not None:
        try:
            ca_bytes = extra_ca.read_bytes()
        except OSError as exc:
            raise RecipeError(f"--extra-ca {extra_ca}: unreadable ({exc.strerror})") from None
        if b"BEGIN CERTIFICATE" not in ca_bytes:
            raise RecipeError(f"--extra-ca {extra_ca}: not a PEM certificate")
        mounts["extra-ca.crt"] = extra_ca
        steps.append(_ca_script())
        env |= {"SSL_CERT_FILE": str(SYSTEM_CA_BUNDLE), "NODE_EXTRA_CA_CERTS": str(EXTRA_CA_PATH)}
    script = "set -eu\n" + "\n".join(steps) + "\n"
    key = hashlib.sha256()
    for part in (
        RECIPE_VERSION,
        agent,
        version,
        base_image,
        script,
        json.dumps(env, sort_keys=True),
        manifest,
    ):
        key.update(part.encode() + b"\0")
    key.update(ca_bytes)
    inputs = key.hexdigest()
    return Recipe(
        agent=agent,
        version=version,
        script=script,
        mounts=mounts,
        env=env,
        labels=labels(agent, version, base_image, inputs),
        inputs_sha256=inputs,
        python=python if spec.wheels else None,
    )


def image_tag(agent: str, version: str, base_image: str, inputs_sha256: str) -> str:
    """The baked image's tag: version, base digest and inputs, so one tag names one build."""
    base_digest = base_image.rsplit("@sha256:", 1)[-1]
    return f"{version}-{base_digest[:12]}-{inputs_sha256[:12]}"


def main(argv: list[str]) -> int:
    """`python -m sciencebench.bake.recipes pin AGENT`: print the pinned version (for scripts)."""
    names = bakeable()
    if len(argv) == 2 and argv[0] == "pin" and argv[1] in names:
        print(bake_of(argv[1]).version)
        return 0
    if argv == ["pins"]:
        for name in names:
            print(name, bake_of(name).version, bake_of(name).source)
        return 0
    print("usage: python -m sciencebench.bake.recipes (pins | pin AGENT)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
