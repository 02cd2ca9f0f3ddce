"""The Redis connection every part of `RedisCoordinator` shares, and how it waits out an outage.

Operations wait out a broker outage of up to `outage_sec`: a restart or a
network blip must not turn a finished trial into a lost one, so commands are
retried with backoff and only a longer outage raises BrokerUnavailableError.
`recovered_at` (monotonic) is when the last outage ended, for the watchdog's
grace period.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from sciencebench.coordination import scripts
from sciencebench.core.errors import BrokerUnavailableError
from sciencebench.core.settings import Settings

_OUTAGE_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
# How long a call waits out a broker outage before it raises (the result backend's too).
OUTAGE_SEC = 900.0


def chunks[T](items: list[T], size: int) -> list[list[T]]:
    """`items` in runs of at most `size` (one command or script each)."""
    return [items[i : i + size] for i in range(0, len(items), size)]


def redis_client(url: str, settings: Settings | None = None) -> redis.Redis:
    """A client of the store at `url` (`decode_responses`), with TLS as `settings` say for rediss://.

    Without `settings`, `url` alone says: a rediss:// URL verifies the broker
    against the system's CAs, or as its own query says (`Settings.broker_client_url`).
    """
    url = settings.broker_client_url(url) if settings else url
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)


class RedisBase:
    """One client (`decode_responses`), the store's clock and the outage rule; `ping` answers at once."""

    def __init__(self, url: str, outage_sec: float = OUTAGE_SEC) -> None:
        self._redis: redis.Redis = redis_client(url)
        self.outage_sec = outage_sec
        self._recovered_at = float("-inf")

    def _script(self, script: scripts.Script) -> scripts.Registered:
        """`script` registered with this client."""
        return scripts.Registered(self._redis, script)

    def close(self) -> None:
        """Close this coordinator's connections (it may not be used afterwards)."""
        self._redis.close()

    @property
    def client(self) -> redis.Redis:
        """The Redis client (`coordination.gateways` keeps its own keys through it)."""
        return self._redis

    @property
    def recovered_at(self) -> float:
        """When (monotonic) the last broker outage ended; -inf when there was none."""
        return self._recovered_at

    def patiently[T](self, fn: Callable[[], T]) -> T:
        """Run `fn` (any Redis-backed call, e.g. Celery's result backend) waiting out outages.

        Raises BrokerUnavailableError when the broker stays unreachable for `outage_sec`.
        """
        started = time.monotonic()
        delay = 0.2
        failed = False
        while True:
            try:
                result = fn()
            except _OUTAGE_ERRORS as exc:
                failed = True
                if time.monotonic() - started > self.outage_sec:
                    raise self.unavailable(
                        f"unreachable for {self.outage_sec:.0f}s: {exc.__class__.__name__}"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if failed:
                self._recovered_at = time.monotonic()
            return result

    def ping(self) -> None:
        """Raise BrokerUnavailableError at once when the broker does not answer."""
        try:
            self._redis.ping()
        except redis.RedisError as exc:
            raise self.unavailable(f"unreachable: {exc.__class__.__name__}") from None

    def unavailable(self, problem: str) -> BrokerUnavailableError:
        """The error of this store's `problem` ("unreachable: ConnectionError"): the broker's, here."""
        return BrokerUnavailableError(f"broker {problem}")

    def _mget(self, names: list[str]) -> list[str | None]:
        values = self.patiently(lambda: self._redis.mget(names))
        return [None if value is None else str(value) for value in values]

    def _hash(self, name: str) -> dict[str, str]:
        raw = self.patiently(lambda: self._redis.hgetall(name))
        return {str(key): str(value) for key, value in raw.items()}

    def now(self) -> float:
        """The server's clock (`TIME`)."""
        seconds, micros = self.patiently(lambda: self._redis.time())
        return float(seconds) + float(micros) / 1e6
