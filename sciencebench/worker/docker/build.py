"""Images built on a worker-kind host: a script run in a network-less container, committed, pushed.

Nothing is fetched inside the container: what the script needs is already
in the base image (the air-gapped path). The pushed image is returned as a
digest-pinned reference.
"""

from __future__ import annotations

import docker


def commit_image(
    client: docker.DockerClient, base_image: str, script: str, repository: str, workdir: str
) -> str:
    """Run `script` in a network-less container of `base_image`, commit, push; return the pinned ref.

    The committed image runs `sleep infinity` in `workdir`. Raises RuntimeError
    when the script fails or the push is refused.
    """
    container = client.containers.run(base_image, ["bash", "-c", script], detach=True, network_mode="none")
    try:
        status = container.wait(timeout=300)
        if status.get("StatusCode") != 0:
            raise RuntimeError(f"building {repository} failed: {container.logs()[-500:]!r}")
        container.commit(
            repository=repository, tag="latest",
            changes=['CMD ["sleep", "infinity"]', f"WORKDIR {workdir}"],
        )  # fmt: skip
    finally:
        container.remove(force=True)
    for line in client.images.push(repository, tag="latest", stream=True, decode=True):
        if "error" in line:
            raise RuntimeError(f"pushing {repository} failed: {line['error']}")
    digests = client.images.get(f"{repository}:latest").attrs["RepoDigests"]
    digest = next(d for d in digests if d.startswith(f"{repository}@")).split("@", 1)[1]
    return f"{repository}:latest@{digest}"
