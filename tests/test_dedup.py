"""In-flight dedup: a request whose span's head a live sibling is fetching waits for it, then
reads only the rest."""

from __future__ import annotations

import pytest
import torch

from stagefate import BufferPipeline

from .harness import Pair, assert_quiescent, config, make_pair, seq_of

pytestmark = pytest.mark.usefixtures("on_each_device")  # cpu, and cuda with a GPU

PAGE = 4
NOT_HEAD = "someone-ahead"  # keeps the waiter off the queue head, which is always due at once


def _admit(pipe: BufferPipeline, request_id: str, tokens: list[int]) -> torch.Tensor:
    """Admission as a scheduler does it: plan against the live prefix, splice, return the tail."""
    prefix = pipe.tree.match_prefix(tokens)
    kv_tokens, _ = pipe.plan_staged_splice(request_id, prefix.length)
    assert kv_tokens
    return pipe.init_load_back(request_id, prefix.device_indices)


def _two_readers(pair: Pair, seq: list[int], **namespace: str) -> None:
    consumer = pair.consumer
    consumer.prefetch_from_storage("a", seq, 0)
    consumer.prefetch_from_storage("b", seq, 0, **namespace)
    consumer.io.complete(consumer.io.queued("exists")[0])  # type: ignore[attr-defined]
    consumer.poll()  # a commits: its read is in flight
    consumer.io.complete(consumer.io.queued("exists")[0])  # type: ignore[attr-defined]
    consumer.poll()  # b commits


@pytest.mark.invariant("dedup_waiters")
def test_same_span_is_read_once_and_the_waiter_gets_a_device_hit() -> None:
    pair = make_pair(config(PAGE))
    consumer, seq = pair.consumer, seq_of(5, PAGE)
    pair.publish(seq, mark=9)
    _two_readers(pair, seq)
    assert consumer.state("a") == "reading" and consumer.state("b") is None
    assert ("b", "no_anchor", "released", "declined_inflight") in pair.outcomes
    assert consumer.stats.l3_reads == 1 and consumer.stats.declined_inflight == 1
    assert consumer.due_retries([NOT_HEAD, "b"]) == []  # waits for the sibling, not the clock
    assert consumer.prefetch_pending("b")  # a scheduler keeps it waiting: a is reading for it
    pair.settle()
    tail = _admit(consumer, "a", seq)
    assert tail.numel() == 5 * PAGE
    assert consumer.due_retries([NOT_HEAD, "b"]) == []  # a is consumed, still owning the span
    assert consumer.prefetch_pending("b") and not consumer.prefetch_pending("a")
    pair.settle()  # the H2D ack: a is filled
    assert not consumer.prefetch_pending("b")  # its retry is due now: a device hit waits
    assert consumer.due_retries([NOT_HEAD, "b"]) == ["b"]
    assert consumer.prefetch_from_storage("b", seq, consumer.tree.match_prefix(seq).length) == (
        "released"
    )
    assert pair.outcomes[-1] == ("b", "issued", "released", "declined_too_short")
    assert consumer.stats.l3_reads == 1 and pair.storage.reads == 5
    assert_quiescent(consumer)


@pytest.mark.invariant("dedup_waiters")
def test_sibling_aborted_mid_read_sends_the_waiter_to_read_it_itself() -> None:
    pair = make_pair(config(PAGE))
    consumer, seq = pair.consumer, seq_of(5, PAGE)
    pair.publish(seq, mark=9)
    _two_readers(pair, seq)
    consumer.release_aborted_request("a")
    assert consumer.state("a") == "abandoned"
    assert consumer.due_retries([NOT_HEAD, "b"]) == ["b"]  # a no longer owns the span
    consumer.prefetch_from_storage("b", seq, 0)
    pair.settle()
    assert consumer.state("b") == "staged" and consumer.stats.l3_reads == 2
    assert _admit(consumer, "b", seq).numel() == 5 * PAGE
    pair.settle()
    assert consumer.stats.filled == 1 and consumer.stats.aborted == 1
    assert_quiescent(consumer)


def test_equal_tokens_in_another_namespace_are_not_deduplicated() -> None:
    pair = make_pair(config(PAGE))
    consumer, seq = pair.consumer, seq_of(5, PAGE)
    pair.publish(seq, mark=9)
    slots = pair.producer.tree.match_prefix(seq).device_indices
    pair.producer.write_through(seq, slots, cache_salt="tenant-b")
    _two_readers(pair, seq, cache_salt="tenant-b")
    assert consumer.state("a") == "reading" and consumer.state("b") == "reading"
    assert consumer.stats.declined_inflight == 0 and consumer.stats.l3_reads == 2
    for request_id in ("a", "b"):
        consumer.release_aborted_request(request_id)
    pair.settle()
    assert_quiescent(consumer)


@pytest.mark.invariant("dedup_waiters")
def test_a_shared_head_is_read_once_and_the_waiter_reads_only_the_rest() -> None:
    pair = make_pair(config(PAGE))
    consumer, seq = pair.consumer, seq_of(5, PAGE)
    pair.publish(seq, mark=9)
    head = seq[: 3 * PAGE]
    consumer.prefetch_from_storage("a", head, 0)
    consumer.prefetch_from_storage("b", seq, 0)
    consumer.io.complete(consumer.io.queued("exists")[0])  # type: ignore[attr-defined]
    consumer.poll()  # a commits: its read of the head is in flight
    consumer.io.complete(consumer.io.queued("exists")[0])  # type: ignore[attr-defined]
    consumer.poll()  # b's span starts with what a reads: b waits for a
    assert consumer.state("a") == "reading" and consumer.state("b") is None
    assert ("b", "no_anchor", "released", "declined_inflight") in pair.outcomes
    assert consumer.due_retries(["b"]) == []  # even at the queue head: a still owns the head
    pair.settle()
    _admit(consumer, "a", head)
    pair.settle()  # a is filled: the head is on the device
    assert consumer.due_retries(["b"]) == ["b"]
    consumer.prefetch_from_storage("b", seq, consumer.tree.match_prefix(seq).length)
    pair.settle()
    assert _admit(consumer, "b", seq).numel() == 2 * PAGE  # only what a did not bring
    pair.settle()
    stats = consumer.stats
    assert stats.l3_reads == 2 and stats.l3_read_tokens == 5 * PAGE and stats.filled == 2
    assert stats.l3_read_tokens_wasted == 0 and stats.trimmed_tokens == 0
    assert_quiescent(consumer)


def test_a_short_read_wakes_its_waiters_and_one_whose_head_it_still_owns_waits_again() -> None:
    pair = make_pair(config(PAGE))
    consumer, seq = pair.consumer, seq_of(5, PAGE)
    pair.publish(seq, mark=9)
    _two_readers(pair, seq)
    consumer.io.complete_short(consumer.io.queued("read")[0], 2 * PAGE)  # type: ignore[attr-defined]
    consumer.poll()
    assert consumer.state("a") == "staged"
    assert consumer.due_retries([NOT_HEAD, "b"]) == ["b"]  # a's ownership shrank: b decides again
    consumer.prefetch_from_storage("b", seq, 0)
    pair.settle()
    assert consumer.stats.l3_reads == 1 and consumer.stats.declined_inflight == 2  # a owns b's head
    _admit(consumer, "a", seq)
    pair.settle()  # a is filled with the two pages it brought
    assert consumer.due_retries([NOT_HEAD, "b"]) == ["b"]
    consumer.prefetch_from_storage("b", seq, consumer.tree.match_prefix(seq).length)
    pair.settle()
    assert _admit(consumer, "b", seq).numel() == 3 * PAGE  # the rest, read by b itself
    pair.settle()
    stats = consumer.stats
    assert stats.l3_reads == 2 and stats.l3_read_tokens == 5 * PAGE + 3 * PAGE
    assert stats.l3_read_tokens_wasted == 3 * PAGE  # asked of a's read, never brought
    assert_quiescent(consumer)


def test_dedup_can_be_switched_off() -> None:
    pair = make_pair(config(PAGE, dedup_inflight=False))
    pair.publish(seq_of(5, PAGE), mark=9)
    _two_readers(pair, seq_of(5, PAGE))
    assert pair.consumer.stats.l3_reads == 2 and pair.consumer.stats.declined_inflight == 0
