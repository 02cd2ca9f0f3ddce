"""Coordination state shared by the login node and the workers, beside the broker's queues.

One protocol (`protocol.Coordinator`: results, leases, slots, job control,
display states) over Redis, the lease heartbeat of a running trial, the
lost-host watchdog, and the Celery app both sides configure alike.
`connect` is the one way to the cluster's store, `embedded.coordinator` to
the private one of `submit --local`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sciencebench.coordination.redis import RedisCoordinator
    from sciencebench.core.settings import Settings


def connect(settings: Settings) -> RedisCoordinator:
    """The cluster's store (`settings.broker_url`), as every command and worker reaches it.

    Nothing is sent yet: call `ping` to fail at once when the broker does not answer.
    """
    from sciencebench.coordination.redis import RedisCoordinator  # Redis only for those who connect

    # TLS options ride in the URL's query: every part of the coordinator shares one client (`redis.base`).
    return RedisCoordinator(settings.broker_client_url(settings.broker_url))
