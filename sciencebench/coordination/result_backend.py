"""The result backend: Celery's Redis backend, whose every command waits out a broker outage.

Celery counts a returned trial towards its job's chord in the result backend
(`on_chord_part_return`), and retries storing a result but not this count:
a broker restarting at that moment turned a stored trial into the chord's
failure. Here each connection sends a command again while it cannot reach
the broker, for up to `OUTAGE_SEC` (`PatientRedisBackend`, whose docstring
says why a command sent twice is borne). `Loader` makes Celery use this
backend for `redis://` and `rediss://` URLs (`coordination.celery_app`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cached_property
from typing import Any

import redis
from celery.backends.redis import CHORD_PART_RETURN_LUA, RedisBackend  # type: ignore[attr-defined]  # not in the stubs
from celery.loaders.app import AppLoader
from kombu.utils.encoding import bytes_to_str
from redis.backoff import EqualJitterBackoff
from redis.commands.core import Script
from redis.retry import Retry

from sciencebench.coordination.redis.base import OUTAGE_SEC

# Connection errors that are answers, not an outage: sent again, they fail the same way.
_ANSWERS = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.MaxConnectionsError,
)


class OutageRetry(Retry):
    """Send a command again while its connection fails, until `outage_sec` after the first failure.

    A failure is a connection refused or closed, the broker loading its data,
    or a timeout; an error reply, or a refused login, is an answer.
    """

    def __init__(self, outage_sec: float = OUTAGE_SEC) -> None:
        failures = (redis.ConnectionError, redis.TimeoutError)
        super().__init__(EqualJitterBackoff(cap=2.0, base=0.05), -1, failures)
        self.outage_sec = outage_sec

    def call_with_retry[T](
        self, do: Callable[[], T], fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None, with_failure_count: bool = False,
    ) -> T:  # fmt: skip
        """`do()`, again after each connection failure (`fail` hears of each) until the outage is too long."""
        failures, give_up = 0, float("inf")
        while True:
            try:
                return do()
            except self._supported_errors as error:
                if isinstance(error, _ANSWERS) or (is_retryable and not is_retryable(error)):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                give_up = min(give_up, time.monotonic() + self.outage_sec)
                if time.monotonic() >= give_up:
                    raise
                time.sleep(self._backoff.compute(failures))


class _Count:
    """Celery's chord count script; a count sent again after its reply was lost still knows its claim.

    The script claims the finalizer's send for the count that finds the
    chord complete (`SET <claim key> <token> NX`); run a second time, its
    `NX` fails on its own claim. A complete chord left unclaimed is asked
    whose token holds the claim: this call's means the first run was ours.
    Celery 5.7's arguments: the claim key is `keys[5]`, the token `args[7]`.
    """

    def __init__(self, script: Script) -> None:
        self._script = script

    def __call__(self, keys: list[str], args: list[Any], client: redis.Redis) -> list[Any]:
        readycount, totaldiff, size, claimed = self._script(keys=keys, args=args, client=client)
        complete = size is not None and int(readycount) == int(size) + int(totaldiff or 0)
        if complete and not claimed:
            claimed = int(bytes_to_str(client.get(keys[5]) or b"") == args[7])
        return [readycount, totaldiff, size, claimed]


class PatientRedisBackend(RedisBackend):
    """Celery's Redis result backend; its connections wait out an outage (`OutageRetry`).

    The Redis client Celery makes retries nothing: a broker restarting while a
    trial was counted made the count raise, Celery then stored the trial as
    failed with that ConnectionError and counted the failure, and the job's
    chord ended in error though every record was stored.

    Each connection of this backend's client sends a command again while it
    cannot reach the broker (refused, closed, loading its data, timed out), for
    up to `OUTAGE_SEC`, as the coordinator's calls wait
    (`coordination.redis.base`); a longer outage raises, and so does a refused
    login at once. Celery's own retries around the client are turned off
    (`coordination.celery_app`): they would multiply the wait. A command whose
    reply was lost (or timed out) may run twice, which the backend's commands
    bear: Celery's count adds a trial once (keyed by task id and index), and
    its claim of the finalizer's send is recognised by the token it was sent
    with (`_Count`), so a count sent again still sends the finalizer. (Celery's
    `add_to_chord`, an `INCR`, would not bear it; sciencebench never calls it.)
    """

    outage_sec = OUTAGE_SEC

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connparams["retry"] = OutageRetry(self.outage_sec)  # type: ignore[attr-defined]  # not in the stubs

    @cached_property
    def _chord_part_return_script(self) -> _Count:
        return _Count(self.client.register_script(CHORD_PART_RETURN_LUA))


class Loader(AppLoader):
    """Celery's app loader, with `PatientRedisBackend` for the `redis://` and `rediss://` result backends."""

    override_backends = {  # noqa: RUF012  # BaseLoader's attribute, read by Celery
        "redis": f"{__name__}:PatientRedisBackend",
        "rediss": f"{__name__}:PatientRedisBackend",
    }
