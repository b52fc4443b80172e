"""A load slower than computing is declined at the IO commit (``load_slower_than_compute``),
from the speeds the engine measured: the estimate itself, then the decision in the pipeline;
and a read that has run longer than computing would take loses its request
(``give_up_slow_read``)."""

from __future__ import annotations

import math

import pytest

from stagefate.runtime import ManualClock
from stagefate.statemachine.speeds import UNKNOWN, LoadSpeeds, SpeedEstimate
from stagefate.testing import Pair, assert_quiescent, make_pair, step_io

from .harness import config, seq_of

# ---------------------------------------------------------------------- the estimate


def test_nothing_is_declined_before_both_speeds_are_measured() -> None:
    speeds = LoadSpeeds()
    assert speeds.estimate() == SpeedEstimate()
    speeds.observe_load(64, 10.0)
    assert speeds.estimate().compute_ns_per_token == UNKNOWN
    assert not speeds.estimate().load_slower_than_compute(64)
    speeds.observe_forward(64, 1e-3)
    assert speeds.estimate().load_slower_than_compute(64)
    speeds.forget()
    assert speeds.estimate() == SpeedEstimate()


def test_loads_of_two_sizes_give_a_latency_and_a_cost_per_token() -> None:
    speeds = LoadSpeeds()
    for _ in range(3):
        speeds.observe_load(100, 0.011)  # 10 ms of latency, 10 µs a token
        speeds.observe_load(1000, 0.020)
    estimate = speeds.estimate()
    assert estimate.load_latency_ns == pytest.approx(10_000_000, rel=1e-6)
    assert estimate.load_ns_per_token == pytest.approx(10_000, rel=1e-6)


def test_loads_all_of_one_size_are_all_latency() -> None:
    speeds = LoadSpeeds()
    speeds.observe_load(64, 0.002)
    speeds.observe_load(64, 0.004)
    estimate = speeds.estimate()
    assert estimate.load_ns_per_token == 0
    assert 2_000_000 < estimate.load_latency_ns < 4_000_000  # the newer weighs more


def test_a_forwards_cost_is_its_seconds_over_its_tokens_big_steps_weighing_most() -> None:
    speeds = LoadSpeeds()
    speeds.observe_forward(2000, 0.1)  # a prefill: 50 µs a token
    speeds.observe_forward(1, 0.005)  # a decode step's fixed cost barely moves it
    # the older step weighs 0.9 (the default memory) against the newer's 1
    expected = (0.9 * 0.1 + 0.005) / (0.9 * 2000 + 1) * 1e9
    assert math.isclose(speeds.estimate().compute_ns_per_token, expected, abs_tol=1)


def test_a_read_still_running_is_a_floor_under_the_loads_latency() -> None:
    speeds = LoadSpeeds()
    speeds.observe_forward(100, 1e-3)  # 10 µs a token
    speeds.observe_running_read(100, 0.5)  # no load finished yet, one has run half a second
    estimate = speeds.estimate()
    assert (estimate.load_latency_ns, estimate.load_ns_per_token) == (500_000_000, 0)
    assert estimate.load_slower_than_compute(100)
    speeds.observe_load(100, 0.001)  # a load finished in 1 ms: the running read still floors it
    assert speeds.estimate().load_latency_ns == 500_000_000
    speeds.observe_running_read(0, 0.0)  # no read in flight any more
    assert speeds.estimate().load_latency_ns == 1_000_000
    assert not speeds.estimate().load_slower_than_compute(200)


def test_the_decision_compares_the_load_with_computing_the_same_tokens() -> None:
    estimate = SpeedEstimate(
        load_latency_ns=1_000_000, load_ns_per_token=0, compute_ns_per_token=10_000
    )
    assert estimate.load_slower_than_compute(50)  # 1 ms against 0.5 ms
    assert not estimate.load_slower_than_compute(200)  # 1 ms against 2 ms
    assert not estimate.load_slower_than_compute(0)


@pytest.mark.parametrize(
    ("call", "tokens", "seconds", "problem"),
    [
        ("observe_load", -1, 0.1, "tokens=-1"),
        ("observe_load", True, 0.1, "tokens=True"),
        ("observe_forward", 8, -0.5, "seconds=-0.5"),
        ("observe_forward", 8, float("nan"), "seconds=nan"),
    ],
)
def test_a_nonsensical_measurement_is_refused_and_changes_nothing(
    call: str, tokens: int, seconds: float, problem: str
) -> None:
    speeds = LoadSpeeds()
    with pytest.raises(ValueError, match=problem):
        getattr(speeds, call)(tokens, seconds)
    assert speeds.estimate() == SpeedEstimate()


def test_a_memory_outside_its_range_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"memory=1.0: .* must lie in \(0, 1\)"):
        LoadSpeeds(memory=1.0)


# ---------------------------------------------------------------------- the decision


def _stored(pages: int, host_tokens: int = 64) -> tuple[Pair, list[int]]:
    pair = make_pair(config(host_tokens=host_tokens))
    seq = seq_of(pages, 1)
    pair.publish(seq, mark=3.0)
    return pair, seq


def _slow_loads(pair: Pair) -> None:
    speeds = pair.consumer.speeds
    speeds.observe_load(8, 1.0)  # a second a load
    speeds.observe_forward(8, 8e-6)  # a microsecond a token


@pytest.mark.invariant("pure_revoke", "exactly_once_end")
def test_a_span_whose_load_is_slower_than_computing_is_declined_before_l3_is_asked() -> None:
    pair, seq = _stored(8)
    _slow_loads(pair)
    consumer = pair.consumer
    assert consumer.prefetch_from_storage("r", seq, 0) == "released"
    assert pair.outcomes == [("r", "issued", "released", "declined_slower_than_compute")]
    assert consumer.io.pending() == 0  # no existence query
    assert not consumer.prefetch_pending("r")  # the scheduler admits it and computes
    assert not consumer.retry_pending("r")  # the speeds decide again only at a new issue
    assert_quiescent(consumer)


@pytest.mark.invariant("pure_revoke", "exactly_once_end")
def test_a_hit_whose_load_became_slower_than_computing_is_declined_before_any_read() -> None:
    pair, seq = _stored(8)
    consumer = pair.consumer
    consumer.prefetch_from_storage("r", seq, 0)  # nothing measured yet: L3 is asked
    _slow_loads(pair)  # measured while the existence query runs
    pair.settle()
    assert pair.outcomes[-1] == ("r", "no_anchor", "released", "declined_slower_than_compute")
    stats = consumer.stats
    assert stats.declined_slower_than_compute == 1
    assert stats.l3_reads == 0  # no bounce taken, nothing read
    assert not consumer.retry_pending("r")
    assert_quiescent(consumer)


@pytest.mark.invariant("exactly_once_end")
def test_a_hit_parked_while_loads_were_fast_is_declined_once_they_are_slow() -> None:
    pair, seq = _stored(8, host_tokens=8)
    consumer = pair.consumer
    held = consumer.host_pool.alloc(4)  # room for half the span: the hit parks
    assert held is not None
    consumer.prefetch_from_storage("r", seq, 0)
    pair.settle()
    assert consumer.state("r") == "parked"
    _slow_loads(pair)
    consumer.poll()
    assert pair.outcomes[-1] == ("r", "parked", "released", "declined_slower_than_compute")
    consumer.host_pool.free(held)
    assert_quiescent(consumer)


def test_fast_loads_are_read_as_before() -> None:
    pair, seq = _stored(8)
    consumer = pair.consumer
    consumer.speeds.observe_load(8, 1e-6)
    consumer.speeds.observe_forward(8, 1.0)
    consumer.prefetch_from_storage("r", seq, 0)
    pair.settle()
    assert consumer.has_hold("r")
    consumer.release_staged_hold("r")
    assert consumer.stats.declined_slower_than_compute == 0
    assert_quiescent(consumer)


# ---------------------------------------------------------------------- giving up a slow read


def _reading(forward_s_per_token: float | None) -> tuple[Pair, ManualClock, list[int]]:
    """``r``'s read of an 8-page span in flight on a consumer whose reads a manual clock times
    (``forward_s_per_token``: the forward speed the engine measured, if any)."""
    clock = ManualClock()
    pair = make_pair(config(), clock)
    seq = seq_of(8, 1)
    pair.publish(seq, mark=3.0)
    consumer = pair.consumer
    if forward_s_per_token is not None:
        consumer.speeds.observe_forward(8, 8 * forward_s_per_token)
    consumer.prefetch_from_storage("r", seq, 0)
    step_io(consumer, "exists")  # the hit, then the commit: the read is in flight
    assert consumer.state("r") == "reading"
    return pair, clock, seq


@pytest.mark.invariant("exactly_once_end", "hold_release")
def test_a_read_that_ran_longer_than_computing_loses_its_request_and_lands_unused() -> None:
    pair, clock, _ = _reading(forward_s_per_token=1e-3)
    consumer = pair.consumer
    computing = consumer.live_records["r"].read_tokens * 1e-3  # what computing them takes
    assert not consumer.give_up_slow_read("r")  # just launched: it may still win
    clock.advance(0.9 * computing)
    assert not consumer.give_up_slow_read("r")
    assert consumer.state("r") == "reading"
    clock.advance(0.2 * computing)  # computing would have been done by now
    assert consumer.give_up_slow_read("r")
    assert pair.outcomes[-1] == ("r", "reading", "outrun", None)
    assert not consumer.prefetch_pending("r")  # the scheduler admits it and computes
    assert not consumer.has_hold("r")
    assert consumer.pinned_tokens == 0
    assert consumer.host_pool.available() < consumer.host_pool.capacity  # the read writes it
    assert not consumer.give_up_slow_read("r")  # asked again: nothing to decide
    step_io(consumer, "read")  # the read lands: its bounce is freed, nothing spliced
    assert pair.outcomes[-1] == ("r", "outrun", "released", "outrun_by_compute")
    stats = consumer.stats
    assert (stats.outrun_by_compute, stats.l3_reads, stats.l3_reads_wasted) == (1, 1, 1)
    assert_quiescent(consumer)


def test_nothing_is_given_up_before_a_forward_is_measured() -> None:
    pair, clock, _ = _reading(forward_s_per_token=None)
    clock.advance(3600.0)
    assert not pair.consumer.give_up_slow_read("r")
    assert pair.consumer.state("r") == "reading"


@pytest.mark.invariant("dedup_waiters")
def test_a_request_waiting_on_a_read_given_up_is_due_at_once() -> None:
    pair, clock, seq = _reading(forward_s_per_token=1e-3)
    consumer = pair.consumer
    consumer.prefetch_from_storage("s", seq, 0)  # the same span: it waits on r's read
    step_io(consumer, "exists")
    assert consumer.waiting_on("s") == "r" and consumer.prefetch_pending("s")
    clock.advance(1.0)
    assert consumer.give_up_slow_read("r")
    assert consumer.waiting_on("s") is None
    assert consumer.due_retries(["s"]) == ["s"]  # it issues again and decides afresh
