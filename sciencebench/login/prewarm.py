"""Dry run with workers: every worker host pulls the selection's images once.

Each live worker gets one `prewarm_images` task on its direct queue
(`worker_direct`); pulls are deduplicated per host, so several workers on
one host still pull each image once. Nothing else runs.
"""

from __future__ import annotations

from celery import Celery
from celery.utils.nodenames import worker_direct
from rich.console import Console

from sciencebench.core.wire import PREWARM_IMAGES


def prewarm(app: Celery, refs: list[str], platform: str, console: Console, ping_sec: float = 2.0) -> int:
    """Ask every worker that answers a ping to pull `refs`; wait; return how many did."""
    workers = sorted(name for reply in app.control.ping(timeout=ping_sec) or [] for name in reply)
    if not workers:
        console.print("pre-warm: no worker answered; nothing pulled")
        return 0
    console.print(f"pre-warm: {len(workers)} worker(s) pulling {len(refs)} image(s) ...")
    queues = {name: worker_direct(name) for name in workers}
    results = {
        name: app.send_task(
            PREWARM_IMAGES, args=(refs, platform), exchange=queue.exchange.name, routing_key=queue.routing_key
        )
        for name, queue in queues.items()
    }
    failed = 0
    for name, result in results.items():
        answer = result.get(propagate=False)
        if isinstance(answer, dict) and not answer.get("error"):
            console.print(f"pre-warm: {name}: ready ({answer['seconds']:.1f}s)", markup=False)
        else:
            failed += 1
            error = answer.get("error") if isinstance(answer, dict) else repr(answer)
            console.print(f"pre-warm: {name}: {error}", markup=False)
    return len(workers) - failed
