"""Bad input: a clear error naming the problem and the fix; no state change; nothing leaked.

Scheduler queries stay tolerant (as in SGLang), since they are asked for every request.
"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from stagefate import BufferPipeline, LifecycleError, PipelineConfig

from .harness import assert_quiescent, config, make_pair, seq_of

EMPTY = torch.empty(0, dtype=torch.int64)


def staged_pair():  # type: ignore[no-untyped-def]
    pair = make_pair(config())
    seq = seq_of(5, 1)
    pair.publish(seq, mark=9)
    pair.consumer.prefetch_from_storage("r", seq, 0)
    pair.settle()
    assert pair.consumer.state("r") == "staged"
    return pair


def snapshot(pipe: BufferPipeline) -> tuple[object, ...]:
    return (
        {rid: rec.state for rid, rec in pipe.live_records.items()},
        pipe.host_pool.available(),
        pipe.device_pool.available(),
        pipe.pinned_tokens,
        pipe.stats,
    )


@pytest.mark.parametrize(
    ("tokens", "matched_len", "error", "message"),
    [
        ([1, 2, 3], -1, ValueError, r"matched_len=-1 must lie in \[0, len\(tokens\)=3\]"),
        ([1, 2, 3], 4, ValueError, r"matched_len=4 must lie in"),
        ([1, 2, 3], 1.0, TypeError, "matched_len must be an int"),
        ("abc", 0, TypeError, "tokens must be a sequence of ints"),
        ([1.5, 2], 0, TypeError, "tokens must contain ints only"),
        (torch.tensor([1.0, 2.0]), 0, TypeError, "1-D integer tensor"),
    ],
)
def test_bad_prefetch_arguments(
    tokens: object, matched_len: object, error: type, message: str
) -> None:
    pair = staged_pair()
    before = snapshot(pair.consumer)
    with pytest.raises(error, match=message):
        pair.consumer.prefetch_from_storage("new", tokens, matched_len)  # type: ignore[arg-type]
    assert snapshot(pair.consumer) == before


def test_unaligned_matched_len_names_the_page_size() -> None:
    pipe = BufferPipeline(config(page_size=4))
    with pytest.raises(ValueError, match="multiple of page_size=4"):
        pipe.prefetch_from_storage("r", list(range(16)), 2)
    assert pipe.is_idle()


def test_commands_on_unknown_requests_raise_lifecycle_errors() -> None:
    pipe = BufferPipeline(config())
    expected = (
        "request 'ghost': event 'lock' is not allowed in no live prefetch; "
        "issue it with prefetch_from_storage first"
    )
    with pytest.raises(LifecycleError, match=expected):
        pipe.try_lock_anchor("ghost")
    with pytest.raises(LifecycleError, match="'consume' is not allowed in no live prefetch"):
        pipe.init_load_back("ghost", EMPTY)
    assert_quiescent(pipe)


def test_consume_before_staged_raises_and_changes_nothing() -> None:
    pair = make_pair(config())
    seq = seq_of(5, 1)
    pair.publish(seq, mark=9)
    pair.consumer.prefetch_from_storage("r", seq, 0)
    pair.consumer.io.complete_all()  # type: ignore[attr-defined]
    pair.consumer.poll()
    before = snapshot(pair.consumer)
    with pytest.raises(LifecycleError, match="'consume' is not allowed in state 'reading'"):
        pair.consumer.init_load_back("r", EMPTY)
    assert snapshot(pair.consumer) == before
    pair.consumer.release_aborted_request("r")
    pair.settle()
    assert_quiescent(pair.consumer)


def test_consume_without_a_plan_says_to_plan_first() -> None:
    pair = staged_pair()
    before = snapshot(pair.consumer)
    with pytest.raises(LifecycleError, match="call plan_staged_splice"):
        pair.consumer.init_load_back("r", EMPTY)
    assert snapshot(pair.consumer) == before
    with pytest.raises(TypeError, match="int64 device indices"):
        pair.consumer.init_load_back("r", torch.zeros(0))
    assert snapshot(pair.consumer) == before
    pair.consumer.release_staged_hold("r")
    assert_quiescent(pair.consumer)


def test_double_ack_is_dropped_as_stale() -> None:
    pair = staged_pair()
    consumer = pair.consumer
    consumer.plan_staged_splice("r", 0)
    consumer.init_load_back("r", EMPTY)
    load_op = consumer.live_records["r"].op_id
    assert load_op is not None
    pair.settle()
    assert consumer.state("r") is None
    from stagefate.runtime.io import Completion

    consumer._on_completion(Completion(load_op, "load"))  # the same ack delivered again
    assert consumer.stats.stale_completions == 1 and consumer.stats.filled == 1
    assert_quiescent(consumer)


def test_a_reused_request_id_ignores_the_old_operation() -> None:
    pair = make_pair(config())
    consumer = pair.consumer
    seq = seq_of(5, 1)
    pair.publish(seq, mark=9)
    consumer.prefetch_from_storage("r", seq, 0)
    old_exists = consumer.live_records["r"].op_id
    consumer.release_aborted_request("r")
    consumer.prefetch_from_storage("r", seq, 0)
    assert consumer.live_records["r"].op_id != old_exists
    consumer.io.complete(old_exists)  # type: ignore[attr-defined]
    consumer.poll()
    assert consumer.stats.stale_completions == 1 and consumer.state("r") == "no_anchor"
    pair.settle()
    assert consumer.state("r") == "staged"
    consumer.release_staged_hold("r")
    assert_quiescent(consumer)


def test_duplicate_request_id_returns_the_live_state_without_leaking() -> None:
    pair = staged_pair()
    before_host = pair.consumer.host_pool.available()
    assert pair.consumer.prefetch_from_storage("r", seq_of(5, 1), 0) == "staged"
    assert pair.consumer.host_pool.available() == before_host
    assert pair.consumer.stats.attempts == 2 and pair.consumer.stats.issued == 1
    pair.consumer.release_staged_hold("r")
    assert_quiescent(pair.consumer)


def test_queries_are_tolerant() -> None:
    pipe = BufferPipeline(config())
    assert pipe.plan_staged_splice("ghost", 0) == (0, 0)
    assert pipe.staged_splice_tokens("ghost", 0) == 0
    assert pipe.release_staged_hold("ghost") is False
    pipe.release_aborted_request("ghost")
    assert pipe.state("ghost") is None
    with pytest.raises(ValueError, match="multiple of page_size"):
        BufferPipeline(config(page_size=4)).plan_staged_splice("ghost", 3)
    assert_quiescent(pipe)


def test_staged_splice_tokens_is_a_pure_query() -> None:
    pair = staged_pair()
    consumer = pair.consumer
    assert consumer.staged_splice_tokens("r", 0) == 5
    assert consumer.staged_splice_tokens("r", 5) == 0  # would be device_covered …
    assert consumer.state("r") == "staged"  # … but the query releases nothing
    consumer.release_staged_hold("r")
    assert_quiescent(consumer)


def test_below_threshold_is_declined_at_issue() -> None:
    pipe = BufferPipeline(config(prefetch_threshold=4))
    assert pipe.prefetch_from_storage("r", [1, 2, 3], 0) == "released"
    assert pipe.stats.declined_too_short == 1 and pipe.io.pending() == 0
    assert_quiescent(pipe)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("page_size", 0, "page_size"),
        ("device_tokens", 10, "device_tokens=10 is not a multiple of page_size=4"),
        ("anchor_lock_cap_fraction", 1.5, r"must lie in \[0, 1\]"),
        ("sliding_window", 6, "sliding_window=6 must be a positive multiple of page_size=4"),
        ("dtype", "float8", "dtype 'float8' is not supported"),
        ("device", "tpu", "device must be 'auto', 'cpu' or 'cuda"),
        ("io", "async", "manual"),
        # issue 54's probe: absurd values the API once accepted
        ("page_size", True, "valid integer"),
        ("host_tokens", 0, "host_tokens=0 is smaller than one page"),
        ("host_tokens", 2, "smaller than one page .page_size=4.: the pool could hold nothing"),
        ("device_tokens", 64.0, "valid integer"),
        ("dtype", torch.float8_e4m3fn, "is not one that stagefate's pools and every L3"),
    ],
)
def test_invalid_config_names_the_field_and_the_fix(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        PipelineConfig(**{"page_size": 4, field: value})  # type: ignore[arg-type]


def test_a_call_after_the_io_was_closed_is_refused_changing_nothing() -> None:
    pair = staged_pair()
    consumer = pair.consumer
    before = snapshot(consumer)
    consumer.io.close()
    for call in (
        consumer.poll,
        lambda: consumer.prefetch_from_storage("new", seq_of(5, 1, start=50), 0),
        lambda: consumer.init_load_back("r", EMPTY),
    ):
        with pytest.raises(RuntimeError, match=r"IO executor was closed \(io.close\(\)\)"):
            call()
    assert snapshot(consumer) == before
