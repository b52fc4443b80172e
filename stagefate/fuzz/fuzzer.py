"""A Hypothesis ``RuleBasedStateMachine`` over the real pipeline, tree, pools and storage.

Theory of operation
-------------------
Programs run in the world of :mod:`.world`: three sequences sharing heads in two namespaces,
all of them written through to L3 first with page-marked KV, so every device slot the tree maps
can be checked against the tokens it claims to hold.

Rules play both the scheduler (issue, poll, plan with the live or a stale prefix, consume,
abort, release, retries) and the world (IO completing in any order, short or failing reads,
sibling publishes that split nodes, eviction, pages dropped from L3). The ``transitions`` oracle
runs in lockstep (``check_oracle``); every spec invariant the stateful fuzzer is listed for is an
``@invariant`` of the same name (:func:`~.invariants.spec_invariant`). Every fired transition is
counted in :data:`~.tally.TALLY` so a campaign can report which spec edges it reached.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
)

from ..runtime import ManualClock, ManualIO, MemoryStorage, RadixTree, Storage, page_hashes
from ..runtime.hashing import namespace_of, storage_key
from ..runtime.prefix_tree import Node, TreeFactory, alloc_evicting
from ..spec import load_spec
from ..statemachine.config import PipelineConfig
from ..statemachine.errors import LifecycleError
from ..statemachine.pipeline import BufferPipeline
from ..transition_log import TransitionLog
from .invariants import (
    assert_books_close,
    assert_pins_counted,
    bounce_owned,
    copies_in_flight,
    holds_problems,
    spec_invariant,
)
from .tally import TALLY, record_edge
from .world import (
    KNOB_CHOICES,
    MARK_STRIDE,
    NAMESPACES,
    PAGE,
    SEQUENCES,
    expected_mark,
    fuzz_config,
    l3_contents,
    mark,
    measure,
)

REQUEST_IDS = tuple(f"r{i}" for i in range(5))
WINDOWS: tuple[int | None, ...] = (None, 2 * PAGE)
"""Sliding windows a program may run with (a tree without aux support takes ``(None,)``)."""
KNOBS = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {name: st.sampled_from(choices) for name, choices in KNOB_CHOICES.items()}
    ),
)
"""A program's deployment: the defaults (``{}``), or one choice per field of
:data:`~.world.KNOB_CHOICES`. The defaults are drawn about half the time: a campaign keeps
reaching the rare edges of the default world (the trimmed span's) while it explores the
others."""
REQUEST = st.sampled_from(REQUEST_IDS)
"""A rule's request: it acts on it, or on the next request id in the state the rule needs
(:meth:`PipelineFuzzer._pick`), so the minimal failing program prints as plain calls."""
SPEC = load_spec()
_HOLDS = tuple(sorted(SPEC.group("hold")))
_LOCKABLE = tuple(sorted(SPEC.group("lockable")))
_PENDING = tuple(sorted(SPEC.group("pending")))
_NO_CONSUME = tuple(sorted(SPEC.group("pending")))
"""States in which ``init_load_back`` must be refused: the prefetch has staged nothing yet."""
_LIVE = tuple(sorted(name for name, state in SPEC.states.items() if not state.terminal))
"""States a record can still leave: a sibling's publish over its span may change its fate."""


def _owner(nodes: Sequence[Node], slot: int) -> Node:
    """The node that maps device slot ``slot``."""
    return next(node for node in nodes if slot in node.value.tolist())


def _in(slots: torch.Tensor, chosen: set[int]) -> torch.Tensor:
    """A mask of ``slots`` that are in ``chosen``."""
    if not chosen:
        return torch.zeros(slots.numel(), dtype=torch.bool)
    return torch.isin(slots, torch.tensor(sorted(chosen), dtype=torch.int64))


class PipelineFuzzer(RuleBasedStateMachine):
    """The fuzzer over stagefate's own setup; :func:`configured` makes a variant (another tree,
    faults off, a log) as a subclass, so no caller changes what another one runs."""

    faults: ClassVar[bool] = True
    """IO errors, short reads and L3 drops (``stagefate fuzz --no-faults`` turns them off)."""

    storage_factory: ClassVar[Callable[[PipelineConfig], Storage]] = staticmethod(
        lambda config: MemoryStorage()
    )
    """The L3 each program starts with (tests swap in Mooncake)."""
    tree_factory: ClassVar[TreeFactory] = RadixTree
    """The radix tree under test: any :class:`~stagefate.runtime.prefix_tree.PrefixTree`."""
    device: ClassVar[str] = "cpu"
    """Where the device and aux pools live (``cuda``: real H2D copies on a side stream)."""
    log_path: ClassVar[str | None] = None
    """Write each program's transition log here (rewritten per program: after a failure it
    holds the minimal failing program's, which ``stagefate validate`` can check)."""

    requests = Bundle("requests")

    @initialize(window=st.sampled_from(WINDOWS), knobs=KNOBS)
    def setup(self, window: int | None, knobs: dict[str, Any] | None = None) -> None:
        """L3 holds every page-aligned prefix of every sequence, with its aux window if any
        (``window``: the sliding window the program runs with; :func:`configured` may narrow
        the choice); ``knobs``: the program's deployment (:data:`~.world.KNOB_CHOICES`)."""
        cfg = fuzz_config(window, type(self).device, **(knobs or {}))
        self.storage = type(self).storage_factory(cfg)
        keys, pages = l3_contents(window)
        self.storage.batch_set(keys, pages)
        self.clock = ManualClock()
        """Times the reads; moved by :meth:`time_passes`."""
        self.pipe = BufferPipeline(
            cfg,
            storage=self.storage,
            io=ManualIO(self.clock),
            tree_factory=type(self).tree_factory,
        )
        self.pipe.instruments.append(record_edge)
        self.log = None if self.log_path is None else TransitionLog.open(self.log_path)
        if self.log is not None:
            self.pipe.instruments.append(self.log)
        self.groups = {name: self.pipe.spec.group(name) for name in ("pre_commit", "owning")}
        self.asked: dict[str, tuple[list[int], str | None]] = {}
        self.running: list[Node] = []
        """Nodes the engine's running requests lock (their KV must stay while they compute)."""
        self.admitted: set[str] = set()
        """Admitted requests: once their load (if any) landed they run, and a growing batch may
        retract them."""

    # ------------------------------------------------------------------ scheduler

    def _tokens(self, sequence: int, pages: int) -> list[int]:
        return SEQUENCES[sequence][: pages * PAGE]

    def _issue(
        self, request_id: str, tokens: list[int], salt: str | None, stale: bool = False
    ) -> None:
        """Issue with the live match, or (``stale``) one page more, measured before an evict."""
        matched = self.pipe.tree.match_prefix(tokens, cache_salt=salt).length
        if stale:
            matched = min(matched + PAGE, len(tokens) - len(tokens) % PAGE)
        self.pipe.prefetch_from_storage(request_id, tokens, matched, cache_salt=salt)

    @rule(
        target=requests,
        request_id=st.sampled_from(REQUEST_IDS),
        sequence=st.integers(0, len(SEQUENCES) - 1),
        pages=st.integers(1, 8),
        salt=st.sampled_from(NAMESPACES),
        stale=st.booleans(),
    )
    def issue(
        self, request_id: str, sequence: int, pages: int, salt: str | None, stale: bool
    ) -> str:
        if request_id not in self.pipe.live_records:
            self.asked[request_id] = (self._tokens(sequence, pages), salt)  # the id reused
            self.admitted.discard(request_id)
        tokens, asked_salt = self.asked[request_id]
        self._issue(request_id, tokens, asked_salt, stale)
        return request_id

    @precondition(lambda self: self._retractable())
    @rule(request_id=REQUEST)
    def retract(self, request_id: str) -> None:
        """The running batch grew and a running request is retracted: the scheduler re-queues
        it and prefetches its prompt again under the same id."""
        request_id = self._next_of(request_id, set(self._retractable()))
        self.admitted.discard(request_id)
        self._issue(request_id, *self.asked[request_id])

    def _retractable(self) -> list[str]:
        return [
            request_id for request_id in self.admitted if request_id not in self.pipe.live_records
        ]

    @rule(
        first=st.sampled_from(REQUEST_IDS),
        second=st.sampled_from(REQUEST_IDS),
        sequence=st.integers(0, len(SEQUENCES) - 1),
        pages=st.integers(1, 8),
        salt=st.sampled_from(NAMESPACES),
    )
    def siblings_arrive_together(
        self, first: str, second: str, sequence: int, pages: int, salt: str | None
    ) -> None:
        """Two requests with the same prompt at once: the case in-flight dedup is for."""
        for request_id in dict.fromkeys((first, second)):
            if request_id not in self.pipe.live_records:
                self.asked[request_id] = (self._tokens(sequence, pages), salt)
                self._issue(request_id, *self.asked[request_id])

    @precondition(lambda self: self._in_states(_LOCKABLE))
    @rule(request_id=REQUEST)
    def lock_again(self, request_id: str) -> None:
        """The scheduler calls try_lock_anchor again (it is idempotent when locked)."""
        self.pipe.try_lock_anchor(self._pick(request_id, _LOCKABLE))

    @rule()
    def poll(self) -> None:
        self.pipe.poll()

    @rule()
    def fire_completions(self) -> None:
        """Mid-pass, the scheduler fires what has landed and leaves the commits to its poll."""
        self.pipe.fire_completions()

    @rule(
        measured=st.sampled_from(["load", "forward", "nothing yet"]),
        tokens=st.sampled_from([4, 16, 64]),
        seconds=st.sampled_from([1e-5, 1e-3, 0.1]),
    )
    def the_engine_measures_speeds(self, measured: str, tokens: int, seconds: float) -> None:
        """The engine reports a load's or a forward's time (or restarts its measuring), so
        the IO commit's ``load_slower_than_compute`` answers both ways."""
        measure(self.pipe.speeds, measured, tokens, seconds)

    @rule(seconds=st.sampled_from([1e-4, 0.01, 1.0]))
    def time_passes(self, seconds: float) -> None:
        """The reads in flight run longer (the speeds' floor, and ``give_up_slow_read``)."""
        self.clock.advance(seconds)

    @precondition(lambda self: self._in_states(_PENDING))
    @rule(request_id=REQUEST)
    def give_up_slow_read(self, request_id: str) -> None:
        """The scheduler, about to keep a request waiting, asks whether it should compute."""
        self.pipe.give_up_slow_read(self._pick(request_id, _PENDING))

    @rule()
    def reissue_due_retries(self) -> None:
        for request_id in self.pipe.due_retries(list(self.asked)):
            self._issue(request_id, *self.asked[request_id])

    def _live_prefix(self, request_id: str) -> torch.Tensor:
        tokens, salt = self.asked[request_id]
        return self.pipe.tree.match_prefix(tokens, cache_salt=salt).device_indices

    def _in_states(self, states: tuple[str, ...], planned: bool | None = None) -> list[str]:
        return [
            request_id
            for request_id, record in self.pipe.live_records.items()
            if record.state in states
            and (planned is None or (record.plan_prefix is not None) == planned)
        ]

    def _pick(self, request_id: str, states: tuple[str, ...], planned: bool | None = None) -> str:
        """``request_id`` if it is in one of ``states``, else the next request id that is (in
        :data:`REQUEST_IDS` order, wrapping): every draw acts, and a printed program replays."""
        return self._next_of(request_id, set(self._in_states(states, planned)))

    def _next_of(self, request_id: str, chosen: set[str]) -> str:
        """``request_id`` if ``chosen``, else the next chosen one in :data:`REQUEST_IDS` order."""
        start = REQUEST_IDS.index(request_id)
        for candidate in REQUEST_IDS[start:] + REQUEST_IDS[:start]:
            if candidate in chosen:
                return candidate
        raise AssertionError(f"the precondition promised one of {sorted(chosen)}")

    @precondition(lambda self: self._in_states(_HOLDS))
    @rule(request_id=REQUEST, stale_pages=st.integers(0, 3))
    def plan(self, request_id: str, stale_pages: int) -> None:
        request_id = self._pick(request_id, _HOLDS)
        length = self._live_prefix(request_id).numel()
        self.pipe.plan_staged_splice(request_id, max(0, length - stale_pages * PAGE))

    @precondition(lambda self: self._in_states(_HOLDS, planned=True))
    @rule(request_id=REQUEST)
    def consume(self, request_id: str) -> None:
        request_id = self._pick(request_id, _HOLDS, planned=True)
        self.pipe.init_load_back(request_id, self._live_prefix(request_id))
        self.admitted.add(request_id)

    @precondition(lambda self: self._in_states(_HOLDS))
    @rule(request_id=REQUEST)
    def admit(self, request_id: str) -> None:
        """Admission in one step, as a scheduler does it: plan, then consume what was charged."""
        self._admit(self._pick(request_id, _HOLDS))

    def _admit(self, request_id: str) -> None:
        prefix = self._live_prefix(request_id)
        kv_tokens, _swa = self.pipe.plan_staged_splice(request_id, prefix.numel())
        if kv_tokens:
            self.pipe.init_load_back(request_id, prefix)
        self.admitted.add(request_id)  # admitted, whether or not anything was loaded

    @precondition(lambda self: self.pipe.io.pending() > 0)
    @rule()
    def complete_all_io(self) -> None:
        """Storage and copies catch up at once (then the scheduler polls)."""
        self.pipe.io.complete_all()  # type: ignore[attr-defined]
        self.pipe.poll()

    @rule(request_id=requests)
    def abort(self, request_id: str) -> None:
        self.pipe.release_aborted_request(request_id)

    @precondition(lambda self: self._in_states(_HOLDS))
    @rule(request_id=REQUEST)
    def release_hold(self, request_id: str) -> None:
        self.pipe.release_staged_hold(self._pick(request_id, _HOLDS))

    @precondition(lambda self: self._in_states(_NO_CONSUME))
    @rule(request_id=REQUEST)
    def illegal_consume_changes_nothing(self, request_id: str) -> None:
        request_id = self._pick(request_id, _NO_CONSUME)
        record = self.pipe.live_records[request_id]
        before = (record.state, record.pinned_tokens, self.pipe.host_pool.available())
        try:
            self.pipe.init_load_back(request_id, self._live_prefix(request_id))
        except LifecycleError:
            pass
        else:
            raise AssertionError(f"consume was accepted in state {before[0]!r}")
        assert (record.state, record.pinned_tokens, self.pipe.host_pool.available()) == before

    # ------------------------------------------------------------------ the world

    @precondition(lambda self: self.pipe.io.pending() > 0)
    @rule(
        which=st.integers(0, 15),
        mode=st.sampled_from(["full", "short", "fail"]),
        pages=st.integers(0, 8),
        poll_now=st.booleans(),
    )
    def complete_io(self, which: int, mode: str, pages: int, poll_now: bool) -> None:
        """The queued operation ``which`` (modulo the queue, oldest first) completes: fully,
        ``short`` with ``pages`` pages, or ``fail`` (only with faults on); then, if
        ``poll_now``, the scheduler polls. An H2D copy (``load``) never comes back short: it
        fails whole, and the engine then recomputes those tokens into the same slots (vLLM's
        ``recompute`` policy), as the world does here."""
        io = self.pipe.io
        queued = io.queued()  # type: ignore[attr-defined]
        op_id = queued[which % len(queued)]
        is_load = op_id in io.queued("load")  # type: ignore[attr-defined]
        if not self.faults or (is_load and mode == "short"):
            mode = "full"
        if mode == "fail" and is_load:
            self._recompute_splice_of(op_id)
            io.fail(op_id)  # type: ignore[attr-defined]
        elif mode == "fail":
            io.fail(op_id)  # type: ignore[attr-defined]
        elif mode == "short":
            io.complete_short(op_id, pages * PAGE)  # type: ignore[attr-defined]
        else:
            io.complete(op_id)  # type: ignore[attr-defined]
        if poll_now:
            self.pipe.poll()  # as the scheduler's next pass would; `poll` also runs on its own

    @rule(
        sequence=st.integers(0, len(SEQUENCES) - 1),
        pages=st.integers(1, 8),
        salt=st.sampled_from(NAMESPACES),
    )
    def sibling_publish(self, sequence: int, pages: int, salt: str | None) -> None:
        """Another request computes ``pages`` of a sequence into the tree (splits nodes)."""
        self._publish(self._tokens(sequence, pages), salt)

    @precondition(lambda self: self.pipe.live_records)
    @rule(request_id=REQUEST, extent=st.sampled_from(["head", "half", "exact"]))
    def sibling_publish_over_a_span(self, request_id: str, extent: str) -> None:
        """A sibling publishes part of a live record's span: its first page, half, or all."""
        self._publish_over(self._pick(request_id, _LIVE), extent)

    @precondition(lambda self: self._in_states(_HOLDS))
    @rule(
        request_id=REQUEST,
        extent=st.sampled_from(["head", "half"]),
        then_admit=st.booleans(),
        copies_complete=st.booleans(),
    )
    def sibling_publishes_the_head_of_a_hold(
        self, request_id: str, extent: str, then_admit: bool, copies_complete: bool
    ) -> None:
        """The case trims exist for: a staged span whose head a sibling computes meanwhile
        (and, often, the request is admitted right after and its copy runs)."""
        request_id = self._pick(request_id, _HOLDS)
        self._publish_over(request_id, extent)
        if then_admit and self.pipe.state(request_id) in _HOLDS:
            self._admit(request_id)
            if copies_complete:
                self.complete_all_io()

    def _publish_over(self, request_id: str, extent: str) -> None:
        record = self.pipe.live_records[request_id]
        tokens, salt = self.asked[request_id]
        span_pages = max(1, record.span_tokens // PAGE)
        pages = {"head": 1, "half": max(1, span_pages // 2), "exact": span_pages}[extent]
        self._publish(tokens[: record.matched_len + pages * PAGE], salt)

    @rule(
        sequence=st.integers(0, len(SEQUENCES) - 1),
        pages=st.integers(1, 8),
        salt=st.sampled_from(NAMESPACES),
    )
    def a_request_starts_running(self, sequence: int, pages: int, salt: str | None) -> None:
        """A request computes a prefix and keeps it locked while it runs (device pressure)."""
        tokens = self._tokens(sequence, pages)
        self._publish(tokens, salt)
        match = self.pipe.tree.match_prefix(tokens, cache_salt=salt)
        if match.length:
            self.pipe.tree.inc_lock_ref(match.last_node)
            self.running.append(match.last_node)

    @precondition(lambda self: self.running)
    @rule(which=st.integers(0, 7))
    def a_request_finishes(self, which: int) -> None:
        """The running request ``which`` (modulo how many run, in start order) finishes."""
        node = self.running[which % len(self.running)]
        self.running.remove(node)
        self.pipe.tree.dec_lock_ref(node)

    def _recompute_splice_of(self, op_id: int) -> None:
        """The engine computes the tail whose copy (``op_id``) failed into its spliced slots."""
        (record,) = (r for r in self.pipe.live_records.values() if r.op_id == op_id)
        assert record.plan_prefix is not None and record.device_indices is not None
        tokens, salt = self.asked[record.request_id]
        values = mark(torch.tensor(tokens[record.plan_prefix : record.span_end]), salt)
        pool = self.pipe.device_pool
        pool.kv[:, :, record.device_indices] = values[None, None, :, None, None].to(pool.device)

    def _publish(self, tokens: list[int], salt: str | None) -> None:
        tree, pool = self.pipe.tree, self.pipe.device_pool
        present = tree.match_prefix(tokens, cache_salt=salt)
        slots = alloc_evicting(tree, pool, len(tokens) - present.length, present.last_node)
        if slots is None:
            return
        values = mark(torch.tensor(tokens[present.length :]), salt)
        pool.kv[:, :, slots] = values[None, None, :, None, None].to(pool.device)
        tree.insert(tokens, torch.cat([present.device_indices, slots]), cache_salt=salt)

    @rule(tokens=st.integers(0, 40))
    def evict(self, tokens: int) -> None:
        self.pipe.tree.evict(tokens)

    @precondition(lambda self: self.faults)
    @rule(
        sequence=st.integers(0, len(SEQUENCES) - 1),
        from_page=st.integers(0, 7),
        salt=st.sampled_from(NAMESPACES),
    )
    def l3_drop(self, sequence: int, from_page: int, salt: str | None) -> None:
        digests = page_hashes(SEQUENCES[sequence], PAGE, namespace_of(None, salt))
        self.storage.delete([storage_key(d) for d in digests[from_page:]])

    def teardown(self) -> None:
        close = getattr(getattr(self, "storage", None), "close", None)
        if close is not None:
            close()
        log: TransitionLog | None = getattr(self, "log", None)
        if log is None:
            return
        # Hypothesis runs teardown in a finally: under Ctrl-C the program was cut short, and its
        # log must not read as a whole one (a failing program's is whole up to its failure)
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):
            log.abandon()
        else:
            log.close()

    # ------------------------------------------------------------------ invariants
    # One @invariant per spec invariant whose checked_by lists `stateful`, named by its id.

    @spec_invariant
    def pin_safety(self) -> None:
        TALLY.states += 1
        pipe = self.pipe
        pipe.tree.sanity_check()
        for record in pipe.live_records.values():
            if record.pinned_node is not None:
                assert record.pinned_node.attached, f"{record.request_id}'s pinned node evicted"
                assert record.pinned_node.lock_ref > 0
            problems = holds_problems(pipe.spec, record, ("pin",))
            assert not problems, "; ".join(problems)  # pins as the spec's holds say

    @spec_invariant
    def pin_balance(self) -> None:
        pipe = self.pipe
        assert_pins_counted(pipe)
        if not self.running and all(r.pinned_node is None for r in pipe.live_records.values()):
            assert pipe.tree.protected_size == 0, "a pin outlived its record"

    @spec_invariant
    def pure_revoke(self) -> None:
        for record in self.pipe.live_records.values():
            if record.state in self.groups["pre_commit"]:
                assert record.host_indices is None and record.read_tokens == 0, (
                    f"{record.request_id} holds a bounce or launched a read before its commit"
                )

    @spec_invariant
    def hold_release(self) -> None:
        pipe = self.pipe
        assert pipe.host_pool.available() + bounce_owned(pipe) == pipe.host_pool.capacity, (
            "bounce leaked"
        )
        for record in pipe.live_records.values():
            problems = holds_problems(pipe.spec, record, ("bounce",))
            assert not problems, "; ".join(problems)  # bounces as the spec's holds say
        if pipe.host_aux_pool is not None:
            host_aux = sum(
                len(r.host_aux_indices)
                for r in pipe.live_records.values()
                if r.host_aux_indices is not None
            )
            assert pipe.host_aux_pool.available() + host_aux == pipe.host_aux_pool.capacity

    @spec_invariant
    def exactly_once_end(self) -> None:
        assert_books_close(self.pipe)
        stats = self.pipe.stats
        ended = sum(getattr(stats, reason) for reason in self.pipe.spec.reasons)
        assert stats.issued + stats.declined_too_short == ended + len(self.pipe.live_records)

    def _tree_kv(self) -> tuple[Sequence[Node], torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(nodes, their slots, the KV each slot holds, a mask of slots whose H2D copy has
        not run yet)``: one gather for the whole tree; None for an empty tree."""
        pipe = self.pipe
        nodes = pipe.tree.nodes()
        if not nodes:
            return None
        slots = torch.cat([node.value for node in nodes])
        held = pipe.device_pool.kv[0, 0, slots, 0, 0].cpu()
        return nodes, slots, held, _in(slots, copies_in_flight(pipe))

    @spec_invariant
    def splice_correctness(self) -> None:
        """Every tree node's KV is its own tokens' (in its namespace); in-flight copies excepted.
        One comparison for the whole tree; a node is named only on a mismatch."""
        found = self._tree_kv()
        if found is None:
            return
        nodes, slots, held, in_flight = found
        expected = torch.cat([expected_mark(node.namespace[1], node.tokens()) for node in nodes])
        wrong = (held != expected) & ~in_flight
        if bool(wrong.any()):
            raise AssertionError(f"wrong KV under {_owner(nodes, int(slots[wrong][0]))!r}")

    @spec_invariant
    def plan_equals_consume(self) -> None:
        spliced = self.pipe.spec.group("spliced")
        for record in self.pipe.live_records.values():
            if record.state in spliced:
                assert record.plan_prefix is not None and record.device_indices is not None
                charged = record.span_end - record.plan_prefix
                assert record.device_indices.numel() == charged == record.spliced_tokens, (
                    f"{record.request_id}: charged {charged} at plan, allocated "
                    f"{record.device_indices.numel()} at consume"
                )

    @spec_invariant
    def namespace_isolation(self) -> None:
        """A node's KV carries its namespace (the :data:`~.world.MARK_STRIDE` part of its
        :func:`~.world.mark`): a slot whose bytes name another namespace was spliced across
        namespaces."""
        found = self._tree_kv()
        if found is None:
            return
        nodes, slots, held, in_flight = found
        owners = torch.cat(
            [
                torch.full((node.value.numel(),), NAMESPACES.index(node.namespace[1]))
                for node in nodes
            ]
        )
        crossed = (torch.div(held, MARK_STRIDE, rounding_mode="floor") != owners) & ~in_flight
        if bool(crossed.any()):
            slot = int(slots[crossed][0])
            raise AssertionError(
                f"KV of another namespace under {_owner(nodes, slot)!r} (slot {slot})"
            )

    @spec_invariant
    def aux_and_ownership(self) -> None:
        pipe = self.pipe
        assert pipe.device_pool.available() + pipe.tree.total_tokens() == pipe.device_pool.capacity
        if pipe.aux_pool is not None:
            tree_aux = pipe.tree.aux_slots().numel()
            assert pipe.aux_pool.available() + tree_aux == pipe.aux_pool.capacity, "aux leaked"
            spliced = pipe.spec.group("spliced")
            for record in pipe.live_records.values():
                if record.state in spliced and record.aux_device_indices is not None:
                    assert record.aux_device_indices.numel() == record.aux_tokens, "aux cut"

    @spec_invariant
    def retry_discipline(self) -> None:
        pipe, most = self.pipe, self.pipe.config.retry_max_attempts
        for request_id in self.asked:
            assert pipe.retry_attempts(request_id) <= most, (
                f"{request_id} retried {pipe.retry_attempts(request_id)} times (at most {most})"
            )

    @spec_invariant
    def dedup_waiters(self) -> None:
        pipe = self.pipe
        for request_id in self.asked:
            sibling = pipe.waiting_on(request_id)
            if sibling is not None:
                record = pipe.live_records.get(sibling)
                assert record is not None and record.state in self.groups["owning"], (
                    f"{request_id} waits on {sibling}, which owns no span"
                )


def configured(
    *,
    faults: bool = True,
    tree_factory: TreeFactory = RadixTree,
    windows: tuple[int | None, ...] = WINDOWS,
    device: str = "cpu",
    storage_factory: Callable[[PipelineConfig], Storage] | None = None,
    log_path: str | None = None,
) -> type[PipelineFuzzer]:
    """A :class:`PipelineFuzzer` subclass with these settings (a tree without aux support takes
    ``windows=(None,)``; ``storage_factory`` builds each program's L3, memory by default)."""
    settings: dict[str, object] = {
        "faults": faults,
        "tree_factory": staticmethod(tree_factory),
        "device": device,
        "log_path": log_path,
        "__module__": __name__,
    }
    if storage_factory is not None:
        settings["storage_factory"] = staticmethod(storage_factory)
    if windows != WINDOWS:
        settings["setup"] = _setup_drawing(windows)
    return type("PipelineFuzzer", (PipelineFuzzer,), settings)


def _setup_drawing(
    windows: tuple[int | None, ...],
) -> Callable[[PipelineFuzzer, int | None, dict[str, Any]], None]:
    """:meth:`PipelineFuzzer.setup`, drawing its window from ``windows``."""

    @initialize(window=st.sampled_from(windows), knobs=KNOBS)
    def setup(self: PipelineFuzzer, window: int | None, knobs: dict[str, Any]) -> None:
        PipelineFuzzer.setup(self, window, knobs)

    return setup
