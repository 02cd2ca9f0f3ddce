"""The per-gateway concurrency limits (no Docker), on the session's embedded store."""

from __future__ import annotations

import time

import pytest

from sciencebench.coordination.gateways import GatewayLimits, GatewaySlot
from sciencebench.coordination.redis import RedisCoordinator

TTL = 0.4
GW = "gw:4000"


pytestmark = pytest.mark.unit


@pytest.fixture
def limits(store: RedisCoordinator) -> GatewayLimits:
    return GatewayLimits(store)


def test_the_limit_starts_at_n_concurrent_and_admits_that_many(limits: GatewayLimits) -> None:
    assert [limits.acquire(GW, f"t{n}", 3, 30) for n in range(4)] == [True, True, True, False]
    assert limits.acquire(GW, "t0", 3, 30)  # a holder refreshes its own slot
    limits.release(GW, "t1")
    assert limits.acquire(GW, "t3", 3, 30)
    (limit,) = limits.limits()
    assert (limit.authority, limit.limit, limit.ceiling, limit.held, limit.status) == (GW, 3, 3, 3, "")


def test_a_provider_error_halves_it_never_below_one_and_successes_grow_it_back(limits: GatewayLimits) -> None:
    limits.acquire(GW, "t0", 6, 30)
    assert [limits.provider_error(GW, "429") for _ in range(4)] == [3, 1, 1, 1]
    (limit,) = limits.limits()
    assert limit.status == "429" and "halved" in limit.reason and limit.error_at > 0
    assert not limits.acquire(GW, "t1", 6, 30)  # one slot, held by t0
    assert [limits.success(GW) for _ in range(7)] == [2, 3, 4, 5, 6, 6, 6]  # up to the ceiling
    assert limits.acquire(GW, "t1", 6, 30)
    assert limits.limits()[0].status == "429"  # the last provider error is still shown


def test_tries_that_started_before_a_halving_halve_nothing_again(limits: GatewayLimits) -> None:
    limits.acquire(GW, "t0", 8, 30)
    before = limits.now()
    time.sleep(0.01)
    assert limits.provider_error(GW, "429", since=before) == 4  # the first failure of the round halves
    assert limits.provider_error(GW, "500", since=before) == 4  # the others of that round do not
    assert limits.limits()[0].status == "500"
    assert limits.provider_error(GW, "429", since=limits.now()) == 2  # a try started since: again


def test_other_authorities_are_not_affected(limits: GatewayLimits) -> None:
    limits.acquire(GW, "a", 4, 30)
    limits.acquire("other:443", "b", 4, 30)
    limits.provider_error(GW, "500")
    by_authority = {limit.authority: limit.limit for limit in limits.limits()}
    assert by_authority == {GW: 2, "other:443": 4}


def test_a_lost_holders_slot_lapses_and_a_renewed_one_does_not(limits: GatewayLimits) -> None:
    assert limits.acquire(GW, "lost", 2, TTL) and limits.acquire(GW, "alive", 2, TTL)
    assert not limits.acquire(GW, "new", 2, TTL)
    deadline = time.monotonic() + 3 * TTL
    while time.monotonic() < deadline:
        assert limits.renew(GW, "alive", TTL)
        time.sleep(TTL / 4)
    assert limits.acquire(GW, "new", 2, TTL)  # "lost" lapsed
    assert not limits.acquire(GW, "third", 2, TTL)  # "alive" did not
    assert not limits.renew(GW, "lost", TTL)


def test_a_slot_waits_renews_and_gives_back(limits: GatewayLimits) -> None:
    first = GatewaySlot(limits, GW, "first", 1, TTL)
    assert first.wait(lambda: False)
    time.sleep(3 * TTL)  # renewed meanwhile: still held
    second = GatewaySlot(limits, GW, "second", 1, TTL)
    stops = iter([False, False, True])
    assert not second.wait(lambda: next(stops), poll_sec=0.01)  # the trial had to stop while it waited
    first.release()
    assert second.wait(lambda: False)
    second.release()
    assert limits.limits()[0].held == 0
