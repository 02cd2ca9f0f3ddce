"""Pre-pull: the selection's images onto the live worker hosts, ahead of the trials.

`submit --prepull` and a dry run with live workers of a job with
`--placement` give each image that no live host holds to one host, largest
first to the host given the fewest bytes so far (`spread`), and mark it as
pulling there; without `--placement` every host pulls what it lacks
(`everywhere`). Each host gets one `prewarm_images` task on its direct
queue (`worker_direct`). Pulls are deduplicated per host, so a trial that
needs an image while its pull runs waits for that one pull.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from celery import Celery
from celery.result import AsyncResult
from celery.utils.nodenames import worker_direct
from rich.console import Console

from sciencebench.coordination.placement import cluster_view, pinned
from sciencebench.coordination.protocol import Coordinator
from sciencebench.coordination.redis.placement import RedisPlacementStore
from sciencebench.core.sizes import format_size
from sciencebench.core.wire import PREWARM_IMAGES
from sciencebench.login.cluster import is_live

POLL_SEC = 0.5


def spread(
    refs: Iterable[str], hosts: Iterable[str], sizes: Mapping[str, int], held: Mapping[str, set[str]]
) -> dict[str, list[str]]:
    """Host -> the refs it pulls: each ref no host holds (`held`: host -> pinned names) onto one host.

    Largest first (`sizes`: ref -> bytes), each to the host given the fewest
    bytes so far (then the first name): the pulls take about equally long.
    """
    names = sorted(hosts)
    if not names:
        return {}
    holding = set().union(*held.values()) if held else set()
    given = dict.fromkeys(names, 0)
    plan: dict[str, list[str]] = {}
    wanted = [ref for ref in dict.fromkeys(refs) if pinned([ref])[0] not in holding]
    for ref in sorted(wanted, key=lambda r: -sizes.get(r, 0)):
        host = min(names, key=lambda h: (given[h], names.index(h)))
        given[host] += sizes.get(ref, 0)
        plan.setdefault(host, []).append(ref)
    return plan


def everywhere(refs: Iterable[str], held: set[str]) -> list[str]:
    """The refs a host that holds `held` (pinned names) lacks, in order, once each."""
    return [ref for ref in dict.fromkeys(refs) if pinned([ref])[0] not in held]


def prewarm(
    app: Celery,
    coord: Coordinator,
    refs: list[str],
    platform: str,
    console: Console,
    lease_seconds: float,
    *,
    placement: bool = True,
) -> int:
    """Pull `refs` on the live hosts and wait; how many hosts succeeded.

    With `placement` (the job's `--placement`) spread over them (`spread`):
    the job's trials go where their images are. Without it every host pulls
    what it lacks: any host may take any trial.
    """
    store = RedisPlacementStore(coord)
    placed = cluster_view(coord, store, lease_seconds)
    if not placed.hosts:
        console.print("pre-pull: no live worker host; nothing pulled")
        return 0
    sizes = {ref: placed.size(pinned([ref])[0]) for ref in refs}
    held = {name: set(host.images) for name, host in placed.hosts.items()}
    plan = (
        spread(refs, placed.hosts, sizes, held)
        if placement
        else {host: lacks for host in placed.hosts if (lacks := everywhere(refs, held.get(host, set())))}
    )
    n_refs = len(set(refs))
    if placement:
        kept = n_refs - sum(len(mine) for mine in plan.values())
        console.print(f"pre-pull: {n_refs} image(s), {kept} held already; {len(plan)} host(s) pulling")
    else:
        console.print(f"pre-pull: {n_refs} image(s) onto each live host; {len(plan)} host(s) lack some")
    for host, mine in plan.items() if placement else ():
        store.mark_pulling(host, pinned(mine), placed.now)
    results = {}
    for host, mine in plan.items():
        queue = worker_direct(host)
        results[host] = app.send_task(
            PREWARM_IMAGES, args=(mine, platform), exchange=queue.exchange.name, routing_key=queue.routing_key
        )
    failed = 0
    for host, answer in _answers(coord, results, lease_seconds):
        total = format_size(sum(sizes[ref] for ref in plan[host]))
        if isinstance(answer, dict) and not answer.get("error"):
            line = (
                f"pre-pull: {host}: ready, {len(plan[host])} image(s) of ~{total} ({answer['seconds']:.1f}s)"
            )
            console.print(line, markup=False)
        else:
            failed += 1
            error = answer.get("error") if isinstance(answer, dict) else repr(answer)
            console.print(f"pre-pull: {host}: {error}", markup=False)
    return len(plan) - failed


def _answers(
    coord: Coordinator, results: Mapping[str, AsyncResult[Any]], lease_seconds: float
) -> Iterator[tuple[str, object]]:
    """Each host's answer as it arrives; a host that stops beating is not waited for (its answer: why).

    A pull may take long, a host that is gone never answers: the wait for a
    host lasts while it beats (`login.cluster.is_live`), checked every
    `POLL_SEC`.
    """
    pending = dict(results)
    while pending:
        for host, result in list(pending.items()):
            if result.ready():
                del pending[host]
                yield host, result.get(propagate=False)
        if not pending:
            return
        now, hosts = coord.now(), coord.hosts()
        for host in list(pending):
            status = hosts.get(host)
            if status is None or not is_live(status, now, lease_seconds):
                del pending[host]
                yield host, {"error": "stopped beating before it answered; its trials pull what they need"}
        time.sleep(POLL_SEC)
