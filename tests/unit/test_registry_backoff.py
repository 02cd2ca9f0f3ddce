"""Registries that push back: their answers read, the back-off shared, a trial's waits (no Docker, no Redis).

The trial cases run `worker.trial.handle` as `test_trial_states` does (a
real persisted job, the session's embedded store, the fake engine seam), the engine
refusing pulls as the Docker Engine reports a registry's 429.
"""

from __future__ import annotations

import time
from email.utils import formatdate
from pathlib import Path

import pytest

from sciencebench.coordination.redis import RedisCoordinator
from sciencebench.coordination.registries import RedisRegistryMarks, RegistryState, backoff_sec
from sciencebench.core.errors import RegistryError
from sciencebench.core.models import TrialRecord
from sciencebench.core.registryhints import hint_sec, parse_ratelimit, parse_retry_after, refusal_status
from sciencebench.core.summary import REGISTRY_ERROR, failure_class
from sciencebench.worker.dispatch import Answer
from sciencebench.worker.docker.registryprobe import registry_url
from tests.unit.test_trial_states import _uncounted, _world  # noqa: F401  (its fixture: leases stop renewing)

pytestmark = pytest.mark.unit

# What the Docker Engine 28 answers (the API's explanation) when the registry refuses a manifest GET.
ENGINE_429 = (
    "toomanyrequests: You have reached your pull rate limit. You may increase the limit by authenticating"
)


@pytest.mark.parametrize(
    ("message", "status"),
    [
        (ENGINE_429, "429"),
        ("received unexpected HTTP status: 503 Service Unavailable", "503"),
        ("error parsing HTTP 502 response body: ... 502 Bad Gateway", "502"),
        ("read tcp 10.0.0.2:5->1.2.3.4:443: read: connection reset by peer", "reset"),
        ('Get "http://127.0.0.1:9/v2/": dial tcp 127.0.0.1:9: connect: connection refused', "refused"),
        ("Get \"https://registry-1.docker.io/v2/\": net/http: TLS handshake timeout", "timeout"),
        ("context deadline exceeded", "timeout"),
        ("manifest unknown: manifest unknown", None),
        ("pull access denied for x, repository does not exist or may require 'docker login'", None),
        ("write /var/lib/docker/tmp/x: no space left on device", None),
    ],
)  # fmt: skip
def test_a_refused_pull_is_told_from_the_trials_own_failures(message: str, status: str | None) -> None:
    assert refusal_status(message) == status


def test_retry_after_is_seconds_or_an_http_date() -> None:
    now = time.time()
    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after(formatdate(now + 90, usegmt=True), now) == pytest.approx(90, abs=1.5)
    assert parse_retry_after(formatdate(now - 90, usegmt=True), now) == 0.0
    assert parse_retry_after("soon", now) is None


def test_ratelimit_headers_give_a_count_and_a_window() -> None:
    assert parse_ratelimit("100;w=21600") == (100, 21600.0)
    assert parse_ratelimit(" 0 ; w=60") == (0, 60.0)
    assert parse_ratelimit("100") == (100, None)
    assert parse_ratelimit("many;w=60") is None
    assert parse_ratelimit("1;w=-5") is None


def test_the_wait_a_registry_asks_for() -> None:
    now = time.time()
    hub = {"ratelimit-limit": "100;w=21600", "ratelimit-remaining": "0;w=21600"}
    assert hint_sec(hub, now) == 216.0  # one GET frees up every window / limit
    assert hint_sec({**hub, "Retry-After": "30"}, now) == 30.0  # Retry-After wins
    assert hint_sec({"RateLimit-Remaining": "0;w=60"}, now) == 60.0  # no limit: the whole window
    assert hint_sec({**hub, "ratelimit-remaining": "7;w=21600"}, now) is None  # GETs left: none asked
    assert hint_sec({"Content-Type": "application/json"}, now) is None


def test_the_back_off_doubles_with_jitter_up_to_its_cap_and_honours_a_hint() -> None:
    assert [backoff_sec(n, None, 10, 60, rng=lambda: 1.0) for n in range(1, 6)] == [10, 20, 40, 60, 60]
    assert backoff_sec(3, None, 10, 60, rng=lambda: 0.0) == 20  # jitter: between half and all of it
    assert backoff_sec(1, 300, 10, 60, rng=lambda: 0.0) == 300  # a hint past the cap is the registry's window
    assert backoff_sec(1, 300, 10, 60, rng=lambda: 1.0) == pytest.approx(330)


def test_a_refusal_is_shared_its_wait_only_ever_grows_and_status_says_so(store: RedisCoordinator) -> None:
    marks = RedisRegistryMarks(store)
    first = marks.refused("docker.io", "429", "toomanyrequests", 240, 1, 10)
    now = marks.now()
    assert 239 <= first.wait_sec(now) <= 265 and first.failures == 1
    second = marks.refused("docker.io", "503", "503 Service Unavailable", None, 1, 10)  # a shorter wait
    assert second.not_before == first.not_before and second.failures == 2 and second.status == "503"
    marks.refused("127.0.0.1:5000", "reset", "connection reset by peer", None, 1, 10)
    assert [state.registry for state in marks.states()] == ["127.0.0.1:5000", "docker.io"]
    rate_limited = RegistryState("docker.io", now + 240, "429", "toomanyrequests", 1, now)
    assert rate_limited.line(now) == "registry docker.io: rate-limited (429), next try in 4m; toomanyrequests"
    assert "failing (503), next try in 30s, 3 refusals in a row" in RegistryState(
        "r:1", now + 30, "503", "x", 3, now
    ).line(now)


def test_the_registry_url_is_plain_http_on_loopback_only() -> None:
    assert registry_url("docker.io") == "https://registry-1.docker.io"
    assert registry_url("127.0.0.1:5555") == "http://127.0.0.1:5555"
    assert registry_url("localhost:5000") == "http://localhost:5000"
    assert registry_url("ghcr.io") == "https://ghcr.io"


def _refusing(times: int) -> tuple[list[int], object]:
    calls = [0]

    def ensure_images(refs: list[str], platform: str, skip_pull: bool) -> None:
        calls[0] += 1
        if calls[0] <= times:
            raise RegistryError(f"registry docker.io refused: {ENGINE_429}", "docker.io", "429", 2.0)

    return calls, ensure_images


def test_a_registry_that_pushes_back_is_waited_out_whatever_max_retries_says(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    world = _world(store, tmp_path, [None], max_retries=0)
    calls, world.runtime.ensure_images = _refusing(2)  # type: ignore[method-assign]
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    record = outcome.record
    assert record.exception_type is None and record.registry_status is None and record.tries == 3
    assert [t.registry_status for t in record.earlier_tries] == ["429", "429"]
    assert calls[0] == 3 and world.pier.runs == 1
    assert sum(world.slept) >= 2 * 2.0  # the registry's hint, each time
    (state,) = RedisRegistryMarks(world.coord).states()  # shared: every host of the store waits as long
    assert (state.registry, state.status, state.failures) == ("docker.io", "429", 2)


def test_past_the_registry_deadline_the_trial_ends_as_the_registrys_failure(
    tmp_path: Path, store: RedisCoordinator
) -> None:
    world = _world(store, tmp_path, [None], max_retries=3)
    world.ctx.settings = world.ctx.settings.model_copy(update={"registry_deadline_sec": 1.0})
    calls, world.runtime.ensure_images = _refusing(1000)  # type: ignore[method-assign]
    outcome = world.handle()
    assert isinstance(outcome, Answer)
    record = outcome.record
    assert record.registry_status == "429" and record.exception_type == "RegistryError"
    assert record.stage == "pull" and not record.scored and failure_class(record) == REGISTRY_ERROR
    assert record.tries == calls[0] == 1  # the registry's wait of 2 s ends past the deadline: no retry either
    assert world.pier.runs == 0
    assert TrialRecord.model_validate_json(record.model_dump_json()).registry_status == "429"


def test_a_pull_held_back_by_the_clusters_back_off_waits_it_out_without_counting_a_refusal(
    tmp_path: Path,
    store: RedisCoordinator,
) -> None:
    world = _world(store, tmp_path, [None])
    marks = RedisRegistryMarks(world.coord)
    marks.refused("docker.io", "429", "another host was refused", 3.0, 1, 10)  # the cluster backs off
    calls = [0]

    def ensure_images(refs: list[str], platform: str, skip_pull: bool) -> None:
        calls[0] += 1
        if calls[0] == 1:  # as `ImagePuller` holds a pull back: nothing sent to the registry
            raise RegistryError("pull held back", "docker.io", "429", 3.0, asked=False)

    world.runtime.ensure_images = ensure_images  # type: ignore[method-assign]
    outcome = world.handle()
    assert isinstance(outcome, Answer) and outcome.record.exception_type is None and outcome.record.tries == 2
    assert 3.0 <= sum(world.slept) <= 3.5  # the rest of the cluster's wait, and its own jitter
    (state,) = marks.states()
    assert state.failures == 1  # a pull never sent is no refusal
