"""Helpers for an engine developer's own integration tests, as ``trio.testing`` ships trio's.

Everything here drives stagefate through its public API and a :class:`~stagefate.ManualIO`, so
a test decides exactly when each storage read, existence query and H2D copy completes:

* :func:`manual_io` and :func:`step_io`: the pipeline's ManualIO, and one operation of it
  completed fully, short or failed (then a scheduling pass);
* :func:`settle`: every queued operation completes and the scheduler polls, a few rounds;
* :class:`~stagefate.runtime.ManualClock`: a clock the test moves, to time a ManualIO's reads
  (the speeds the pipeline measures, a read that runs longer than computing would take);
* :class:`Pair` / :func:`make_pair`: a producer and a consumer pipeline over one L3, with KV
  whose every slot carries a mark, so a test reads back which producer's bytes were spliced;
* :func:`assert_quiescent`: nothing live, no pin, no hold, every slot back, the books closed;
* :func:`run_ranks_over_gloo`: a function run as N tensor-parallel ranks, one process each,
  joined by torch.distributed over gloo on 127.0.0.1;
* :func:`tree_snapshot`: a tree's whole shape, slots, locks and LRU order, to compare two runs;
* :class:`LineWorld`: the model checker's abstract world made of real objects, which the tests
  generated from the spec (``stagefate check --emit-tests``, tests/generated/) run on;
* the fuzz world (:data:`SEQUENCES` sharing heads, :data:`NAMESPACES`, :func:`mark` and
  :func:`write_marked` for KV that names its token and namespace) and
  :func:`~stagefate.fuzz.fuzzer.configured`, to run stagefate's stateful fuzzer over your own
  tree or storage.

docs/integration.md has an example test that uses only these and the public API.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from io import StringIO
from typing import Literal

import torch

from .fuzz.fuzzer import PipelineFuzzer, configured
from .fuzz.gloo import run_ranks_over_gloo
from .fuzz.stepping import manual_io
from .fuzz.world import NAMESPACES, SEQUENCES, mark, write_marked
from .runtime import ManualClock, ManualIO, MemoryStorage
from .runtime.prefix_tree import PrefixTree
from .spec.model_world import Bounds
from .spec.schema import LifecycleSpec, transition_text
from .statemachine.config import PipelineConfig
from .statemachine.pipeline import BufferPipeline
from .statemachine.record import TransitionEvent
from .transition_log import TransitionLog

__all__ = [
    "NAMESPACES",
    "SEQUENCES",
    "LineWorld",
    "ManualClock",
    "Pair",
    "PipelineFuzzer",
    "assert_quiescent",
    "configured",
    "kv_marks",
    "make_pair",
    "manual_io",
    "mark",
    "run_ranks_over_gloo",
    "settle",
    "step_io",
    "tree_snapshot",
    "write_marked",
]


def step_io(
    pipe: BufferPipeline,
    kind: Literal["exists", "read", "load"] | None = None,
    mode: Literal["full", "short", "fail"] = "full",
    tokens: int = 0,
    poll: bool = True,
) -> int:
    """Complete the oldest queued operation (of ``kind``, if given): fully, ``short`` with
    ``tokens`` tokens, or ``fail``; then run one scheduling pass unless ``poll`` is False.
    Returns its operation id."""
    io = manual_io(pipe)
    queued = io.queued(kind)
    if not queued:
        raise LookupError(f"no {kind or ''} operation is queued; issue or commit a prefetch first")
    op_id = queued[0]
    if mode == "fail":
        io.fail(op_id)
    elif mode == "short":
        io.complete_short(op_id, tokens)
    else:
        io.complete(op_id)
    if poll:
        pipe.poll()
    return op_id


def settle(pipe: BufferPipeline, rounds: int = 4) -> None:
    """Storage and copies complete, then the scheduler polls, ``rounds`` times."""
    io = manual_io(pipe)
    for _ in range(rounds):
        io.complete_all()
        pipe.poll()


@dataclass
class Pair:
    """A producer and a consumer pipeline over one L3 (:func:`make_pair`)."""

    producer: BufferPipeline
    consumer: BufferPipeline
    storage: MemoryStorage
    outcomes: list[tuple[str, str, str, str | None]] = field(default_factory=list)
    """``(request, source, target, reason)`` of every consumer transition, in order."""

    def publish(self, tokens: Sequence[int], mark: float, aux: bool = True) -> None:
        """The producer computes ``tokens`` with KV marked ``mark`` and writes them through."""
        pipe = self.producer
        slots = pipe.device_pool.alloc(len(tokens))
        assert slots is not None, "the producer's device pool is full"
        pipe.device_pool.kv[:, :, slots] = mark
        present = pipe.tree.insert(tokens, slots)
        pipe.device_pool.free(slots[:present])
        aux_slots = None
        window = pipe.config.sliding_window
        if aux and window is not None and pipe.aux_pool is not None:
            aux_slots = pipe.aux_pool.alloc(min(window, len(tokens)))
            assert aux_slots is not None
            pipe.aux_pool.kv[:, :, aux_slots] = mark + 0.5
        full = pipe.tree.match_prefix(tokens).device_indices
        pipe.write_through(tokens, full, aux_indices=aux_slots)
        if aux_slots is not None and pipe.aux_pool is not None:
            pipe.aux_pool.free(aux_slots)

    def sibling_insert(self, tokens: Sequence[int], mark: float) -> torch.Tensor:
        """Another request on the consumer publishes ``tokens`` into the consumer's tree."""
        pipe = self.consumer
        present = pipe.tree.match_prefix(tokens).length
        slots = pipe.device_pool.alloc(len(tokens) - present)
        assert slots is not None, "the consumer's device pool is full"
        pipe.device_pool.kv[:, :, slots] = mark
        prefix = pipe.tree.match_prefix(tokens).device_indices
        pipe.tree.insert(tokens, torch.cat([prefix, slots]))
        return slots

    def settle(self, rounds: int = 4) -> None:
        """:func:`settle` the consumer: its IO completes, then it polls, ``rounds`` times."""
        settle(self.consumer, rounds)


def make_pair(config: PipelineConfig, clock: ManualClock | None = None) -> Pair:
    """Two pipelines with ``config`` over one :class:`MemoryStorage` (``clock``: the consumer's
    reads are timed by it, on a :class:`~stagefate.runtime.ManualIO`)."""
    storage = MemoryStorage()
    io = None if clock is None else ManualIO(clock)
    pair = Pair(
        BufferPipeline(config, storage=storage),
        BufferPipeline(config, storage=storage, io=io),
        storage,
    )

    def record(event: TransitionEvent) -> None:
        o = event.outcome
        pair.outcomes.append((event.request_id, o.source, o.target, o.reason))

    pair.consumer.instruments.append(record)
    return pair


def kv_marks(pipe: BufferPipeline, slots: torch.Tensor) -> list[float]:
    """The mark of each device slot (the first value of its KV)."""
    return [float(v) for v in pipe.device_pool.kv[0, 0, slots, 0, 0].cpu()]


def assert_quiescent(pipe: BufferPipeline) -> None:
    """Nothing live, nothing pinned, every host slot back, the device pool conserved, every
    read settled, nobody owning or waiting in the dedup book, and the books closed (to the
    token)."""
    assert pipe.is_idle(), f"live records: {list(pipe.live_records)}"
    assert pipe.host_pool.available() == pipe.host_pool.capacity, "a bounce slot was not freed"
    if pipe.host_aux_pool is not None:
        assert pipe.host_aux_pool.available() == pipe.host_aux_pool.capacity
    assert pipe.pinned_tokens == 0 and pipe.tree.protected_size == 0, "a pin outlived its record"
    pipe.tree.sanity_check()
    assert pipe.device_pool.available() + pipe.tree.total_tokens() == pipe.device_pool.capacity
    if pipe.aux_pool is not None:
        assert pipe.aux_pool.available() + pipe.tree.aux_slots().numel() == pipe.aux_pool.capacity
    stats = pipe.stats
    ended = sum(getattr(stats, reason) for reason in pipe.spec.reasons)
    assert stats.issued + stats.declined_too_short == ended, "a record did not end exactly once"
    assert pipe.reads_in_flight() == (0, 0)
    assert pipe.owns_no_page_keys(), "in-flight dedup still lists an owner or a waiter"
    assert stats.l3_reads == pipe.spliced_from_reads() + stats.l3_reads_wasted
    assert stats.l3_read_tokens == stats.spliced_tokens + stats.l3_read_tokens_wasted
    wasted = pipe.wasted_by_reason().values()
    assert sum(reads for reads, _ in wasted) == stats.l3_reads_wasted
    assert sum(tokens for _, tokens in wasted) == stats.l3_read_tokens_wasted


NodeSnapshot = tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...], int, int]
"""``(tokens, namespace (None as ""), device slots, lock_ref, last access)`` of one node."""


def tree_snapshot(tree: PrefixTree) -> list[NodeSnapshot]:
    """Every node's tokens, namespace, slots, lock count and LRU stamp (0 for a tree that keeps
    none), sorted: two runs that leave equal snapshots leave trees that match, lock and evict
    alike."""
    return sorted(
        (
            tuple(node.tokens()),
            tuple("" if part is None else str(part) for part in node.namespace),
            tuple(node.value.tolist()),
            int(node.lock_ref),
            int(getattr(node, "last_access", 0)),
        )
        for node in tree.nodes()
    )


Expected = str | None
"""A request's predicted state: its record's state, or None (no live record)."""


class LineWorld:
    """The model checker's abstract world (``spec/model_world.py``) made of real objects.

    One token line of ``bounds.pages`` pages of :attr:`PAGE` tokens in one namespace; request
    ``i`` (``"r{i}"``) wants its first ``pages - i`` pages; L3 holds the whole line from the
    start (a producer wrote it through), so an existence query or a read finds less only when
    the test says so; the consumer's pools and anchor-pin cap are the bounds' (in pages); IO
    runs on a :class:`ManualIO`. Each method is one step of a generated program: the
    scheduler's calls as a scheduler makes them (the live match, the live prefix) and the
    world's moves (complete an operation then poll, evict the line's last page, a sibling
    publishes the next one). :meth:`expect` compares the whole state with the model's, and
    :meth:`fired` the transitions since the last step with the model's (read from a
    :class:`~stagefate.transition_log.TransitionLog` on the pipeline). ``spec``: the lifecycle
    the pipeline runs (the packaged one by default; the mutation test passes its mutants).
    """

    PAGE = 2

    def __init__(self, bounds: Bounds | None = None, spec: LifecycleSpec | None = None) -> None:
        b = self.bounds = bounds or Bounds()
        page = self.PAGE
        device, cap = b.device_pages * page, b.cap_pages * page
        self.config = PipelineConfig(
            page_size=page,
            layers=1,
            kv_heads=1,
            head_dim=1,
            device_tokens=device,
            host_tokens=b.host_pages * page,
            prefetch_threshold=b.threshold_pages * page,
            anchor_lock_cap_fraction=1.0,
            max_context_len=device - cap,  # the cap is min(device, device - max_context_len)
            device="cpu",
            io="manual",
        )
        self.line = list(range(1, b.pages * page + 1))
        self.storage = MemoryStorage()
        producer = BufferPipeline(
            self.config.model_copy(update={"device_tokens": len(self.line)}), storage=self.storage
        )
        slots = producer.device_pool.alloc(len(self.line))
        assert slots is not None
        producer.tree.insert(self.line, slots)
        producer.write_through(self.line, slots)
        self.clock = ManualClock()
        """Times the reads (moved by :meth:`give_up` only)."""
        self.pipe = BufferPipeline(
            self.config, storage=self.storage, io=ManualIO(self.clock), spec=spec
        )
        self.io = manual_io(self.pipe)
        self._log = StringIO()
        self._logged = 0
        """How much of the log :meth:`fired` has read."""
        self.pipe.instruments.append(TransitionLog(self._log))

    def key(self, request: int) -> list[int]:
        """Request ``request``'s prompt: the line less one page per request index."""
        return self.line[: (self.bounds.pages - request) * self.PAGE]

    @property
    def device(self) -> int:
        """Pages of the line on the device."""
        return self.pipe.tree.match_prefix(self.line).length // self.PAGE

    def _live_match(self, request: int) -> int:
        return min(self.device, self.bounds.pages - request) * self.PAGE

    # ------------------------------------------------------------------ the scheduler's calls

    def issue(self, request: int, stale: bool = False, loads_slower: bool = False) -> str:
        """``prefetch_from_storage`` with the live match (``stale``: one page past it;
        ``loads_slower``: with speeds measured that make even the whole span load too slowly)."""
        matched = min(self._live_match(request) + stale * self.PAGE, len(self.key(request)))
        with self._speeds(loads_slower):
            return self.pipe.prefetch_from_storage(f"r{request}", self.key(request), matched)

    def lock(self, request: int) -> str:
        """``try_lock_anchor`` for request ``request``."""
        return self.pipe.try_lock_anchor(f"r{request}")

    def plan(self, request: int) -> tuple[int, int]:
        """``plan_staged_splice`` at the live device match."""
        return self.pipe.plan_staged_splice(f"r{request}", self._live_match(request))

    def consume(self, request: int) -> torch.Tensor:
        """``init_load_back`` onto the live device prefix."""
        prefix = self.pipe.tree.match_prefix(self.key(request)).device_indices
        return self.pipe.init_load_back(f"r{request}", prefix)

    def release_hold(self, request: int) -> bool:
        """``release_staged_hold`` (the scheduler dropped the hold)."""
        return self.pipe.release_staged_hold(f"r{request}")

    def abort(self, request: int) -> None:
        """``release_aborted_request`` (the request was aborted)."""
        self.pipe.release_aborted_request(f"r{request}")

    def give_up(self, request: int, loads_slower: bool = False) -> bool:
        """``give_up_slow_read`` before keeping the request waiting (``loads_slower``: its read
        has run a second, against forwards measured at a microsecond a token)."""
        if loads_slower:
            self.clock.advance(1.0)
        with self._speeds(loads_slower):
            return self.pipe.give_up_slow_read(f"r{request}")

    def poll(self, loads_slower: bool = False) -> None:
        """One scheduling pass's ``poll`` (``loads_slower``: in a pass whose measured speeds
        say a load takes longer than computing its tokens)."""
        with self._speeds(loads_slower):
            self.pipe.poll()

    @contextmanager
    def _speeds(self, loads_slower: bool) -> Iterator[None]:
        """With ``loads_slower``: loads of a second and forwards of a microsecond a token have
        been measured, and are forgotten afterwards (the model draws the speeds afresh at every
        step)."""
        speeds = self.pipe.speeds
        if loads_slower:
            speeds.observe_load(self.PAGE, 1.0)
            speeds.observe_forward(self.PAGE, 1e-6 * self.PAGE)
        try:
            yield
        finally:
            speeds.forget()

    # ------------------------------------------------------------------ the world's moves

    def complete(
        self, request: int, mode: str = "full", pages: int = 0, loads_slower: bool = False
    ) -> None:
        """The request's operation in flight completes (``full``, ``short`` finding ``pages``
        pages, or ``error``), then one scheduling pass (``loads_slower``: as :meth:`poll`)."""
        record = self.pipe.live_records[f"r{request}"]
        op_id = record.op_id
        assert op_id is not None, f"r{request} has no operation in flight"
        if mode == "short" and op_id in self.io.queued("exists"):
            # L3 drops the span's pages past the first ``pages`` while the query runs
            dropped = list(record.span_keys[pages:])
            kept = self.storage.batch_get(dropped)
            self.storage.delete(dropped)
            self.io.complete(op_id)
            self.storage.batch_set(dropped, [page for page in kept if page is not None])
        elif mode == "short":
            self.io.complete_short(op_id, pages * self.PAGE)
        elif mode == "error":
            self.io.fail(op_id)
        else:
            self.io.complete(op_id)
        self.poll(loads_slower)

    def evict(self) -> None:
        """The line's last page leaves the device (the node is split there first)."""
        tree, page = self.pipe.tree, self.PAGE
        tree.match_prefix(self.line[: (self.device - 1) * page])
        assert tree.evict(page) == page, "the line's last page is pinned or was not a leaf"

    def publish(self) -> None:
        """A sibling computes the line's next page and inserts it."""
        pipe, page, device = self.pipe, self.PAGE, self.device
        slots = pipe.device_pool.alloc(page)
        assert slots is not None, "the device pool is full"
        prefix = pipe.tree.match_prefix(self.line[: device * page]).device_indices
        pipe.tree.insert(self.line[: (device + 1) * page], torch.cat([prefix, slots]))

    # ------------------------------------------------------------------ checks

    def expect(self, device: int, host_free: int, pinned: int, **states: Expected) -> None:
        """The whole state is the model's: the device prefix, free bounce and pinned pages, and
        every request's state."""
        pipe, page = self.pipe, self.PAGE
        actual = {
            "device": self.device,
            "host_free": pipe.host_pool.available() // page,
            "pinned": pipe.pinned_tokens // page,
            **{f"r{i}": pipe.state(f"r{i}") for i in range(self.bounds.requests)},
        }
        expected = {"device": device, "host_free": host_free, "pinned": pinned, **states}
        assert actual == expected, f"the model predicts {expected}, the pipeline is at {actual}"

    def fired(self, *transitions: str) -> None:
        """The transitions since the last step are exactly ``transitions``, in order (as
        :func:`~stagefate.spec.schema.transition_text` writes them); the next call starts
        after them."""
        text = self._log.getvalue()
        new, self._logged = text[self._logged :], len(text)
        actual = [
            transition_text(
                line["request"],
                line["source"],
                line["event"],
                line["guard"],
                line["target"],
                line["reason"],
            )
            for line in map(json.loads, new.splitlines())
        ]
        assert actual == list(transitions), (
            f"the model predicts the step fired {list(transitions)}, the pipeline fired {actual}"
        )

    def finish(self) -> None:
        """Every request is let go and every operation completes: the pipeline is quiescent
        (pins balanced, each bounce slot freed once, each record ended once, books closed)."""
        for request in range(self.bounds.requests):
            self.abort(request)
        for _ in range(4):  # a read lands, its hold is aborted, a copy lands: a few passes
            self.io.complete_all()
            self.pipe.poll()
        assert_quiescent(self.pipe)
