"""``BufferPipeline``: staged prefetches driven through the generated lifecycle.

Theory of operation
-------------------
Each request id has at most one live :class:`Record`. Every change of a record's state goes
through :meth:`_fire`, which calls the row of the compiled machine (generated from
``spec/lifecycle.yaml``) for the record's state and the event: it takes the first branch whose
guard holds and runs that branch's effects. Guards and effects are the ``_guard_*`` and
``_effect_*`` methods below, bound by name; the machine refuses to build unless the two sets are
exactly the spec's (so the spec cannot name something this class lacks, and this class cannot
grow lifecycle logic the spec does not show). The row also counts the branch's counters, runs
the spec's exits of the move (the ``_exit_*`` methods, bound the same way: leaving ``parked``
leaves its FIFO, leaving the owning states gives up the span's page keys) and, for a branch
with a reason, ends the record (:meth:`_end`: settle the read's books, forget the record).

Guards read; effects write. A guard reads the live tree (no stored node id is ever trusted)
through the firing's :class:`Lookups`: each match a firing needs is made once, the first time a
guard asks, and kept for the rest of that firing only, so the anchor the lock pins and the node
the splice hangs below are the ones its guards saw. A match is a cache read: like SGLang's
``match_prefix`` it refreshes the access time of what it passes and may split the node it ends
inside (no match result changes), and it happens exactly once per firing whether or not the
``transitions`` oracle runs in lockstep, so a checked run follows production's eviction order.
No guard writes the record, allocates, frees or evicts: ``init_load_back`` makes room through the
spec's ``make_room`` row (its ``evict_for_splice`` effect) before it consumes. Public commands
validate their arguments first and raise before anything changes.

IO completions carry an operation id. ``poll()`` drains them on the caller's thread; a
completion whose record has ended, or whose id is not the record's current operation (a request
id may be reused), is dropped and counted in ``stale_completions``. Under tensor parallelism
(a ``group``) a drained completion is held until every rank has its own, then acted on with the
values the ranks agreed, after the ranks have checked they fired the same transitions
(:mod:`.lockstep`); the guards read only agreed facts, so every rank fires the same rows.

This module is the binding: the scheduler's commands, the firing, the guards and the effects.
What they use lives beside it, one concept a module: :mod:`.record` (a prefetch's record and the
firing's lookups), :mod:`.books` (every L3 read settled as spliced or wasted, and why; the
replay's other policies keep the same books), :mod:`.dedup` (who owns which page keys, who waits
on whom), :mod:`.retry` (paced retries), :mod:`.io_ops` (the IO operations effects submit, and
the span's page keys), :mod:`.lockstep` and :mod:`.group` (tensor-parallel agreement).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, Literal, cast, get_args

import torch

from ..runtime import (
    AuxPool,
    Completion,
    CopyEngine,
    DevicePool,
    HostPool,
    IOExecutor,
    IOOp,
    ManualIO,
    RadixTree,
    Storage,
    ThreadedIO,
    TokenKey,
    Tokens,
    namespace_of,
    page_hashes,
)
from ..runtime.engine import EngineCache
from ..runtime.hashing import rank_storage_keys
from ..runtime.io import Closable, TimesReads
from ..runtime.pools import SlotPool
from ..runtime.prefix_tree import Node, PrefixMatch, PrefixTree, TreeFactory, locked
from ..runtime.storage import KnowsWrites, open_storage
from ..spec import LifecycleSpec, load_spec
from ..spec.names import LockableState, StateName
from ..spec.schema import ApiCall
from .books import ReadBooks
from .config import PipelineConfig
from .dedup import DedupBook
from .errors import IncompleteImplementation, LifecycleError
from .group import Group
from .io_ops import IOOperations, Run, span_digests
from .lockstep import RankAgreement
from .machine import CompiledMachine, Outcome, bind, named_methods
from .record import Instrument, Lookups, Record, TransitionEvent
from .retry import RetryBook
from .speeds import LoadSpeeds, SpeedEstimate
from .stats import Stats

if TYPE_CHECKING:  # the oracle runs on `transitions`, a tool: imported only when it is on
    from .oracle import OracleMachine, OracleModel

LockOutcome = LockableState
"""What ``try_lock_anchor`` returns: a state of the spec's ``lockable`` group."""
_EMPTY = torch.empty(0, dtype=torch.int64)


class BufferPipeline:
    """The staged-prefetch lifecycle over a live tree, pools, L3 storage and an IO executor."""

    GUARDS: ClassVar[frozenset[str]]
    EFFECTS: ClassVar[frozenset[str]]
    EXITS: ClassVar[frozenset[str]]
    GROUPS: ClassVar[tuple[str, ...]] = ("hold", "pending", "lockable")
    """The spec's state groups this class reads (a spec without one is refused)."""

    def __init__(
        self,
        config: PipelineConfig | None = None,
        storage: Storage | None = None,
        io: IOExecutor | None = None,
        spec: LifecycleSpec | None = None,
        tree_factory: TreeFactory | None = None,
        group: Group | None = None,
        engine: EngineCache | None = None,
    ) -> None:
        self.config = cfg = config or PipelineConfig()
        _check_group(cfg, group)
        _check_engine(cfg, engine, tree_factory)
        self.layout = cfg.layout
        self.device_pool: SlotPool = (
            DevicePool(self.layout, cfg.device_tokens, cfg.device)
            if engine is None
            else engine.device_pool
        )
        self.host_pool = (
            HostPool(self.layout, cfg.host_tokens)
            if engine is None or engine.host_pool is None
            else engine.host_pool
        )
        window = cfg.sliding_window
        self.aux_pool = (
            None
            if window is None
            else AuxPool(self.layout, cfg.device_tokens, self.device_pool.device)
        )
        self.host_aux_pool = (
            None if window is None else HostPool(self.layout, cfg.host_tokens, name="host_aux_pool")
        )
        make_tree: TreeFactory = (
            engine.tree_factory if engine is not None else tree_factory or RadixTree
        )
        self.tree: PrefixTree = make_tree(cfg.page_size, self.device_pool, self.aux_pool)
        self.storage: Storage = (
            storage
            if storage is not None
            else open_storage(cfg.storage, self.layout, cfg.page_size)
        )
        self.io: IOExecutor = (
            io
            if io is not None
            else (ManualIO() if cfg.io == "manual" else ThreadedIO(cfg.io_workers))
        )
        self.copy = (
            CopyEngine(self.device_pool.device)
            if engine is None or engine.copy is None
            else engine.copy
        )
        self._remembered_writes = self.storage if isinstance(self.storage, KnowsWrites) else None
        """The store, where it remembers its writes (asked once: a protocol check costs ~9 µs,
        and ``write_through`` is on the replay's hot path)."""
        self._storage_key, self._aux_storage_key = rank_storage_keys(cfg.tp_rank, cfg.tp_size)
        self.ops = IOOperations(
            self.storage,
            self.copy,
            self.host_pool,
            self.host_aux_pool,
            self.device_pool,
            self.aux_pool,
            cfg.page_size,
            self._aux_storage_key,
        )
        self.spec = spec or load_spec()
        self._counts: dict[str, int] = dict.fromkeys(Stats.model_fields, 0)
        self._hold_states, self._pending_states, self._lockable_states = (
            self.spec.group(name) if name in self.spec.groups else frozenset()
            for name in self.GROUPS
        )  # a missing group is named by the machine's completeness check just below
        self._spliced_ends = self.spec.reasons_leaving("spliced")
        _check_calls(self.spec)
        self._give_up_event = self.spec.calls["give_up_slow_read"][-1]
        guards = bind(self, "_guard_", self.GUARDS)
        effects = bind(self, "_effect_", self.EFFECTS)
        self.machine: CompiledMachine[Record] = CompiledMachine(
            self.spec,
            guards,
            effects,
            counts=self._counts,
            exits=bind(self, "_exit_", self.EXITS),
            end=self._end,
            groups=self.GROUPS,
        )
        self._transitions = self.machine.transitions
        self._oracle: OracleMachine | None = None
        if cfg.check_oracle:
            from .oracle import OracleMachine

            self._oracle = OracleMachine(self.spec, guards)
        self._oracle_models: dict[str, OracleModel] = {}
        self.cap = cfg.anchor_lock_cap
        self.pinned_tokens = 0
        self._records: dict[str, Record] = {}
        self._live_view = MappingProxyType(self._records)  # a view: it follows the dict
        self._look = Lookups()
        self._ops: dict[int, Record] = {}
        """Operation id -> the live record it is the current operation of (ends pop theirs)."""
        self._op_ids = itertools.count(1)
        self._hits: OrderedDict[str, None] = OrderedDict()
        self._parked: OrderedDict[str, None] = OrderedDict()
        self._books = ReadBooks(self._counts)
        self._retries = RetryBook(
            cfg.retry_interval, cfg.retry_max_attempts, head_due_at_once=cfg.retry_head_at_once
        )
        self._dedup = DedupBook()
        self.polls = 0
        self.instruments: list[Instrument] = []
        self.speeds = LoadSpeeds()
        """Loads and forwards as measured: the IO executor's timed reads (:class:`ThreadedIO`
        times them) and the engine's forwards (:meth:`LoadSpeeds.observe_forward`); each pass's
        IO commits read their estimate."""
        self._times_reads = self.io if isinstance(self.io, TimesReads) else None
        self._agreement = None if group is None else RankAgreement(group)
        if self._agreement is not None:
            self._agreement.lockstep.agree_config(cfg.fingerprint())

    # ================================================================== public commands

    def prefetch_from_storage(
        self,
        req_id: str,
        tokens: Tokens,
        matched_len: int,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Issue a prefetch of ``tokens[matched_len:]``; returns the state it is in afterwards.

        A live request id returns its current state and issues nothing. A span below
        ``prefetch_threshold`` ends at once as ``released`` (``declined_too_short``).
        """
        self._check_open()
        key = TokenKey.of(tokens)
        self._check_request_id(req_id)
        namespace = namespace_of(extra_key, cache_salt)
        page = self.config.page_size
        if not isinstance(matched_len, int) or isinstance(matched_len, bool):
            raise TypeError(f"matched_len must be an int, got {type(matched_len).__name__}")
        if matched_len < 0 or matched_len > len(key):
            raise ValueError(
                f"matched_len={matched_len} must lie in [0, len(tokens)={len(key)}]: it "
                f"is the length of the device prefix the request matched"
            )
        if matched_len % page:
            raise ValueError(f"matched_len={matched_len} must be a multiple of page_size={page}")
        self._counts["attempts"] += 1
        live = self._records.get(req_id)
        if live is not None:
            return live.state
        self._retries.disarm(req_id)
        aligned = key.whole_pages(page)
        record = Record(
            request_id=req_id,
            tokens=aligned,
            matched_len=matched_len,
            namespace=namespace,
            state=cast(StateName, self.spec.initial),
            span_end=len(aligned),
        )
        self._records[req_id] = record
        if self._oracle is not None:
            self._oracle_models[req_id] = self._oracle.add(record)
        if not self._fire(record, self.spec.issue_event).ended:
            match = self._look.anchor  # what the lock that just fired matched
            anchor = None  # a match shorter than matched_len (the anchor lost) seeds no key
            if match is not None and match.length == matched_len:
                anchor = match.last_node
            record.span_digests = digests = span_digests(
                self.tree, record.tokens, matched_len, namespace, page, anchor
            )
            record.span_keys = list(map(self._storage_key, digests))
            self._submit(record, "exists", self.ops.exists(record.span_keys))
        return record.state

    def try_lock_anchor(self, req_id: str) -> LockOutcome:
        """Re-match the anchor on the live tree and pin it if allowed (idempotent when locked)."""
        record = self._live(req_id, "try_lock_anchor")
        state = self._call(record, "try_lock_anchor").target
        assert state in self._lockable_states, f"the spec's lock row left {state!r}, not lockable"
        return cast(LockOutcome, state)

    def poll(self) -> None:
        """One scheduling pass: drain IO completions, then run IO commits (parked first).

        Under tensor parallelism every rank polls every pass: the ranks first agree that they
        fired the same transitions, then act only on completions every rank has, with what they
        agreed of them (:class:`~.lockstep.RankAgreement`)."""
        self._check_open()
        self.polls += 1
        self._fire_completions()
        self._run_commits()

    def fire_completions(self) -> None:
        """Fire the IO completions that have arrived, and run no IO commit (the next
        :meth:`poll` runs them): an existence query answered a miss ends its record now, one
        answered a hit waits for its commit, a read that landed is staged.

        For a scheduler that waits a moment for a query it just issued, in the middle of a
        scheduling pass, where starting reads (the commits) is the pass's end's business. One
        rank only: under tensor parallelism completions fire at :meth:`poll`, where the ranks
        agree on them."""
        self._check_open()
        if self._agreement is not None:
            raise RuntimeError(
                "fire_completions() is refused under tensor parallelism: the ranks agree on "
                "completions only at poll(), which every rank calls each pass; call poll()"
            )
        self._fire_completions()

    def _fire_completions(self) -> None:
        agreement = self._agreement
        completions = self.io.drain()
        running = self._reads_running()
        self._time_reads(completions, running)
        if agreement is not None:
            room = [self.host_pool.available(), self._host_aux_available()]
            estimate = self.speeds.estimate()
            overdue = {
                op_id for op_id, record in self._ops.items() if _overdue(record, estimate, running)
            }
            completions = agreement.completions(
                completions, sorted(self._ops), room, estimate, overdue
            )
        for completion in completions:
            self._on_completion(completion)

    def staged_splice_tokens(self, req_id: str, device_prefix_len: int) -> int:
        """Tokens a plan at ``device_prefix_len`` would splice (0: unusable); changes nothing."""
        self._check_prefix_len(device_prefix_len)
        record = self._records.get(req_id)
        if record is None or record.state not in self._hold_states:
            return 0
        record.arg_prefix_len = device_prefix_len
        self._new_lookups()  # a decision is a firing that changes nothing: its own lookups
        outcome = self.machine.decide(record, self.spec.calls["plan_staged_splice"][0])
        return 0 if outcome.ended else record.span_end - device_prefix_len

    def plan_staged_splice(self, req_id: str, device_prefix_len: int) -> tuple[int, int]:
        """Charge the splice at admission: ``(kv_tokens, swa_tokens)``; frees an unusable hold."""
        self._check_prefix_len(device_prefix_len)
        record = self._records.get(req_id)
        if record is None or record.state not in self._hold_states:
            return (0, 0)
        record.arg_prefix_len = device_prefix_len
        if self._call(record, "plan_staged_splice").ended:
            return (0, 0)
        return (record.span_end - device_prefix_len, record.aux_tokens)

    def init_load_back(self, req_id: str, prefix_indices: torch.Tensor) -> torch.Tensor:
        """Splice the planned tail after ``prefix_indices``; returns its device slots.

        Returns an empty tensor when the live prefix moved since the plan (the hold is released
        as ``dropped``) or the device pool cannot hold the tail (``device_capacity``).
        """
        self._check_open()
        if not isinstance(prefix_indices, torch.Tensor) or prefix_indices.dtype != torch.int64:
            raise TypeError(
                "prefix_indices must be the int64 device indices of the request's prefix "
                "(MatchResult.device_indices)"
            )
        record = self._live(req_id, "init_load_back")
        if record.plan_prefix is None:
            raise LifecycleError(
                req_id,
                record.state,
                self.spec.calls["init_load_back"][-1],
                self.machine.legal_events(record.state),
                hint="no plan was made: call plan_staged_splice(req_id, device_prefix_len) first",
            )
        if prefix_indices.dim() != 1 or not prefix_indices.is_cpu:
            prefix_indices = prefix_indices.reshape(-1).cpu()
        record.arg_prefix_indices = prefix_indices
        if self._call(record, "init_load_back").ended:
            return _EMPTY
        assert record.device_indices is not None
        return record.device_indices

    def release_staged_hold(self, req_id: str) -> bool:
        """Free a staged hold the scheduler will not consume; False when there is none."""
        record = self._records.get(req_id)
        if record is None or record.state not in self._hold_states:
            return False
        self._call(record, "release_staged_hold")
        return True

    def release_aborted_request(self, req_id: str) -> None:
        """Abort: release everything the request holds (a read in flight ends on completion)."""
        self._retries.forget(req_id)
        self._dedup.stop_waiting(req_id)
        record = self._records.get(req_id)
        if record is not None:
            self._call(record, "release_aborted_request")

    def give_up_slow_read(self, req_id: str) -> bool:
        """Asked before keeping a request waiting for its read in flight: should it compute
        instead? True when the read has run longer than computing its tokens would take at the
        measured forward speed (``read_outlasts_compute``): the record is then ``outrun``, the
        request computes those tokens, and the read's bounce is freed when it lands. False,
        changing nothing, otherwise (no read in flight, or the read may still win)."""
        self._check_request_id(req_id)
        record = self._records.get(req_id)
        if record is None or not self.machine.allows(record.state, self._give_up_event):
            return False
        outcome = self._call(record, "give_up_slow_read")
        return outcome.target != outcome.source

    def request_left(self, req_id: str) -> None:
        """The request left the waiting queue (admitted, or finished): its paced retries and a
        wait on a sibling are forgotten. A live record goes on to its end (an abort is
        :meth:`release_aborted_request`)."""
        self._retries.forget(req_id)
        self._dedup.stop_waiting(req_id)

    def due_retries(self, waiting_req_ids: Sequence[str]) -> list[str]:
        """Waiting requests whose paced retry is due now (the queue head never waits)."""
        # one waiting on a sibling is due when that sibling's ownership shrinks, not before:
        # re-issued earlier it would only be declined again, spending its attempts
        return self._retries.due(waiting_req_ids, self.polls, held=self._dedup.is_waiting)

    def write_through(
        self,
        tokens: Tokens,
        device_indices: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        aux_indices: torch.Tensor | None = None,
    ) -> int:
        """Producer side: store the KV of ``tokens`` (whole pages) in L3; returns pages written.

        ``aux_indices`` are aux-pool slots of the trailing window (whole pages, ending at the
        last whole page); their KV is stored beside those pages so a consumer can splice it.
        """
        key = TokenKey.of(tokens)
        namespace = namespace_of(extra_key, cache_salt)
        page = self.config.page_size
        aligned = key.whole_pages(page)
        if device_indices.numel() < len(aligned):
            raise ValueError(
                f"write_through: {len(aligned)} tokens but {device_indices.numel()} device slots"
            )
        digests = page_hashes(aligned, page, namespace)
        self.tree.remember_page_keys(aligned, digests, *namespace)
        keys = [self._storage_key(d) for d in digests]
        # a store that remembers its writes spares gathering the pages it already holds
        writes = self._remembered_writes
        known = 0 if writes is None else writes.written_prefix(keys)
        fresh = device_indices[known * page : len(aligned)]
        self.storage.batch_set(keys[known:], self.copy.pages_of(self.device_pool, fresh, page))
        if aux_indices is not None:
            if self.aux_pool is None:
                raise ValueError("write_through: aux_indices given but sliding_window is None")
            if aux_indices.numel() % page or aux_indices.numel() > len(aligned):
                raise ValueError("write_through: aux_indices must be whole pages of the tail")
            aux_pages = self.copy.pages_of(self.aux_pool, aux_indices, page)
            tail = digests[len(digests) - len(aux_pages) :]
            self.storage.batch_set([self._aux_storage_key(d) for d in tail], aux_pages)
        return len(digests)

    # ================================================================== public queries

    def state(self, req_id: str) -> str | None:
        """The state of ``req_id``'s live record (None: it has none)."""
        record = self._records.get(req_id)
        return None if record is None else record.state

    @property
    def live_records(self) -> Mapping[str, Record]:
        """The live records by request id, as a read-only view (for checkers, metrics and
        tests: a record belongs to the lifecycle, so read it and never write it)."""
        return self._live_view

    def retry_pending(self, req_id: str) -> bool:
        """A paced retry is armed for the request: :meth:`due_retries` names it when it is due."""
        return self._retries.pending(req_id)

    def retry_attempts(self, req_id: str) -> int:
        """The paced retries the request has used (at most ``retry_max_attempts``)."""
        return self._retries.attempts(req_id)

    def waiting_on(self, req_id: str) -> str | None:
        """The live sibling whose read of this request's span head it waits on
        (``declined_inflight``), or None."""
        return self._dedup.sibling_of(req_id)

    def owns_no_page_keys(self) -> bool:
        """No record owns a page key and no request waits on one (so whenever nothing is live;
        a checker asserts it at quiescence)."""
        return self._dedup.is_empty()

    def storage_query_pending(self, req_id: str) -> bool:
        """The request's existence query is in flight: L3 has not answered yet."""
        record = self._records.get(req_id)
        return (
            record is not None
            and record.state in self._lockable_states
            and record.op_id is not None
        )

    def has_hold(self, req_id: str) -> bool:
        """The request holds a staged span in the bounce that admission may plan, consume or
        release (the spec's ``hold`` group): SGLang's ``has_staged``."""
        record = self._records.get(req_id)
        return record is not None and record.state in self._hold_states

    def prefetch_pending(self, req_id: str) -> bool:
        """The request's prefetch is still on its way: a scheduler admitting it now would admit
        it without what the prefetch brings (SGLang's ``check_prefetch_progress`` is False).

        True while its record is before ``staged`` (existence query, parked, commit, read), and
        while it waits for a sibling already reading its span's head (``declined_inflight``):
        its retry falls due the moment that sibling's ownership shrinks (it lands, ends short
        or is aborted), and not before.
        """
        record = self._records.get(req_id)
        if record is not None:
            return record.state in self._pending_states
        return self._retries.pending(req_id) and self._dedup.is_waiting(req_id)

    @property
    def stats(self) -> Stats:
        """Every counter of the spec (each end reason counts itself), as they stand."""
        return Stats(**self._counts)

    def reads_in_flight(self) -> tuple[int, int]:
        """``(reads, tokens)`` of live records with a read launched and not yet settled.

        They close the books of :attr:`stats` at every moment (a record that ended from the
        ``spliced`` states, filled or with its copy failed, is exactly one whose read was
        spliced from): ``l3_reads == spliced_from_reads() + l3_reads_wasted + reads`` and
        ``l3_read_tokens == spliced_tokens + l3_read_tokens_wasted + tokens``.
        """
        live = [r for r in self._records.values() if r.read_tokens]
        return len(live), sum(r.read_tokens - r.spliced_tokens for r in live)

    def spliced_from_reads(self) -> int:
        """Settled reads that were spliced from: records ended from the ``spliced`` states."""
        return sum(self._counts[reason] for reason in self._spliced_ends)

    def wasted_by_reason(self) -> dict[str, tuple[int, int]]:
        """``{reason: (reads, tokens)}`` of L3 reads settled as wasted, by why.

        A read nothing was spliced from counts under its record's end reason (``discarded``,
        ``shrunk``, ``device_covered``, ``dropped``, ``aborted``, …). Tokens read but not spliced
        from a read that was used count under ``trimmed`` (the head a sibling published) and
        ``short_read`` (the tail L3 did not return), with 0 reads. The reads and tokens add up
        to ``l3_reads_wasted`` and ``l3_read_tokens_wasted``.
        """
        return self._books.wasted_by_reason()

    def is_idle(self) -> bool:
        """No live record and no IO in flight."""
        return not self._records and self.io.pending() == 0

    # ================================================================== firing

    def _fire(self, record: Record, event: str) -> Outcome:
        """Fire ``event`` through the spec's generated row function (counters, exit hooks and
        the end of the record included), cross-checked by the oracle when it is on."""
        transition = self._transitions.get((record.state, event))
        if transition is None:
            raise self.machine.refuse(record, event)
        self._new_lookups()
        if self._oracle is None:
            outcome = transition(record)
        else:
            outcome = self._fire_checked(record, event, transition)
        if self._agreement is not None:
            self._agreement.lockstep.record(record.request_id, event, outcome.target)
        for instrument in self.instruments:
            instrument(TransitionEvent(record.request_id, outcome))
        return outcome

    def _call(self, record: Record, call: ApiCall) -> Outcome:
        """Fire the events the spec binds to the scheduler's ``call``, in order, until one ends
        the record; the last outcome."""
        for event in self.spec.calls[call]:
            outcome = self._fire(record, event)
            if outcome.ended:
                break
        return outcome

    def _new_lookups(self) -> None:
        """A new firing looks the tree up afresh (the module's essay: lookups last one firing)."""
        look = self._look
        look.anchor = look.span = None
        look.sibling = None

    def _fire_checked(
        self, record: Record, event: str, transition: Callable[[Record], Outcome]
    ) -> Outcome:
        model = self._oracle_models.get(record.request_id)
        if model is None or self._oracle is None:
            return transition(record)
        expected = self._oracle.trigger(model, event)
        outcome = transition(record)
        if expected != outcome.target:
            raise AssertionError(
                f"oracle disagreement on {record.request_id!r}: {outcome.source} "
                f"--{event}--> compiled {outcome.target!r}, transitions {expected!r}"
            )
        return outcome

    def _exit_leave_parked_fifo(self, record: Record) -> None:
        self._parked.pop(record.request_id, None)

    def _exit_disown_span(self, record: Record) -> None:
        self._disown(record, keep_pages=0)

    def _end(self, record: Record, reason: str) -> None:
        self._counts[reason] += 1
        if record.read_tokens:  # every read is settled here: spliced from, or wasted
            trimmed = 0 if record.plan_prefix is None else record.plan_prefix - record.matched_len
            self._books.settle(reason, record.read_tokens, record.spliced_tokens, trimmed)
        request_id = record.request_id
        del self._records[request_id]
        self._hits.pop(request_id, None)
        self._parked.pop(request_id, None)
        if record.op_id is not None:
            self._ops.pop(record.op_id, None)
        if self._oracle is not None:
            self._oracle.remove(self._oracle_models.pop(request_id))
        if reason == "filled":
            self._retries.forget(request_id)

    def _live(self, req_id: str, call: ApiCall) -> Record:
        """The live record a call is for, if the call's event (its last) is legal now."""
        event = self.spec.calls[call][-1]
        self._check_request_id(req_id)
        record = self._records.get(req_id)
        if record is None:
            raise LifecycleError(
                req_id, None, event, hint="issue it with prefetch_from_storage first"
            )
        if not self.machine.allows(record.state, event):
            raise LifecycleError(
                req_id, record.state, event, self.machine.legal_events(record.state)
            )
        return record

    def _check_open(self) -> None:
        """A call that may submit IO is refused, changing nothing, once the IO is closed."""
        io = self.io
        if isinstance(io, Closable) and io.closed:
            raise RuntimeError(
                "this pipeline's IO executor was closed (io.close()), so it can submit no "
                "more reads or copies; build a new BufferPipeline to go on"
            )

    def _on_completion(self, completion: Completion) -> None:
        record = self._ops.pop(completion.op_id, None)
        if record is None or record.op_id != completion.op_id:
            self._counts["stale_completions"] += 1
            return
        record.op_id = None
        record.arg_completion = completion
        self._fire(record, self.spec.completions[completion.kind])

    def _time_reads(self, drained: Sequence[Completion], running: Mapping[int, float]) -> None:
        """This rank's timed reads into the speeds: those that landed (their tokens and
        seconds) and the oldest one still running (a floor)."""
        speeds = self.speeds
        for completion in drained:
            seconds = completion.seconds
            if completion.kind == "read" and seconds is not None and completion.error is None:
                speeds.observe_load(completion.tokens, seconds)
        oldest = max(running, key=running.__getitem__, default=None)
        record = None if oldest is None else self._ops.get(oldest)
        if oldest is None or record is None:
            speeds.observe_running_read(0, 0.0)
        else:
            speeds.observe_running_read(record.plan_tokens, running[oldest])

    def _reads_running(self) -> dict[int, float]:
        """Seconds each read in flight has run, by op id (none where the IO does not time)."""
        return {} if self._times_reads is None else self._times_reads.reads_running()

    def _run_commits(self) -> None:
        for request_id in list(self._parked) if self._parked else ():
            record = self._records[request_id]
            self._call(record, "poll")
            if request_id in self._parked:
                break  # FIFO: a hit still parked is not overtaken by later parked ones
        while self._hits:
            request_id, _ = self._hits.popitem(last=False)
            self._call(self._records[request_id], "poll")

    def _submit(
        self,
        record: Record,
        kind: Literal["exists", "read", "load"],
        run: Run,
    ) -> None:
        op_id = next(self._op_ids)
        record.op_id = op_id
        self._ops[op_id] = record
        self.io.submit(IOOp(op_id, kind, run))

    # ================================================================== guards

    def _anchor_match(self, record: Record) -> PrefixMatch:
        look = self._look
        if look.anchor is None:
            prefix = record.tokens.prefix(record.matched_len)
            look.anchor = self.tree.match_prefix(prefix, *record.namespace)
        return look.anchor

    def _span_match(self, record: Record) -> PrefixMatch:
        look = self._look
        if look.span is None:
            look.span = self.tree.match_prefix(record.tokens, *record.namespace)
        return look.span

    def _guard_below_threshold(self, record: Record) -> bool:
        return record.span_tokens < self.config.prefetch_threshold or record.span_tokens == 0

    def _guard_root_prefix(self, record: Record) -> bool:
        return record.matched_len == 0

    def _guard_live_match_short(self, record: Record) -> bool:
        return self._anchor_match(record).length < record.matched_len

    def _guard_over_cap(self, record: Record) -> bool:
        return self.pinned_tokens + record.matched_len > self.cap

    def _guard_zero_pages(self, record: Record) -> bool:
        completion = record.arg_completion
        return completion is None or completion.error is not None or completion.tokens == 0

    def _guard_hit_below_threshold(self, record: Record) -> bool:
        assert record.arg_completion is not None
        return record.arg_completion.tokens < self.config.prefetch_threshold

    def _guard_device_covers_span(self, record: Record) -> bool:
        return self._span_match(record).length >= record.span_end

    def _read_digests(self, record: Record, tokens: int) -> Sequence[bytes]:
        return record.span_digests[: tokens // self.config.page_size]

    def _guard_span_inflight(self, record: Record) -> bool:
        if not self.config.dedup_inflight:
            return False
        digests = self._read_digests(record, record.plan_tokens)
        self._look.sibling = sibling = self._dedup.sibling_owning_head(record.request_id, digests)
        return sibling is not None

    def _guard_parked_ahead(self, record: Record) -> bool:
        return bool(self._parked)  # asked of hits not parked yet (the spec's rows)

    def _guard_load_slower_than_compute(self, record: Record) -> bool:
        # one rank reads its speeds as they are; ranks read what they agreed at the pass's start
        agreement = self._agreement
        estimate = self.speeds.estimate() if agreement is None else agreement.estimate
        # at issue the hit is not known yet: the whole span is what a read could bring
        return estimate.load_slower_than_compute(record.plan_tokens or record.span_tokens)

    def _guard_read_outlasts_compute(self, record: Record) -> bool:
        # each rank's reads run their own time: the ranks agreed at the pass's start which
        # reads every one of them found overdue
        agreement = self._agreement
        if agreement is not None:
            return record.op_id in agreement.overdue
        return _overdue(record, self.speeds.estimate(), self._reads_running())

    def _guard_span_oversize(self, record: Record) -> bool:
        # capacities, not room: the ranks of a tensor-parallel group share one config
        if self.host_pool.capacity < record.plan_tokens:
            return True
        aux_pool = self.host_aux_pool
        return aux_pool is not None and aux_pool.capacity < record.aux_tokens

    def _guard_host_short(self, record: Record) -> bool:
        # under TP the room is what every rank has (the slack agreed at the pass's start)
        slack, aux_slack = (0, 0) if self._agreement is None else self._agreement.host_slack
        if self.host_pool.available() + slack < record.plan_tokens:
            return True
        aux_pool = self.host_aux_pool
        return aux_pool is not None and aux_pool.available() + aux_slack < record.aux_tokens

    def _host_aux_available(self) -> int:
        return 0 if self.host_aux_pool is None else self.host_aux_pool.available()

    def _guard_read_empty(self, record: Record) -> bool:
        completion = record.arg_completion
        assert completion is not None
        return completion.error is not None or completion.tokens == 0 or not completion.aux_complete

    def _guard_copy_failed(self, record: Record) -> bool:
        completion = record.arg_completion
        assert completion is not None
        return completion.error is not None

    def _guard_prefix_shrank(self, record: Record) -> bool:
        return record.arg_prefix_len < record.matched_len

    def _guard_span_device_resident(self, record: Record) -> bool:
        return record.arg_prefix_len >= record.span_end

    def _guard_aux_cut(self, record: Record) -> bool:
        return record.aux_tokens > record.span_end - record.arg_prefix_len

    def _guard_trim_positive(self, record: Record) -> bool:
        return record.arg_prefix_len > record.matched_len

    def _guard_plan_stale(self, record: Record) -> bool:
        planned = record.plan_prefix
        given = record.arg_prefix_indices
        if planned is None or given.shape[0] != planned:
            return True
        match = self._span_match(record)
        if match.length != planned:
            return True
        live = match.device_indices
        return live is not given and not torch.equal(live, given)  # the very tensor: equal

    def _guard_device_short(self, record: Record) -> bool:
        assert record.plan_prefix is not None
        if self.device_pool.available() < record.span_end - record.plan_prefix:
            return True
        return self.aux_pool is not None and self.aux_pool.available() < record.aux_tokens

    def _guard_device_fits(self, record: Record) -> bool:
        return not self._guard_device_short(record)

    # ================================================================== effects

    def _pin(self, record: Record, node: Node, charged_tokens: int) -> None:
        self.tree.inc_lock_ref(node)
        self._hold_pin(record, node, charged_tokens)

    def _hold_pin(self, record: Record, node: Node | None, charged_tokens: int) -> None:
        """The books of the pin ``record`` holds from now (``None``: none), charged against the
        anchor-lock cap; the tree's lock counts are the caller's."""
        self.pinned_tokens += charged_tokens - record.pinned_tokens
        record.pinned_node = node
        record.pinned_tokens = charged_tokens

    def _effect_pin_anchor(self, record: Record) -> None:
        assert record.pinned_node is None
        self._pin(record, self._anchor_match(record).last_node, record.matched_len)

    def _effect_pin_if_possible(self, record: Record) -> None:
        """Only an unpinned, non-root anchor the commit's ``live_match_short`` found intact."""
        if record.pinned_node is not None or record.matched_len == 0:
            return
        anchor = self._look.anchor
        if anchor is None or self._guard_over_cap(record):
            return
        self._pin(record, anchor.last_node, record.matched_len)

    def _effect_unpin(self, record: Record) -> None:
        if record.pinned_node is None:
            return
        self.tree.dec_lock_ref(record.pinned_node)
        self._hold_pin(record, None, 0)

    def _effect_arm_retry(self, record: Record) -> None:
        if self._retries.arm(record.request_id, self.polls):
            self._counts["retries_armed"] += 1
        else:
            self._counts["retries_exhausted"] += 1

    def _effect_record_hit(self, record: Record) -> None:
        assert record.arg_completion is not None
        record.hit_tokens = hit = record.arg_completion.tokens
        # what the read will bring: fixed from here to the launch (the span changes at staging)
        record.plan_tokens = tokens = min(hit, record.span_tokens)
        window = self.config.sliding_window
        record.aux_tokens = 0 if window is None else min(window, tokens)
        self._hits[record.request_id] = None

    def _effect_enqueue_parked(self, record: Record) -> None:
        self._parked.setdefault(record.request_id, None)

    def _effect_alloc_bounce(self, record: Record) -> None:
        record.host_indices = self.host_pool.alloc_array(record.plan_tokens)
        if self.host_aux_pool is not None:
            record.host_aux_indices = self.host_aux_pool.alloc_array(record.aux_tokens)
        assert record.host_indices is not None

    def _effect_launch_read(self, record: Record) -> None:
        record.read_tokens = tokens = record.plan_tokens
        self._books.read(tokens)
        self._dedup.own(record.request_id, self._read_digests(record, tokens))
        assert record.host_indices is not None
        read = self.ops.read(
            record.span_keys,
            record.span_digests,
            tokens,
            record.host_indices,
            record.aux_tokens,
            record.host_aux_indices,
        )
        self._submit(record, "read", read)

    def _effect_wait_for_sibling(self, record: Record) -> None:
        sibling = self._look.sibling
        assert sibling is not None, "span_inflight found the sibling in this firing"
        self._dedup.wait(record.request_id, sibling)

    def _disown(self, record: Record, keep_pages: int) -> None:
        """Give up the record's page keys past ``keep_pages``; its waiters' retries fall due.

        Waiters are woken whenever the record's ownership shrinks: each re-issue decides again
        (a device hit after ``filled``, its own read after an abort, or waiting once more).
        """
        owned = record.span_digests[keep_pages : record.read_tokens // self.config.page_size]
        for waiter in self._dedup.disown(record.request_id, owned):
            self._retries.make_due(waiter, self.polls)

    def _effect_stage_read(self, record: Record) -> None:
        assert record.arg_completion is not None and record.host_indices is not None
        read = record.arg_completion.tokens
        unread = record.host_indices[read:]
        if len(unread):
            self.host_pool.free(unread)
        record.host_indices = record.host_indices[:read]
        if read < record.read_tokens:  # a short read owns only what it brought
            self._disown(record, keep_pages=read // self.config.page_size)
        record.span_end = record.matched_len + read
        record.tokens = record.tokens.prefix(record.span_end)  # a short read shortens the span

    def _effect_free_bounce(self, record: Record) -> None:
        if record.host_indices is not None:
            self.host_pool.free(record.host_indices)
            record.host_indices = None
        if record.host_aux_indices is not None and self.host_aux_pool is not None:
            self.host_aux_pool.free(record.host_aux_indices)
            record.host_aux_indices = None

    def _effect_record_plan(self, record: Record) -> None:
        record.plan_prefix = record.arg_prefix_len

    def _effect_alloc_device(self, record: Record) -> None:
        assert record.plan_prefix is not None
        slots = self.device_pool.alloc_array(record.span_end - record.plan_prefix)
        assert slots is not None
        record.device_slots = slots
        record.device_indices = torch.from_numpy(slots)

    def _effect_queue_h2d(self, record: Record) -> None:
        assert record.plan_prefix is not None and record.host_indices is not None
        assert record.device_slots is not None
        trim = record.plan_prefix - record.matched_len
        source = record.host_indices[trim:]
        target = record.device_slots
        aux_source = record.host_aux_indices
        aux_target = None
        if self.aux_pool is not None and aux_source is not None and len(aux_source):
            aux_target = self.aux_pool.alloc(len(aux_source))
            assert aux_target is not None
        record.aux_device_indices = aux_target
        self._submit(record, "load", self.ops.h2d(source, target, aux_source, aux_target))

    def _effect_insert_tail(self, record: Record) -> None:
        assert record.plan_prefix is not None and record.device_slots is not None
        splice_parent = self._look.span
        assert splice_parent is not None, "plan_stale matched the span in this firing"
        node = self.tree.insert_leaf(
            splice_parent.last_node,
            record.tokens,
            record.plan_prefix,
            torch.from_numpy(record.device_slots.copy()),  # the tree's own copy
            *record.namespace,
        )
        if record.aux_device_indices is not None:
            self.tree.attach_aux(node, record.aux_device_indices)
        record.spliced_node = node
        record.spliced_tokens = record.span_end - record.plan_prefix
        self._books.spliced(record.spliced_tokens, record.plan_prefix - record.matched_len)

    def _effect_move_pin(self, record: Record) -> None:
        node = record.spliced_node
        assert node is not None
        if record.pinned_node is None:
            self._pin(record, node, 0)
            return
        self.tree.move_lock_ref(record.pinned_node, node)  # the leaf hangs below the anchor
        self._hold_pin(record, node, 0)

    def _effect_evict_for_splice(self, record: Record) -> None:
        """Evict before allocating the tail, with the request's live prefix locked meanwhile."""
        assert record.plan_prefix is not None
        need = record.span_end - record.plan_prefix
        short = need - self.device_pool.available()
        aux_short = 0
        if self.aux_pool is not None:
            aux_short = record.aux_tokens - self.aux_pool.available()
        if short <= 0 and aux_short <= 0:
            return
        prefix = self.tree.match_prefix(
            record.tokens.prefix(record.plan_prefix), *record.namespace
        ).last_node
        with locked(self.tree, prefix):
            self.tree.evict(max(short, aux_short, 0))
            if self.aux_pool is not None:
                while self.aux_pool.available() < record.aux_tokens and self.tree.evict(1):
                    pass

    # ================================================================== argument checks

    @staticmethod
    def _check_request_id(req_id: object) -> None:
        if not isinstance(req_id, str):
            raise TypeError(f"req_id must be a str, got {type(req_id).__name__}")

    def _check_prefix_len(self, device_prefix_len: object) -> None:
        if not isinstance(device_prefix_len, int) or isinstance(device_prefix_len, bool):
            raise TypeError("device_prefix_len must be an int (len(req.prefix_indices))")
        if device_prefix_len < 0 or device_prefix_len % self.config.page_size:
            raise ValueError(
                f"device_prefix_len={device_prefix_len} must be a non-negative multiple of "
                f"page_size={self.config.page_size}"
            )


BufferPipeline.GUARDS = named_methods(BufferPipeline, "_guard_")
BufferPipeline.EFFECTS = named_methods(BufferPipeline, "_effect_")
BufferPipeline.EXITS = named_methods(BufferPipeline, "_exit_")


def _overdue(record: Record, estimate: SpeedEstimate, running: Mapping[int, float]) -> bool:
    """Whether ``record``'s read in flight has run longer than computing its tokens takes."""
    seconds = None if record.op_id is None else running.get(record.op_id)
    return seconds is not None and estimate.computes_sooner(record.read_tokens, seconds)


def _check_calls(spec: LifecycleSpec) -> None:
    """The pipeline makes every scheduler call: a spec must bind events to each."""
    missing = [call for call in get_args(ApiCall) if call not in spec.calls]
    if missing:
        raise IncompleteImplementation(
            f"the spec binds no events to the calls {', '.join(missing)}, which the pipeline "
            "makes; name them under 'calls'"
        )


def _check_engine(
    config: PipelineConfig, engine: EngineCache | None, tree_factory: TreeFactory | None
) -> None:
    """An engine's own cache replaces stagefate's tree and pools whole (checked first)."""
    if engine is None:
        return
    if tree_factory is not None:
        raise ValueError(
            "pass either engine= (the engine's prefix cache and pools) or tree_factory=, not "
            "both: the engine's cache brings its own tree"
        )
    if config.sliding_window is not None:
        raise ValueError(
            "sliding_window is not supported over an engine's own cache yet: the aux window "
            "needs the engine's SWA pool; set sliding_window=None"
        )
    host = engine.host_pool
    if host is not None and (host.layout != config.layout or host.capacity != config.host_tokens):
        raise ValueError(
            f"the engine's host pool is {host.capacity} slots of {host.layout}; the config "
            f"asks host_tokens={config.host_tokens} of {config.layout}: build it from the config"
        )


def _check_group(config: PipelineConfig, group: Group | None) -> None:
    """A rank's group matches its config (checked before anything is built)."""
    if group is None:
        if config.tp_size > 1:
            raise ValueError(
                f"tp_size={config.tp_size} needs a group the ranks agree through: pass "
                f"group=LocalGroup.create({config.tp_size})[rank] (one process) or TorchGroup() "
                "(torch.distributed initialised)"
            )
        return
    if group.size != config.tp_size:
        raise ValueError(
            f"the group has {group.size} ranks but tp_size={config.tp_size}: build the group "
            "with one rank per tensor-parallel rank"
        )
    if group.rank != config.tp_rank:
        raise ValueError(
            f"the group's rank is {group.rank} but tp_rank={config.tp_rank}: give each rank "
            "the config with its own tp_rank"
        )
