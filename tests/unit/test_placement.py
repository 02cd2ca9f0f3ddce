"""Image-aware placement's choice of a host for a trial (`coordination.placement.Placement`)."""

from __future__ import annotations

import pytest

from sciencebench.coordination.placement import (
    DEFAULT_IMAGE_BYTES,
    MIN_LINE_SEC,
    UNMEASURED_LINE_SEC,
    WAIT_CAP_SEC,
    WAIT_FLOOR_SEC,
    HostView,
    Placement,
    line_seconds,
    pinned,
    remaining,
    wait_bound,
)
from sciencebench.login.prewarm import spread

pytestmark = pytest.mark.unit

GB = 1 << 30


def _ref(name: str) -> str:
    return f"127.0.0.1:5000/t/{name}:v@sha256:{name[0] * 64}"


A, B, C = _ref("a"), _ref("b"), _ref("c")
PA, PB, PC = pinned([A, B, C])


def _cluster(*hosts: HostView, rate: float = 100e6) -> Placement:
    sizes = {image: size for host in hosts for image, size in host.images.items()}
    return Placement(hosts={h.name: h for h in hosts}, sizes=sizes, bytes_per_sec=rate, now=1000.0)


def test_a_trial_takes_a_free_host_that_holds_its_images_over_an_emptier_one() -> None:
    placed = _cluster(HostView("h1", slots=2, busy=1, images={PA: GB}), HostView("h2", slots=2))
    choice = placed.choose([A])
    assert choice is not None and (choice.host, choice.until, choice.pulls) == ("h1", 0.0, ())


def test_an_image_nobody_holds_goes_to_the_freest_host_then_the_one_storing_least() -> None:
    placed = _cluster(HostView("h1", slots=2, busy=1), HostView("h2", slots=2, images={PB: GB}))
    choice = placed.choose([A])
    assert choice is not None and (choice.host, choice.pulls) == ("h2", (PA,))
    placed.take(choice)
    assert placed.hosts["h2"].has(PA)  # pulling it now: the task's next trial goes there too
    placed = _cluster(HostView("h1", slots=2, images={PB: 3 * GB}), HostView("h2", slots=2, images={PC: GB}))
    choice = placed.choose([A])
    assert choice is not None and choice.host == "h2"  # same free slots: the one storing less


def test_a_trial_waits_for_a_busy_holder_for_the_pull_it_saves_and_the_slot_goes_on() -> None:
    placed = _cluster(
        HostView("h1", slots=2, busy=2, images={PA: 10 * GB}), HostView("h2", slots=2, images={PB: GB}),
        rate=100e6,
    )  # fmt: skip
    choice = placed.choose([A])
    assert choice is not None and choice.host == "h1"
    assert choice.until == pytest.approx(1000.0 + 10 * GB / 100e6)  # the pull h2 would need
    placed.take(choice)
    assert (placed.free, placed.waiting) == (2, 1)  # h2's slots are still free for the next trial
    then = placed.choose([B])
    assert then is not None and (then.host, then.until) == ("h2", 0.0)


def test_trials_wait_for_a_busy_holder_each_up_to_its_bound_and_a_free_slot_is_never_taken() -> None:
    placed = _cluster(HostView("h1", slots=1, busy=1, images={PA: GB}), HostView("h2", slots=1))
    for _ in range(3):  # h1's trial ends now, and each of these is expected to take 2 s: the third
        waits = placed.choose([A], measured=2.0)  # starts in 4 s, still before h2's 10.7 s pull
        assert waits is not None and waits.host == "h1" and waits.until == 1000.0 + GB / 100e6
        placed.take(waits)
    assert (placed.free, placed.waiting) == (1, 3)  # h2's slot is left for a trial it suits better
    pulls = placed.choose([B])
    assert pulls is not None and (pulls.host, pulls.until, pulls.pulls) == ("h2", 0.0, (PB,))
    placed.take(pulls)
    assert placed.choose([A]) is None  # no free slot anywhere: nothing is placed


def test_a_host_pulling_an_image_counts_as_holding_it() -> None:
    placed = _cluster(HostView("h1", slots=2, busy=2, pulling={PA}), HostView("h2", slots=2, images={PB: GB}))
    choice = placed.choose([A, B])
    # h2 lacks A (the median reported size), h1 lacks B (1 GiB) but is busy: equal, so no wait.
    assert choice is not None and choice.host == "h2"
    placed = _cluster(HostView("h1", slots=2, busy=2, pulling={PA}), HostView("h2", slots=2))
    choice = placed.choose([A])
    assert choice is not None and choice.host == "h1" and choice.until > 0


def test_a_trial_waits_only_while_the_holder_frees_sooner_than_the_pull_it_saves() -> None:
    """Frees in 20 s, the pull takes 1 s: pull now. Frees in 5 s, the pull takes 60 s: wait, at most the
    60 s saved. The holder's line counts: once it is 65 s long, the next trial pulls instead."""

    def holder(ends: list[float], image: int) -> Placement:
        return _cluster(HostView("h1", 1, busy=1, images={PA: image}, ends=ends), HostView("h2", 1))

    choice = holder([20.0], 100_000_000).choose([A], measured=20.0)
    assert choice is not None and (choice.host, choice.until, choice.pulls) == ("h2", 0.0, (PA,))
    placed = holder([5.0], 6_000_000_000)
    for frees_in in (35.0, 65.0):  # each waiting trial takes the slot for its 30 s
        choice = placed.choose([A], measured=30.0)
        assert choice is not None and choice.host == "h1" and choice.until == pytest.approx(1000.0 + 60.0)
        placed.take(choice)
        assert placed.hosts["h1"].frees_in() == frees_in
    choice = placed.choose([A], measured=30.0)
    assert choice is not None and (choice.host, choice.pulls) == ("h2", (PA,))  # 65 s > the 60 s pull


def test_a_holder_that_frees_within_the_floor_is_waited_for_though_a_pull_is_quicker() -> None:
    """A second copy costs more than its pull's seconds: a 0.1 s pull loses to a holder free in 3 s."""
    placed = _cluster(HostView("h1", 1, busy=1, images={PA: 10_000_000}, ends=[3.0]), HostView("h2", 1))
    choice = placed.choose([A], measured=3.0)
    assert choice is not None and (choice.host, choice.pulls) == ("h1", ())
    assert choice.until == pytest.approx(1000.0 + WAIT_FLOOR_SEC)
    placed = _cluster(HostView("h1", 1, busy=1, images={PA: 10_000_000}, ends=[WAIT_FLOOR_SEC + 1]),
                      HostView("h2", 1))  # fmt: skip
    choice = placed.choose([A], measured=3.0)
    assert choice is not None and (choice.host, choice.pulls) == ("h2", (PA,))  # busy past the floor


def test_a_fresh_unmeasured_trial_s_holder_is_waited_for_and_an_old_one_s_is_not() -> None:
    """Nothing measured the holder's trial: it is expected to run as long again as it has (`remaining`),
    not its timeouts (else every host would pull every image at a job's start). Fresh: wait; 30 s old:
    pull. A waiting trial nothing measured counts half the floor in the line: two per slot wait."""
    assert remaining(None, started=990.0, now=1000.0) == 10.0
    assert remaining(5.0, started=990.0, now=1000.0) == 5.0  # 5 s past its measured seconds: 5 s more
    assert remaining(25.0, started=990.0, now=1000.0) == 15.0
    fresh = remaining(None, started=999.0, now=1000.0)
    placed = _cluster(HostView("h1", 1, busy=1, images={PA: 10_000_000}, ends=[fresh]), HostView("h2", 1))
    choice = placed.choose([A])
    assert choice is not None and choice.host == "h1"
    placed.take(choice)
    assert placed.hosts["h1"].frees_in() == pytest.approx(1.0 + UNMEASURED_LINE_SEC)
    choice = placed.choose([A])
    assert choice is not None and choice.host == "h1"
    placed.take(choice)
    assert placed.hosts["h1"].frees_in() == pytest.approx(1.0 + 2 * UNMEASURED_LINE_SEC)
    choice = placed.choose([A])  # the next would wait past the floor: it pulls on h2
    assert choice is not None and (choice.host, choice.pulls) == ("h2", (PA,))
    old = remaining(None, started=970.0, now=1000.0)
    placed = _cluster(HostView("h1", 1, busy=1, images={PA: 10_000_000}, ends=[old]), HostView("h2", 1))
    choice = placed.choose([A])
    assert choice is not None and (choice.host, choice.pulls) == ("h2", (PA,))


def test_the_wait_is_the_saved_pull_between_a_floor_and_a_cap() -> None:
    assert wait_bound(0, 100e6) == WAIT_FLOOR_SEC
    assert wait_bound(10 * GB, 100e6) == pytest.approx(10 * GB / 100e6)
    assert wait_bound(1000 * GB, 100e6) == WAIT_CAP_SEC
    assert wait_bound(10 * GB, 0.0) == pytest.approx(10 * GB / 50e6)  # no measured pull yet: a default
    assert _cluster().size(PA) == DEFAULT_IMAGE_BYTES
    assert _cluster(HostView("h", 1, images={PB: 2, PC: 4})).size(PA) == 3  # the median reported


def test_prepull_spreads_each_image_to_one_host_balanced_by_size() -> None:
    sizes = {A: 8 * GB, B: 5 * GB, C: 4 * GB}
    d = _ref("d")
    plan = spread([A, B, C, d], ["h1", "h2"], sizes | {d: 2 * GB}, held={})
    assert sorted(ref for refs in plan.values() for ref in refs) == sorted([A, B, C, d])
    assert plan == {"h1": [A, d], "h2": [B, C]}  # largest first to the host with the fewest bytes
    plan = spread([A, B], ["h1", "h2"], sizes, held={"h2": {PA}})
    assert plan == {"h1": [B]}  # what a live host holds is not pulled again


def test_a_trial_is_not_sent_to_wait_for_a_holder_that_frees_only_after_its_capped_bound() -> None:
    """20 GiB at 10 MB/s: the free host's pull takes 2147 s, the holder frees in 1000 s, but a wait is
    capped at 15 min: it would lapse before the holder frees. Pull now instead."""
    placed = _cluster(HostView("h1", 1, busy=1, images={PA: 20 * GB}, ends=[1000.0]), HostView("h2", 1),
                      rate=10e6)  # fmt: skip
    choice = placed.choose([A], measured=60.0)
    assert choice is not None and (choice.host, choice.pulls) == ("h2", (PA,))


def test_a_host_pulling_an_image_is_not_expected_to_free_before_its_pull_ends() -> None:
    """Nobody holds a (1 GiB assumed, 21.5 s at 50 MB/s): its first trial goes to h1, which pulls it and
    then runs 15 s, so h1's slot frees in 36.5 s, past the 21.5 s a wait would save: the second pulls
    on h2 now."""
    placed = Placement(hosts={h: HostView(h, 1) for h in ("h1", "h2")}, sizes={}, bytes_per_sec=50e6,
                       now=1000.0)  # fmt: skip
    first = placed.choose([A], measured=15.0)
    assert first is not None and (first.host, first.pulls) == ("h1", (PA,))
    placed.take(first)
    assert placed.hosts["h1"].frees_in() == pytest.approx(GB / 50e6 + 15.0)
    second = placed.choose([A], measured=15.0)
    assert second is not None and (second.host, second.pulls) == ("h2", (PA,))


def test_a_holder_long_past_its_measured_seconds_is_not_due_now_for_ever() -> None:
    """Attempt 1 measured 1 s; attempt 2 has run 300 s on h1: it is expected to go on 299 s more, so
    the next trial of the image pulls on the free h2 rather than wait on h1."""
    overdue = remaining(1.0, started=700.0, now=1000.0)
    assert overdue == 299.0
    placed = _cluster(HostView("h1", 1, busy=1, images={PA: 10_000_000}, ends=[overdue]), HostView("h2", 1))
    choice = placed.choose([A], measured=1.0)
    assert choice is not None and (choice.host, choice.pulls) == ("h2", (PA,))


def test_a_line_counts_each_trial_at_least_a_second() -> None:
    """A record that measured 0 s must not let every trial of the image line up on one host."""
    assert line_seconds(0.0) == MIN_LINE_SEC and line_seconds(None) == UNMEASURED_LINE_SEC
    placed = _cluster(HostView("h1", 1, busy=1, images={PA: 10_000_000}, ends=[0.5]), HostView("h2", 1))
    waits = 0
    while (choice := placed.choose([A], measured=0.0)) is not None and choice.host == "h1":
        placed.take(choice)
        waits += 1
    assert waits == int(WAIT_FLOOR_SEC / MIN_LINE_SEC)  # the line reached the floor, then h2 pulls
