"""Removing what Pier leaves behind under `--no-delete`, never touching pinned task images.

`--no-delete` runs `compose down` (containers and networks go, images stay);
a crashed or killed Pier leaves containers, networks and volumes as well.
All of them, and the `<project>-main:latest` images compose builds, carry
the label `com.docker.compose.project=<project>`; a prebuilt task image run
as is carries none. `remove_projects` removes named projects, `remove_trial`
one trial's, and `sweep_leftovers` (at worker start) those of crashed
trials of this host that no live-trial lock covers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from sciencebench.core.errors import PreflightError
from sciencebench.dockerhost.hostlocks import live_trial_locks, owner_id
from sciencebench.dockerhost.labels import COMPOSE_PROJECT_LABEL, MANAGED_LABEL, OWNER_LABEL
from sciencebench.dockerhost.naming import (
    compose_project_name,
    is_pier_project,
    projects_of_trial,
)
from sciencebench.worker.docker.engine import ENGINE_ERRORS, connect, one_line


@dataclass
class CleanupReport:
    """What a cleanup removed (names or short ids), and what it could not."""

    projects: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    kept_images: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def merge(self, other: CleanupReport) -> None:
        """Add what `other` removed and could not remove."""
        for name in ("projects", "containers", "networks", "volumes", "images", "kept_images"):
            getattr(self, name).extend(getattr(other, name))
        self.errors.extend(other.errors)


def _label_filter(project: str | None) -> dict[str, Any]:
    return {"label": COMPOSE_PROJECT_LABEL if project is None else f"{COMPOSE_PROJECT_LABEL}={project}"}


def compose_projects(client: docker.DockerClient | None = None) -> set[str]:
    """Every compose project with a container, network, volume or image on this engine.

    Raises PreflightError when no client is given and the engine is unreachable.
    """
    with _client_or(client) as api:
        return compose_projects_api(api)


@contextlib.contextmanager
def _client_or(client: docker.DockerClient | None) -> Iterator[docker.APIClient]:
    if client is not None:
        yield client.api
        return
    own = connect()
    try:
        yield own.api
    finally:
        own.close()


def derived_image_removable(attrs: dict[str, Any], project: str) -> bool:
    """Whether an image (as listed by the engine) is a derived image of `project`.

    True only when the image carries `com.docker.compose.project=<project>`
    and every RepoDigest it has names a `<project>-...` repository: an image
    that came from a registry (a pinned task image) has a registry
    RepoDigest and is never removable, whatever its labels say.
    """
    labels = attrs.get("Labels") or {}
    if labels.get(COMPOSE_PROJECT_LABEL) != project:
        return False
    digests = attrs.get("RepoDigests") or []
    return all(entry.rpartition("@")[0].startswith(f"{project}-") for entry in digests)


def _remove(
    report: CleanupReport, what: str, action: Callable[..., object], *args: Any, **kwargs: Any
) -> bool:
    """Run one removal; False when the object was already gone or the engine refused."""
    try:
        action(*args, **kwargs)
    except docker.errors.NotFound:
        return False
    except ENGINE_ERRORS as exc:
        report.errors.append(f"{what}: {one_line(str(exc))}")
        return False
    return True


def _cleanup_project(
    api: docker.APIClient, project: str, listed: list[list[dict[str, Any]]] | None = None
) -> CleanupReport:
    """Remove one project's objects; `listed`: its containers, networks, volumes, images (else listed now)."""
    report = CleanupReport(projects=[project])
    # The listings at once, each filtered by the project's label on the engine's side.
    containers, networks, volumes, images = (
        listed if listed is not None else _list_all(api, _label_filter(project))
    )
    for item in containers:
        name = (item.get("Names") or [item["Id"][:12]])[0].lstrip("/")
        if _remove(report, f"container {name}", api.remove_container, item["Id"], v=True, force=True):
            report.containers.append(name)
    for item in networks:
        if _remove(report, f"network {item['Name']}", api.remove_network, item["Id"]):
            report.networks.append(item["Name"])
    for item in volumes:
        if _remove(report, f"volume {item['Name']}", api.remove_volume, item["Name"], force=True):
            report.volumes.append(item["Name"])
    for item in images:
        tags = [t for t in item.get("RepoTags") or [] if t != "<none>:<none>"]
        if not derived_image_removable(item, project):
            report.kept_images.extend(tags or [item["Id"]])
            continue
        ours = [t for t in tags if t.startswith(f"{project}-")]
        report.kept_images.extend(t for t in tags if t not in ours)
        # Untag our own tags only (without other tags that deletes the image);
        # an untagged derived image is removed by id. Never forced.
        for target in ours or ([] if tags else [item["Id"]]):
            if _remove(report, f"image {target}", api.remove_image, target):
                report.images.append(target)
    return report


def remove_projects(project_names: Iterable[str], client: docker.DockerClient | None = None) -> CleanupReport:
    """Remove the containers, networks, volumes and derived images of these compose projects.

    Finds objects by the label `com.docker.compose.project=<name>` (compute
    the names with `trial_project_names(trial_dir.name)`). Containers go
    first (forced, with their anonymous volumes), then networks, volumes, and
    derived images `<project>-<service>:<tag>` (see `derived_image_removable`).
    Pinned task images, and any tag not of the project, are never removed.

    Best effort and idempotent: never raises for Docker errors; what could not
    be removed is listed in `CleanupReport.errors` (an unreachable engine too).
    """
    report = CleanupReport()
    try:
        with _client_or(client) as api:
            for project in dict.fromkeys(project_names):
                try:
                    report.merge(_cleanup_project(api, project))
                except ENGINE_ERRORS as exc:
                    report.errors.append(f"project {project}: {one_line(str(exc))}")
    except PreflightError as exc:
        report.errors.append(str(exc))
    return report


def remove_trial(trial_name: str, client: docker.DockerClient | None = None) -> CleanupReport:
    """`remove_projects` for one trial's compose projects (verifier steps included), listed once.

    The four listings run at once, each filtered on the engine's side by the
    compose label, and what they return of the trial's projects
    (`projects_of_trial`) is removed without listing each project again: a
    trial that left nothing costs these four calls (the image listing is the
    slow one: the engine walks every image for any image listing). Never
    raises for Docker errors (see `remove_projects`).
    """
    ours = projects_of_trial(trial_name)
    report = CleanupReport()
    try:
        with _client_or(client) as api:
            listed = _list_all(api, _label_filter(None))
            projects = sorted({p for items in listed for p in map(_project_of, items) if ours(p)})
            for project in projects:
                mine = [[item for item in items if _project_of(item) == project] for items in listed]
                try:
                    report.merge(_cleanup_project(api, project, mine))
                except ENGINE_ERRORS as exc:
                    report.errors.append(f"project {project}: {one_line(str(exc))}")
    except (PreflightError, *ENGINE_ERRORS) as exc:
        report.errors.append(one_line(str(exc)))
    return report


def _project_of(item: dict[str, Any]) -> str:
    return str((item.get("Labels") or {}).get(COMPOSE_PROJECT_LABEL, ""))


def compose_projects_api(api: docker.APIClient) -> set[str]:
    """`compose_projects` on a low-level client: the four listings at once (one trial's wait)."""
    found = {
        (item.get("Labels") or {}).get(COMPOSE_PROJECT_LABEL, "")
        for items in _list_all(api, _label_filter(None))
        for item in items
    }
    found.discard("")
    return found


def _list_all(api: docker.APIClient, filters: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Containers, networks, volumes and images that `filters` selects, listed concurrently."""
    listings: list[Callable[[], list[dict[str, Any]]]] = [
        lambda: api.containers(all=True, filters=filters),
        lambda: api.networks(filters=filters),
        lambda: api.volumes(filters=filters).get("Volumes") or [],
        lambda: api.images(filters=filters),
    ]
    return list(_listing_pool().map(lambda listing: listing(), listings))


_pool: tuple[int, ThreadPoolExecutor] | None = None


def _listing_pool() -> ThreadPoolExecutor:
    """Threads for concurrent engine listings, one pool per process (a forked child makes its own)."""
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        _pool = (os.getpid(), ThreadPoolExecutor(max_workers=4, thread_name_prefix="engine-listing"))
    return _pool[1]


def leftover_projects(
    projects: Iterable[str],
    live: Collection[str],
    prefix: str | None = None,
) -> list[str]:
    """The projects a sweep removes: Pier-shaped, under `prefix`, and not live.

    A project is live when it starts with the compose-normalized form of any
    entry of `live` (trial names, project names, `pier_trial_prefix`es, live-trial
    lock keys).
    """
    keys = {compose_project_name(name) for name in live if name}
    return sorted(
        project
        for project in projects
        if is_pier_project(project)
        and (prefix is None or project.startswith(prefix))
        and not any(project.startswith(key) for key in keys)
    )


def sweep_leftovers(
    active: Collection[str] = (),
    prefix: str | None = None,
    client: docker.DockerClient | None = None,
    state: Path | None = None,
) -> CleanupReport:
    """Remove what crashed trials left on this host; call at worker start.

    Considers only compose projects shaped like Pier trial projects
    (`is_pier_project`) with a container that sciencebench's policy
    environment started for this host state (`OWNER_LABEL` = `owner_id`),
    optionally only those starting with `prefix`. Leaves
    alone every project covered by `active` (the caller's live trial names or
    `pier_trial_prefix`es) or by a `hold_live_trial` lock held in any process of this
    host. Everything else goes as in `remove_projects`; pinned task images are
    never removed. Other compose projects of the host (a Redis deployment,
    say) are untouched.

    Never raises for Docker errors (see `remove_projects`).
    """
    try:
        with _client_or(client) as api:
            candidates = {
                (item.get("Labels") or {}).get(COMPOSE_PROJECT_LABEL, "")
                for item in api.containers(
                    all=True, filters={"label": [MANAGED_LABEL, f"{OWNER_LABEL}={owner_id(state)}"]}
                )
            } - {""}
    except (PreflightError, *ENGINE_ERRORS) as exc:
        return CleanupReport(errors=[one_line(str(exc))])
    # Locks are read after listing: a trial that starts in between is either
    # not listed yet or already locked.
    live = set(active) | live_trial_locks(state)
    return remove_projects(leftover_projects(candidates, live, prefix), client)
