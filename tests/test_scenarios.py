"""docs/design.md §3 scenarios end to end, asserting the whole relevant state after each step.

Run over page_size ∈ {1, 4, 16} × sliding_window ∈ {None, 4 pages}; sequences are counted in
pages, so ``seq`` is five pages and "one token" of the seed's tests is one page here.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from stagefate import PipelineConfig, TokenKey
from stagefate.runtime.hashing import ROOT_NAMESPACE, page_hashes, storage_key
from stagefate.testing import Pair

from .harness import assert_quiescent, config, kv_marks, make_pair, seq_of, staged_with_threaded_io

pytestmark = pytest.mark.usefixtures("on_each_device")  # cpu, and cuda with a GPU

MATRIX = [
    pytest.param(page, window, id=f"page{page}-swa{window or 0}")
    for page, window in itertools.product((1, 4, 16), (None, 4))
]


def _window(page: int, window_pages: int | None) -> int | None:
    return None if window_pages is None else window_pages * page


def _stage(pair, seq, req="r", matched_len=0):  # type: ignore[no-untyped-def]
    state = pair.consumer.prefetch_from_storage(req, seq, matched_len)
    pair.settle()
    return state


@pytest.mark.parametrize(("page", "window_pages"), MATRIX)
@pytest.mark.invariant("splice_correctness")
def test_trim_head_published_by_sibling(page: int, window_pages: int | None) -> None:
    pair = make_pair(config(page, _window(page, window_pages)))
    seq = seq_of(5, page)
    pair.publish(seq, mark=9)
    consumer = pair.consumer
    assert _stage(pair, seq) == "no_anchor"
    assert consumer.state("r") == "staged"
    assert consumer.host_pool.available() == consumer.host_pool.capacity - 5 * page
    head = pair.sibling_insert(seq[:page], mark=3)
    kv, swa = consumer.plan_staged_splice("r", page)
    assert (kv, swa) == (4 * page, 0 if window_pages is None else 4 * page)
    assert consumer.state("r") == "trimmed"
    prefix = consumer.tree.match_prefix(seq).device_indices
    tail = consumer.init_load_back("r", prefix)
    assert tail.numel() == 4 * page and consumer.state("r") == "consumed"
    assert consumer.tree.match_prefix(seq).length == 5 * page  # inserted at consume
    assert consumer.tree.protected_size > 0  # the spliced node is pinned until the ack
    pair.settle()
    assert consumer.state("r") is None
    assert pair.outcomes[-1] == ("r", "consumed", "released", "filled")
    match = consumer.tree.match_prefix(seq)
    assert torch.equal(match.device_indices[:page], head)
    assert kv_marks(consumer, match.device_indices) == [3.0] * page + [9.0] * (4 * page)
    if window_pages is not None:
        node = match.last_node
        assert node.aux_value is not None and consumer.aux_pool is not None
        assert float(consumer.aux_pool.kv[0, 0, node.aux_value, 0, 0].min()) == 9.5
    assert consumer.stats.trimmed_tokens == page and consumer.stats.spliced_tokens == 4 * page
    assert consumer.wasted_by_reason() == {"trimmed": (0, page)}  # read, not spliced, no read lost
    assert_quiescent(consumer)


@pytest.mark.parametrize(("page", "window_pages"), MATRIX)
@pytest.mark.invariant("hold_release")
def test_plan_frees_covered_hold(page: int, window_pages: int | None) -> None:
    pair = make_pair(config(page, _window(page, window_pages)))
    seq = seq_of(5, page)
    pair.publish(seq, mark=9)
    _stage(pair, seq)
    pair.sibling_insert(seq, mark=3)
    assert pair.consumer.plan_staged_splice("r", 5 * page) == (0, 0)
    assert pair.outcomes[-1] == ("r", "staged", "released", "device_covered")
    assert pair.consumer.plan_staged_splice("r", 5 * page) == (0, 0)  # idempotent
    assert pair.consumer.stats.released_unusable == 1
    assert_quiescent(pair.consumer)


@pytest.mark.parametrize(("page", "window_pages"), MATRIX)
def test_commit_cancels_device_covered_fetch(page: int, window_pages: int | None) -> None:
    pair = make_pair(config(page, _window(page, window_pages)))
    seq = seq_of(5, page)
    pair.publish(seq, mark=9)
    pair.consumer.prefetch_from_storage("r", seq, 0)
    pair.sibling_insert(seq, mark=3)
    pair.settle()
    stats = pair.consumer.stats
    assert stats.declined_device_covered == 1 and stats.l3_reads == 0
    assert not pair.consumer.retry_pending("r")
    assert_quiescent(pair.consumer)


@pytest.mark.parametrize("page", [1, 16])
def test_span_keys_are_the_same_from_a_cold_or_a_remembered_anchor(page: int) -> None:
    """Page keys are hashed once per request: from the anchor's remembered key when the tree
    has one, else from the start (the prefix's keys are then offered to the tree)."""
    pair = make_pair(config(page))
    seq = seq_of(5, page)
    pair.publish(seq, mark=9)
    consumer, prefix = pair.consumer, 2 * page
    pair.sibling_insert(seq[:prefix], mark=3)  # no write-through here: the anchor is cold
    anchor = consumer.tree.match_prefix(seq[:prefix]).last_node
    assert consumer.tree.cached_page_key(anchor) is None
    chain = page_hashes(seq, page, ROOT_NAMESPACE)
    for request in ("cold", "remembered"):
        assert _stage(pair, seq, request, matched_len=prefix) == "locked"
        assert consumer.state(request) == "staged"
        assert consumer.live_records[request].span_keys == [storage_key(d) for d in chain[2:]]
        assert consumer.tree.cached_page_key(anchor) == chain[1]
        assert consumer.release_staged_hold(request)
    assert consumer.stats.l3_reads == 2
    assert_quiescent(consumer)


@pytest.mark.invariant("pin_balance")
def test_anchor_outcomes() -> None:
    pair = make_pair(config())
    consumer = pair.consumer
    seq = seq_of(5, 1)
    pair.publish(seq, mark=9)
    pair.sibling_insert(seq[:2], mark=3)
    # intact prefix: locked, and the pin survives evicting everything
    assert consumer.prefetch_from_storage("a", seq, 2) == "locked"
    assert consumer.pinned_tokens == 2 and consumer.tree.protected_size == 2
    consumer.tree.evict(1000)
    assert consumer.tree.match_prefix(seq[:2]).length == 2
    # a second lock is idempotent: no double pin
    assert consumer.try_lock_anchor("a") == "locked"
    assert consumer.pinned_tokens == 2 and consumer.live_records["a"].pinned_node is not None
    assert consumer.live_records["a"].pinned_node.lock_ref == 1
    # root: no anchor
    assert consumer.prefetch_from_storage("root", seq, 0) == "no_anchor"
    for request in ("a", "root"):
        consumer.release_aborted_request(request)
    pair.settle()
    assert_quiescent(consumer)


@pytest.mark.invariant("pin_balance", "retry_discipline")
def test_cap_zero_skips_the_pin_and_evicted_anchor_declines_with_retry() -> None:
    pair = make_pair(config(max_context_len=64))  # cap = min(32, 64 - 64) = 0
    consumer = pair.consumer
    seq = seq_of(5, 1)
    pair.publish(seq, mark=9)
    pair.sibling_insert(seq[:2], mark=3)
    assert consumer.prefetch_from_storage("r", seq, 2) == "cap_skip"
    assert consumer.tree.protected_size == 0
    consumer.tree.evict(1000)  # nothing pins the anchor: it goes
    pair.settle()
    assert pair.outcomes[-1] == ("r", "cap_skip", "released", "declined_anchor_lost")
    assert consumer.retry_pending("r") and consumer.stats.l3_reads == 0
    # the live match is short at issue now: anchor_lost, then declined again at commit
    assert consumer.prefetch_from_storage("r", seq, 2) == "anchor_lost"
    pair.settle()
    assert consumer.stats.declined_anchor_lost == 2
    assert_quiescent(consumer)


@pytest.mark.parametrize(("page", "window_pages"), MATRIX)
@pytest.mark.invariant("plan_equals_consume")
def test_stale_prefix_after_sibling_published_the_span_drops_cleanly(
    page: int, window_pages: int | None
) -> None:
    pair = make_pair(config(page, _window(page, window_pages)))
    consumer = pair.consumer
    seq = seq_of(5, page)
    pair.publish(seq, mark=9)
    _stage(pair, seq)
    pair.sibling_insert(seq[:page], mark=3)
    assert consumer.plan_staged_splice("r", page)[0] == 4 * page
    planned_prefix = consumer.tree.match_prefix(seq[:page]).device_indices
    pair.sibling_insert(seq[: 3 * page], mark=4)  # the live prefix moved after the plan
    assert consumer.init_load_back("r", planned_prefix).numel() == 0
    assert pair.outcomes[-1] == ("r", "trimmed", "released", "dropped")
    assert_quiescent(consumer)


@pytest.mark.invariant("namespace_isolation")
def test_namespace_isolation_in_tree_and_l3() -> None:
    pair = make_pair(config())
    consumer = pair.consumer
    seq = seq_of(5, 1)
    slots = pair.producer.device_pool.alloc(5)
    assert slots is not None
    pair.producer.device_pool.kv[:, :, slots] = 9
    pair.producer.write_through(seq, slots, cache_salt="tenant-a")
    pair.producer.device_pool.free(slots)
    consumer.prefetch_from_storage("b", seq, 0, cache_salt="tenant-b")
    consumer.prefetch_from_storage("x", seq, 0, extra_key="lora-1", cache_salt="tenant-a")
    pair.settle()
    assert consumer.stats.revoked_full_miss == 2  # other namespaces find nothing in L3
    consumer.prefetch_from_storage("a", seq, 0, cache_salt="tenant-a")
    pair.settle()
    assert consumer.state("a") == "staged"
    pair.sibling_insert(seq, mark=3)  # the default namespace does not cover tenant-a
    assert consumer.plan_staged_splice("a", 0) == (5, 0)
    tail = consumer.init_load_back("a", torch.empty(0, dtype=torch.int64))
    pair.settle()
    assert kv_marks(consumer, tail) == [9.0] * 5
    assert consumer.tree.match_prefix(seq, cache_salt="tenant-a").length == 5
    assert kv_marks(consumer, consumer.tree.match_prefix(seq).device_indices) == [3.0] * 5
    assert_quiescent(consumer)


@pytest.mark.invariant("retry_discipline")
def test_full_miss_then_paced_retry_stages_once_written() -> None:
    pair = make_pair(config())
    consumer = pair.consumer
    seq = seq_of(5, 1)
    consumer.prefetch_from_storage("r", seq, 0)
    pair.settle(1)
    assert pair.outcomes[-1] == ("r", "no_anchor", "released", "revoked_full_miss")
    assert consumer.retry_pending("r")
    polls_at_arm = consumer.polls
    while consumer.polls - polls_at_arm < 8:
        assert consumer.due_retries(["head", "r"]) == []  # paced: not due yet
        consumer.poll()
    assert consumer.due_retries(["head", "r"]) == ["r"]
    assert consumer.due_retries(["head", "r"]) == []  # at most one pending retry
    pair.publish(seq, mark=9)
    _stage(pair, seq)
    assert consumer.state("r") == "staged"
    consumer.release_staged_hold("r")
    assert_quiescent(consumer)


def _admit_on_an_empty_device(pair: Pair, tokens: list[int], mark: float) -> None:
    """Admit ``r`` with nothing of ``tokens`` on the device: its hold splices all of them, with
    the producer's KV, and the consumer is quiescent after the copies' acks."""
    consumer = pair.consumer
    kv_tokens, _aux = consumer.plan_staged_splice("r", 0)
    assert kv_tokens == len(tokens)
    assert consumer.init_load_back("r", torch.empty(0, dtype=torch.int64)).numel() == len(tokens)
    pair.settle()
    indices = consumer.tree.match_prefix(tokens).device_indices
    assert kv_marks(consumer, indices) == [mark] * len(tokens)
    assert_quiescent(consumer)


@pytest.mark.invariant("retry_discipline")
def test_a_covered_prompt_evicted_while_it_waits_is_fetched_by_its_retry() -> None:
    """A span too short to fetch arms the paced retry: the device prefix that made it short can
    be evicted before the request is admitted, and L3 still has it. SGLang arms it there in
    every release (0.5.19's ``_storage_prefetch_missed_rids``, 0.5.20's ``poll_miss``); live
    did not, and on the embedded slice five requests whose prompts were on the device at
    arrival computed them again where SGLang 0.5.20 re-read them (docs/sglang.md)."""
    pair = make_pair(config(prefetch_threshold=2))
    consumer = pair.consumer
    seq = seq_of(5, 1)
    pair.publish(seq, mark=9)  # in L3
    pair.sibling_insert(seq, mark=9)  # and on the consumer's device
    assert consumer.prefetch_from_storage("r", seq, len(seq)) == "released"
    assert pair.outcomes[-1] == ("r", "issued", "released", "declined_too_short")
    assert consumer.retry_pending("r") and consumer.stats.retries_armed == 1
    assert consumer.tree.evict(len(seq)) == len(seq)  # gone while r waits
    assert consumer.due_retries(["r"]) == ["r"]  # the queue head's retry is due at once
    matched = consumer.tree.match_prefix(seq).length
    assert matched == 0
    assert _stage(pair, seq, matched_len=matched) == "no_anchor"
    assert consumer.state("r") == "staged"
    assert not consumer.retry_pending("r")
    _admit_on_an_empty_device(pair, seq, mark=9)


@pytest.mark.invariant("splice_correctness")
def test_a_hit_the_device_came_to_hold_is_read_and_splices_once_the_device_copy_is_gone() -> None:
    """L3 holds only the head of the span (its last page was never written), and a sibling's
    splice puts that head on the device while the existence query runs. The commit still reads
    it: the commit declines only a span the device holds whole. The device copy is not the
    request's and can be evicted before admission; the bounce copy is. On the embedded slice at
    1.2x declining such reads cost 0.014 of hit rate (r798 computed 190,976 tokens its read
    would have spliced); at 0.15x reading one cost a wasted read (r572, docs/sglang.md)."""
    pair = make_pair(config())
    consumer = pair.consumer
    seq = seq_of(6, 1)
    head = seq[:5]
    pair.publish(head, mark=9)  # the sixth page is not in L3
    assert consumer.prefetch_from_storage("r", seq, 0) == "no_anchor"
    pair.sibling_insert(head, mark=9)  # before the existence query answers
    pair.settle()
    assert consumer.state("r") == "staged"
    assert consumer.tree.evict(len(head)) == len(head)  # the device copy goes while r waits
    _admit_on_an_empty_device(pair, head, mark=9)


def _retry_when_due(pair: Pair, waiting: list[str]) -> list[str]:
    """Poll until a paced retry among ``waiting`` falls due (at most one interval and one)."""
    consumer = pair.consumer
    for _ in range(consumer.config.retry_interval + 1):
        due = consumer.due_retries(waiting)
        if due:
            return due
        pair.settle(1)
    return []


@pytest.mark.parametrize("budget", [8, PipelineConfig().retry_max_attempts])
@pytest.mark.invariant("retry_discipline")
def test_a_prefix_evicted_after_eight_retries_is_fetched_within_the_default_budget(
    budget: int,
) -> None:
    """Under overload a request waits hundreds of passes. Its paced retries of a suffix nobody
    has written spend SGLang's budget (8 attempts, 8 passes apart) deep in the queue; when its
    device prefix is evicted after the eighth, nothing is left and it computes what L3 holds.
    On the embedded slice at 1.2x, 30 requests ended that way where SGLang 0.5.20 (its prefix
    evicted sooner) re-read theirs (docs/sglang.md). The default budget still has retries."""
    pair = make_pair(config(retry_max_attempts=budget))
    consumer = pair.consumer
    seq = seq_of(6, 1)
    shared = seq[:5]
    pair.publish(shared, mark=9)  # L3 holds the shared prefix
    pair.sibling_insert(shared, mark=9)  # so does the device: only r's own last page is new
    waiting = ["head", "r"]  # r is deep in the queue: its retries are paced
    assert _stage(pair, seq, matched_len=len(shared)) == "locked"
    assert pair.outcomes[-1][3] == "revoked_full_miss"
    for _ in range(8):
        assert _retry_when_due(pair, waiting) == ["r"]
        _stage(pair, seq, matched_len=len(shared))
        assert pair.outcomes[-1][3] == "revoked_full_miss"
    assert consumer.tree.evict(len(shared)) == len(shared)  # gone while r still waits
    if budget == 8:
        assert _retry_when_due(pair, waiting) == []
        assert consumer.stats.retries_exhausted == 1
        assert_quiescent(consumer)
        return
    assert _retry_when_due(pair, waiting) == ["r"]
    assert _stage(pair, seq, matched_len=0) == "no_anchor"
    assert consumer.state("r") == "staged"
    assert consumer.stats.retries_exhausted == 0
    _admit_on_an_empty_device(pair, shared, mark=9)


@pytest.mark.invariant("retry_discipline")
def test_queue_head_retry_is_never_delayed_and_attempts_are_bounded() -> None:
    pair = make_pair(config(retry_max_attempts=2))
    consumer = pair.consumer
    seq = seq_of(5, 1)
    for attempt in range(3):
        consumer.prefetch_from_storage("r", seq, 0)
        pair.settle(1)
        due = consumer.due_retries(["r"])
        assert due == (["r"] if attempt < 2 else [])
    assert consumer.stats.retries_exhausted == 1
    assert_quiescent(consumer)


@pytest.mark.parametrize(("page", "window_pages"), MATRIX)
@pytest.mark.invariant("splice_correctness", "aux_and_ownership")
def test_read_round_trip_under_device_pressure(page: int, window_pages: int | None) -> None:
    pair = make_pair(config(page, _window(page, window_pages)))
    consumer = pair.consumer
    seq = seq_of(5, page)
    pair.publish(seq, mark=9)
    _stage(pair, seq)
    filler = 1000
    while consumer.device_pool.available() >= page:  # fill the pool with evictable prefixes
        pair.sibling_insert(seq_of(1, page, start=filler), mark=1)
        filler += page
    if consumer.aux_pool is not None:
        held = consumer.aux_pool.alloc(consumer.aux_pool.available())
        assert held is not None
        consumer.tree.attach_aux(consumer.tree.match_prefix(seq_of(1, page, 1000)).last_node, held)
    assert consumer.plan_staged_splice("r", 0)[0] == 5 * page
    tail = consumer.init_load_back("r", torch.empty(0, dtype=torch.int64))
    assert tail.numel() == 5 * page
    pair.settle()
    assert kv_marks(consumer, consumer.tree.match_prefix(seq).device_indices) == [9.0] * 5 * page
    assert_quiescent(consumer)


def _reach(pair, seq, target):  # type: ignore[no-untyped-def]
    """Drive request "r" to ``target`` and return the consumer."""
    consumer = pair.consumer
    consumer.prefetch_from_storage("r", seq, 2 if target == "locked" else 0)
    if target in ("locked", "no_anchor"):
        return consumer
    consumer.io.complete_all()
    consumer.poll()
    if target == "reading":
        return consumer
    consumer.io.complete_all()
    consumer.poll()
    if target == "trimmed":
        pair.sibling_insert(seq[:1], mark=3)
        consumer.plan_staged_splice("r", 1)
    if target == "consumed":
        consumer.plan_staged_splice("r", 0)
        consumer.init_load_back("r", torch.empty(0, dtype=torch.int64))
    return consumer


@pytest.mark.parametrize(
    ("target", "after_abort"),
    [
        ("locked", None),
        ("no_anchor", None),
        ("reading", "abandoned"),
        ("staged", None),
        ("trimmed", None),
        ("consumed", "consumed"),
    ],
)
@pytest.mark.invariant("exactly_once_end", "hold_release")
def test_abort_in_every_live_state(target: str, after_abort: str | None) -> None:
    pair = make_pair(config())
    seq = seq_of(5, 1)
    pair.publish(seq, mark=9)
    pair.sibling_insert(seq[:2], mark=3) if target == "locked" else None
    consumer = _reach(pair, seq, target)
    assert consumer.state("r") == target
    consumer.release_aborted_request("r")
    assert consumer.state("r") == after_abort
    consumer.release_aborted_request("r")  # idempotent
    pair.settle()
    if target in ("locked", "no_anchor"):
        assert consumer.stats.stale_completions == 1  # the late existence result was dropped
    expected = "filled" if target == "consumed" else "aborted"
    assert pair.outcomes[-1][3] == expected
    assert_quiescent(consumer)


def test_abort_while_parked() -> None:
    pair = make_pair(config(host_tokens=8))
    first, seq = seq_of(4, 1, start=100), seq_of(5, 1)
    for tokens in (first, seq):
        pair.publish(tokens, mark=9)
    pair.consumer.prefetch_from_storage("first", first, 0)  # reads 4 of the 8 bounce slots
    pair.consumer.prefetch_from_storage("r", seq, 0)  # 5 fit the pool, not the 4 left
    pair.settle(1)
    assert pair.consumer.state("r") == "parked" and pair.consumer.stats.parked == 1
    pair.consumer.release_aborted_request("first")
    pair.consumer.release_aborted_request("r")
    assert pair.outcomes[-1] == ("r", "parked", "released", "aborted")
    pair.settle()  # the first read lands and frees its bounce
    assert_quiescent(pair.consumer)


def test_a_hit_larger_than_the_whole_bounce_is_declined_not_parked() -> None:
    pair = make_pair(config(host_tokens=4))
    seq = seq_of(5, 1)
    pair.publish(seq, mark=9)
    pair.consumer.prefetch_from_storage("r", seq, 0)
    pair.settle(1)
    assert pair.outcomes[-1] == ("r", "no_anchor", "released", "declined_host_oversize")
    assert pair.consumer.stats.parked == 0 and not pair.consumer.prefetch_pending("r")
    assert_quiescent(pair.consumer)


def test_fire_completions_answers_queries_and_leaves_the_commits_to_poll() -> None:
    """A scheduler that waits for the query it just issued, mid-pass: a miss ends at once, a
    hit waits (no read starts until the pass's poll), and an abort in between ends it clean."""
    pair = make_pair(config(page_size=4))
    consumer = pair.consumer
    held, missing, aborted = seq_of(3, 4, start=100), seq_of(3, 4, start=200), seq_of(3, 4, 300)
    pair.publish(held, mark=5)
    pair.publish(aborted, mark=6)
    for name, seq in (("held", held), ("missing", missing), ("aborted", aborted)):
        consumer.prefetch_from_storage(name, seq, 0)
        assert consumer.storage_query_pending(name)
    consumer.io.complete_all()  # type: ignore[attr-defined]
    consumer.fire_completions()
    assert ("missing", "no_anchor", "released", "revoked_full_miss") in pair.outcomes
    assert [consumer.state(n) for n in ("held", "missing", "aborted")] == [
        "no_anchor",
        None,
        "no_anchor",
    ]
    assert not any(map(consumer.storage_query_pending, ("held", "missing", "aborted")))
    assert consumer.stats.l3_reads == 0 and consumer.io.pending() == 0  # no commit ran
    consumer.release_aborted_request("aborted")
    consumer.poll()
    assert [consumer.state(n) for n in ("held", "aborted")] == ["reading", None]
    pair.settle()
    assert consumer.state("held") == "staged" and consumer.release_staged_hold("held")
    assert_quiescent(consumer)


def test_parked_hits_commit_first_in_fifo_order() -> None:
    pair = make_pair(config(host_tokens=8))
    consumer = pair.consumer
    seqs = {name: seq_of(5, 1, start=start) for name, start in (("a", 100), ("b", 200), ("c", 300))}
    for name, seq in seqs.items():
        pair.publish(seq, mark=9)
        consumer.prefetch_from_storage(name, seq, 0)
    pair.settle(1)
    assert [consumer.state(n) for n in "abc"] == ["reading", "parked", "parked"]
    pair.settle(1)
    assert [consumer.state(n) for n in "abc"] == ["staged", "parked", "parked"]  # a holds 5 of 8
    assert consumer.release_staged_hold("a")
    consumer.poll()
    assert [consumer.state(n) for n in "bc"] == ["reading", "parked"]  # b first: FIFO
    pair.settle(1)
    assert consumer.release_staged_hold("b")
    consumer.poll()
    assert consumer.state("c") == "reading"
    pair.settle(1)
    assert consumer.release_staged_hold("c") and not consumer.release_staged_hold("c")
    assert_quiescent(consumer)


def test_a_new_hit_that_fits_parks_behind_a_parked_head() -> None:
    """FIFO holds for new hits too: a small hit that would fit the bounce waits behind the
    parked head instead of taking the room it waits for (SGLang 0.5.23: "a newer hit must not
    take the staging ... budget the parked head is waiting for"). Without it, on the full
    synthetic trace at 0.6x, 337 requests' large hits stayed parked until their requests gave
    up waiting (hit rate 0.391, where 0.5.23 reached 0.577 and live now reaches 0.614)."""
    pair = make_pair(config(host_tokens=8))
    consumer = pair.consumer
    big, large, small = seq_of(5, 1, start=100), seq_of(6, 1, start=200), seq_of(2, 1, start=300)
    for seq in (big, large, small):
        pair.publish(seq, mark=9)
    consumer.prefetch_from_storage("a", big, 0)
    consumer.prefetch_from_storage("b", large, 0)
    pair.settle(1)
    assert [consumer.state(n) for n in "ab"] == ["reading", "parked"]  # 5 of 8 taken; 6 wait
    consumer.prefetch_from_storage("c", small, 0)
    pair.settle(1)  # c's 2 tokens would fit the 3 free
    assert [consumer.state(n) for n in "abc"] == ["staged", "parked", "parked"]
    assert consumer.host_pool.available() == 3
    assert consumer.release_staged_hold("a")
    consumer.poll()
    assert [consumer.state(n) for n in "bc"] == ["reading", "reading"]  # b first, then c fits
    pair.settle(1)
    assert consumer.release_staged_hold("b") and consumer.release_staged_hold("c")
    assert_quiescent(consumer)


def test_short_read_stages_the_prefix_and_failed_read_discards() -> None:
    pair = make_pair(config())
    consumer = pair.consumer
    seq = seq_of(5, 1)
    pair.publish(seq, mark=9)
    consumer.prefetch_from_storage("short", seq, 0)
    consumer.prefetch_from_storage("fail", seq_of(5, 1, start=50), 0)
    pair.publish(seq_of(5, 1, start=50), mark=8)
    consumer.io.complete_all()  # type: ignore[attr-defined]
    consumer.poll()
    reads = consumer.io.queued("read")  # type: ignore[attr-defined]
    consumer.io.complete_short(reads[0], 3)  # type: ignore[attr-defined]
    consumer.io.fail(reads[1])  # type: ignore[attr-defined]
    consumer.poll()
    assert consumer.state("short") == "staged" and consumer.live_records["short"].span_end == 3
    assert consumer.host_pool.available() == consumer.host_pool.capacity - 3
    assert pair.outcomes[-1] == ("fail", "reading", "released", "discarded")
    assert consumer.plan_staged_splice("short", 0) == (3, 0)
    consumer.init_load_back("short", torch.empty(0, dtype=torch.int64))
    pair.settle()
    assert consumer.tree.match_prefix(seq).length == 3
    # the failed read is a whole wasted read; the short one wasted its missing tail only
    assert consumer.wasted_by_reason() == {"discarded": (1, 5), "short_read": (0, 2)}
    assert_quiescent(consumer)


def test_threaded_io_round_trip() -> None:
    consumer, _seq = staged_with_threaded_io(5)
    assert consumer.plan_staged_splice("r", 0) == (5, 0)
    tail = consumer.init_load_back("r", torch.empty(0, dtype=torch.int64))
    while consumer.state("r") is not None:
        consumer.poll()
    assert kv_marks(consumer, tail) == [9.0] * 5
    assert_quiescent(consumer)
    consumer.io.close()


@pytest.mark.parametrize("given", ["the tree's own tensor", "an equal copy", "other slots"])
def test_consume_compares_the_prefix_indices_by_content(given: str) -> None:
    pair = make_pair(config())
    consumer = pair.consumer
    seq = seq_of(5, 1)
    pair.publish(seq, mark=9)
    _stage(pair, seq)
    pair.sibling_insert(seq[:1], mark=3)
    assert consumer.plan_staged_splice("r", 1)[0] == 4
    live = consumer.tree.match_prefix(seq).device_indices
    assert live is consumer.tree.match_prefix(seq).device_indices  # one node: its own tensor
    prefix = {"the tree's own tensor": live, "an equal copy": live.clone(), "other slots": live + 1}
    tail = consumer.init_load_back("r", prefix[given])
    if given == "other slots":
        assert tail.numel() == 0
        assert pair.outcomes[-1] == ("r", "trimmed", "released", "dropped")
    else:
        assert tail.numel() == 4 and consumer.state("r") == "consumed"
        pair.settle()
        assert pair.outcomes[-1] == ("r", "consumed", "released", "filled")
    assert_quiescent(consumer)


def test_has_hold_is_true_while_a_staged_span_waits_for_admission() -> None:
    """``has_hold``: the spec's ``hold`` group, what SGLang's scheduler asks as ``has_staged``."""
    pipe, _seq = staged_with_threaded_io(8)
    assert pipe.has_hold("r") and not pipe.prefetch_pending("r")
    assert not pipe.has_hold("nobody")
    assert pipe.release_staged_hold("r")
    assert not pipe.has_hold("r")
    assert_quiescent(pipe)


def test_the_public_face_names_its_version_and_the_io_types() -> None:
    import importlib.metadata

    import stagefate

    assert stagefate.__version__ == importlib.metadata.version("stagefate")
    for name in ("IOExecutor", "IOOp", "Completion", "load_spec", "__version__"):
        assert name in stagefate.__all__ and hasattr(stagefate, name)


def test_a_decision_at_admission_never_reads_an_earlier_firings_lookups() -> None:
    """``staged_splice_tokens`` decides the plan without firing it; like a firing, it starts
    from empty lookups (issue 42: it did not, which no plan guard reads today)."""
    pipe, seq = staged_with_threaded_io(8)
    stale = pipe.tree.match_prefix(TokenKey(seq[:2]))
    pipe._look.span = pipe._look.anchor = stale  # what an earlier firing left, poisoned
    assert pipe.staged_splice_tokens("r", 0) == len(seq)
    assert pipe._look.span is None and pipe._look.anchor is None
    assert pipe.plan_staged_splice("r", 0) == (len(seq), 0)
