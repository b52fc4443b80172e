"""The connector's scheduler side: vLLM's calls as the spec's events, over vLLM's own cache.

Which vLLM call does what in the lifecycle (docs/vllm.md draws it):

* ``get_num_new_matched_tokens`` (a waiting request, its block-aligned local hit): the first
  call of an attempt issues the prefetch of the uncomputed tail (``prefetch_from_storage``: the
  lock re-matches the anchor in vLLM's prefix cache and pins its blocks) and waits, within
  what is left of the pass's ``l3_wait_s``, for L3's existence answer (a miss answers 0 at
  once: vLLM computes the request in this step) and for a hit's read (the pass's IO commits
  run at once; a span staged in time is offered now); it answers ``None`` ("ask again next
  step") while the prefetch is pending, including while it waits for a sibling that is
  reading its span's head (woken, it issues again, for the rest), and the hit once the span
  is staged in the bounce buffer (``staged_splice_tokens`` against the local hit vLLM has now,
  so a span vLLM computed meanwhile is trimmed, or declined when it covers it all): as a
  synchronous load by default (vLLM computes the request in the step that admits it), else
  with ``load_async=True``. An attempt that ended with nothing staged answers 0: vLLM
  computes.
* ``update_state_after_alloc`` (vLLM allocated the request's blocks): ``plan_staged_splice`` at
  the local hit, then ``init_load_back`` into exactly the blocks vLLM allocated for the
  external tokens (granted to the pipeline's device pool; for a synchronous load, hidden from
  the match while planned, since vLLM published them at allocation); the copy goes to the
  worker.
* ``build_connector_meta`` (once per step): ``poll()`` (IO completions, the IO commits), the
  loads and the write-through saves for the worker.
* ``update_connector_output`` (the worker's report: the synchronous loads it made, in its
  worker metadata, and the asynchronous ones finished): a load reported failed has its pages
  deleted from L3, so no request is offered them again until they are stored anew (under
  vLLM's ``recompute`` policy the request computes them and writes them through again); one
  made is acknowledged (its handle completes and ``poll()`` fires the ``ack``) once vLLM has
  published its blocks in the prefix cache (an asynchronous load's one schedule later), so a
  sibling always sees the span somewhere: owned by the loading record, or cached on the
  device.
* Speeds (unless ``stagefate.decline_slower_loads`` is false): a forward is timed from
  ``build_connector_meta`` to the ``update_connector_output`` after it, with the tokens the
  step scheduled (the pipeline times its L3 reads itself). The IO commit declines a span whose
  read would take longer than computing it (``load_slower_than_compute``), and vLLM computes
  it; a request whose read in flight has already run longer than computing its tokens takes
  stops waiting for it (``give_up_slow_read``, asked each step before answering "not yet") and
  vLLM computes those tokens too: what an L3 that turns out slow costs a request is bounded
  by about twice its compute time.
* ``request_finished`` (finished or aborted): ``release_aborted_request``; a load in flight
  ends when the worker reports it, and vLLM holds the blocks until then.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...runtime.engine import EngineCache, GrantedSlots, SharedHostPool
from ...runtime.hashing import Namespace, page_hashes, rank_storage_keys
from ...runtime.io import ThreadedIO
from ...runtime.storage import KnowsWrites, Storage
from ...statemachine.pipeline import BufferPipeline
from ...statemachine.record import TransitionEvent
from ...transition_log import TransitionLog
from .prefix_cache import VllmPrefixCache, block_slots, namespace_of_request
from .transfer import (
    HandedLoads,
    LoadHandle,
    LoadOrder,
    SaveOrder,
    StagefateMetadata,
    SynchronousLoadsMade,
)

IDLE_STEP_WAIT_S = 0.005
"""The longest a step with no forward waits for the IO threads: CPython's switch interval, the
time a spinning thread holds the GIL before it must hand it over (docs/vllm.md, "Where a
load's time goes"). 1 ms measured the same."""


@dataclass(frozen=True)
class _Load:
    handle: LoadHandle
    keys: list[str]
    """The L3 keys the load carries (deleted if it fails: never offered again)."""
    block_ids: list[int]
    start: int
    """The token the load begins at (a failed load is recomputed, and saved again, from it)."""


@dataclass
class _Request:
    """What the scheduler side keeps of a live vLLM request."""

    request: Any
    namespace: Namespace
    saved: int = 0
    """Tokens of the request already in L3 (computed by it and stored, or loaded or cached)."""
    attempt_open: bool = False
    """An attempt began at a get_num_new_matched_tokens and the request was not admitted yet."""
    attempt_local: int = 0
    """vLLM's local hit the open attempt was planned from."""
    waiting: bool = False
    """Declined while a sibling reads its span's head (``declined_inflight``): woken, it
    issues again for the rest."""
    offered: tuple[int, int] | None = None
    """(local hit, tokens) of the last hit answered to vLLM."""
    scheduled: bool = False
    """vLLM scheduled it (what it had computed before then was stored by whoever computed it)."""
    chain: tuple[int, bytes] | None = None
    """(pages, the page key of the last): where the stored pages' key chain stands, so the next
    save hashes only its new pages."""


class SchedulerSide:
    """The connector on vLLM's scheduler: answers vLLM's questions from the lifecycle
    (``get_num_new_matched_tokens``, ``update_state_after_alloc``, ...) and hands the worker
    what to load and save in each step's metadata."""

    def __init__(
        self,
        pipeline: BufferPipeline,
        cache: VllmPrefixCache,
        granted: GrantedSlots,
        loads: HandedLoads,
        io: ThreadedIO,
        storage: Storage,
        write_through: bool,
        log: TransitionLog | None,
        measure_speeds: bool = True,
        l3_wait_s: float = 0.0,
        synchronous_loads: bool = False,
    ) -> None:
        self.pipeline, self.cache, self.granted, self.loads = pipeline, cache, granted, loads
        self.io = io
        self.storage, self.write_through, self.log = storage, write_through, log
        self._remembered_writes = storage if isinstance(storage, KnowsWrites) else None
        """The store, where it knows what it holds cheaply: a save skips those blocks."""
        self.block_size = cache.page_size
        self._hold = pipeline.spec.group("hold")
        self._pending = pipeline.spec.group("pending")
        self.requests: dict[str, _Request] = {}
        self.kv_cache_manager: Any = None
        self.in_flight: dict[str, _Load] = {}
        """Request -> its load handed to the worker (until the worker reports it)."""
        self.landed: dict[str, _Load] = {}
        """Request -> its load the worker reported, until vLLM publishes the blocks."""
        self._outbox: list[LoadOrder] = []
        self._unloadable: dict[str, list[int]] = {}
        self._unloadable_blocks: list[int] = []
        self._storage_key, _ = rank_storage_keys(0, 1)
        self.load_errors = 0
        self.measure_speeds = measure_speeds
        self._forward: tuple[float, int] | None = None
        """(when, tokens) of the step whose forward runs now, when speeds are measured."""
        self.l3_wait_s = l3_wait_s
        self._l3_wait_left = l3_wait_s
        """What this scheduling pass may still wait for L3 (answers and reads)."""
        self.queries = 0
        """Existence queries issued from ``get_num_new_matched_tokens``."""
        self.queries_answered_in_pass = 0
        """Those answered (and acted on) in the pass that issued them."""
        self.staged_in_pass = 0
        """Hits whose read landed in the pass that asked about them (loaded into its step)."""
        self.synchronous_loads = synchronous_loads
        pipeline.instruments.append(self._note_sibling_waits)

    @classmethod
    def build(
        cls,
        pipeline_config: Any,
        cache: VllmPrefixCache,
        storage: Storage,
        host_pool: SharedHostPool,
        write_through: bool,
        log: TransitionLog | None,
        measure_speeds: bool = True,
        l3_wait_s: float = 0.0,
        synchronous_loads: bool = False,
    ) -> SchedulerSide:
        granted = GrantedSlots(pipeline_config.layout, host_pool.device)
        loads = HandedLoads()
        engine = EngineCache(lambda _page, _device, _aux: cache, granted, host_pool, loads)
        io = ThreadedIO(pipeline_config.io_workers)
        pipeline = BufferPipeline(pipeline_config, storage=storage, io=io, engine=engine)
        if log is not None:
            pipeline.instruments.append(log)
        return cls(
            pipeline,
            cache,
            granted,
            loads,
            io,
            storage,
            write_through,
            log,
            measure_speeds,
            l3_wait_s,
            synchronous_loads,
        )

    # ------------------------------------------------------------------ vLLM's calls

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        rid = request.request_id
        kept = self.requests.get(rid)
        if kept is None:
            kept = self.requests[rid] = _Request(request, namespace_of_request(request))
        pipe = self.pipeline
        state = pipe.state(rid)
        if state is None:
            if pipe.prefetch_pending(rid):  # on a sibling reading this span's head
                return None, False  # (marked waiting when declined: _note_sibling_waits)
            # woken: the sibling's ownership shrank (its head is on the device, or it ended),
            # so this request issues again, for the rest
            woken = kept.waiting and bool(pipe.due_retries([rid]))
            kept.waiting = False
            # the device lost part of the prefix the attempt was planned from while the request
            # queued (evicted by the requests admitted before it): L3 may hold what it lost, so
            # the paced retry the attempt armed re-issues (SGLang re-queries at admission too)
            shrank = num_computed_tokens < kept.attempt_local
            if kept.attempt_open and not woken and not (shrank and pipe.due_retries([rid])):
                return 0, False  # this attempt ended with nothing staged: vLLM computes
            kept.attempt_open, kept.attempt_local = True, num_computed_tokens
            # vLLM's local hit stops a token short of the prompt (it computes at least the
            # last one), so the span stops there too: the plan then compares like with like
            # (a span ending a block later would find the live match one block past the
            # local hit vLLM planned from, and drop a splice vLLM already allocated for)
            tokens = list(request.all_token_ids[: request.num_tokens - 1])
            pipe.prefetch_from_storage(rid, tokens, num_computed_tokens, *kept.namespace)
            state = self._settled_in_this_pass(rid)
        # pending (its read in flight, or declined now for a sibling's read): not yet; but a
        # read that has run longer than computing takes can only lose: vLLM computes
        if pipe.prefetch_pending(rid) and not pipe.give_up_slow_read(rid):
            return None, False
        if state in self._hold:
            splice = pipe.staged_splice_tokens(rid, num_computed_tokens)
            if splice == 0:  # the plan would free it (vLLM computed the span meanwhile)
                pipe.plan_staged_splice(rid, num_computed_tokens)
                return 0, False
            kept.offered = (num_computed_tokens, splice)
            return splice, not self.synchronous_loads
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        rid = request.request_id
        kept = self.requests.get(rid)
        if kept is None:
            return
        kept.attempt_open = False
        if num_external_tokens == 0:
            # admitted without the hold (nothing offered, or vLLM kept a local partial block)
            self.pipeline.release_staged_hold(rid)
            return
        assert kept.offered is not None, "vLLM loads only what get_num_new_matched_tokens offered"
        local, offered = kept.offered
        kept.offered = None
        size = self.block_size
        block_ids: list[int] = blocks.get_block_ids()[0]
        tail_ids = block_ids[local // size : (local + num_external_tokens) // size]
        synchronous = self.synchronous_loads
        slots = None
        with self.cache.loading_into(tail_ids if synchronous else ()):
            kv, _ = self.pipeline.plan_staged_splice(rid, local)
            if kv == num_external_tokens == offered:
                record = self.pipeline.live_records[rid]
                first_page = (local - record.matched_len) // size
                keys = list(record.span_keys[first_page : first_page + len(tail_ids)])
                self.granted.grant(block_slots(tail_ids, size))
                try:
                    slots = self.pipeline.init_load_back(
                        rid, block_slots(block_ids[: local // size], size)
                    )
                finally:
                    self.granted.revoke()
            else:
                self.pipeline.release_staged_hold(rid)
        if slots is None or not len(slots):  # vLLM expects a load: it fails, vLLM recovers
            if synchronous:
                self._unloadable_blocks += tail_ids
            else:
                self._unloadable[rid] = tail_ids
            return
        load = self.loads.claim()
        self.in_flight[rid] = _Load(load.handle, keys, tail_ids, local)
        self._outbox.append(LoadOrder(rid, load.host_slots, tail_ids, synchronous))
        kept.saved = max(kept.saved, local + num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> StagefateMetadata:
        self._ack_published()
        if not scheduler_output.total_num_scheduled_tokens:
            # a step with no forward: vLLM steps again at once, and a scheduler that spins keeps
            # the IO threads from the GIL; waiting for their next completion lets them run
            self.io.wait(IDLE_STEP_WAIT_S)
        self.pipeline.poll()
        tokens = scheduler_output.total_num_scheduled_tokens
        if self.measure_speeds and tokens:
            self._forward = (time.perf_counter(), tokens)
        self._l3_wait_left = self.l3_wait_s  # the next pass's
        meta = StagefateMetadata(
            self._outbox, self._saves(scheduler_output), self._unloadable, self._unloadable_blocks
        )
        self._outbox, self._unloadable, self._unloadable_blocks = [], {}, []
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        if self._forward is not None:  # the forward of the step built last has run
            started, tokens = self._forward
            self.pipeline.speeds.observe_forward(tokens, time.perf_counter() - started)
            self._forward = None
        failed = set(connector_output.invalid_block_ids or ())
        # the worker made the step's synchronous loads before its forward, and reports an
        # asynchronous one once its copy is done
        made = connector_output.kv_connector_worker_meta
        made = made.request_ids if isinstance(made, SynchronousLoadsMade) else ()
        for rid in [*made, *(connector_output.finished_recving or ())]:
            load = self.in_flight.pop(rid, None)
            if load is None:
                continue
            if failed.intersection(load.block_ids):
                self.load_errors += 1
                self.storage.delete(load.keys)  # never offered again: the next query misses
                kept = self.requests.get(rid)
                if kept is not None:  # under `recompute` vLLM computes them: store them again
                    kept.saved = min(kept.saved, load.start)
                # the record ends load_failed, not filled (the spec's failed ack)
                load.handle.finish(error="vLLM's worker reported the load failed")
            else:
                self.landed[rid] = load
        self._ack_published()
        self.pipeline.poll()

    def request_finished(self, request: Any) -> None:
        rid = request.request_id
        self.pipeline.release_aborted_request(rid)
        self.requests.pop(rid, None)

    def close(self) -> None:
        self.pipeline.io.close()
        if self.log is not None:
            self.log.close()

    # ------------------------------------------------------------------ helpers

    def _note_sibling_waits(self, event: TransitionEvent) -> None:
        """A request declined because a sibling reads its span's head waits for that sibling,
        whichever call ended it (a poll at the pass's end included): woken, it issues again for
        the rest. Without this, one declined at a pass's end and woken before vLLM asked it
        again took its attempt for ended and computed what L3 held."""
        if event.outcome.reason == "declined_inflight":
            kept = self.requests.get(event.request_id)
            if kept is not None:
                kept.waiting = True

    def _settled_in_this_pass(self, rid: str) -> str | None:
        """The request's state once L3 has done what it can for it within what is left of the
        pass's ``l3_wait_s``: its existence answer (a miss ends now, and vLLM computes the
        request in this step) and, for a hit, its read (the pass's IO commits run at once, and
        a span staged now is loaded into this step)."""
        pipe = self.pipeline
        if not pipe.storage_query_pending(rid):
            return pipe.state(rid)  # it ended at the issue: L3 was not asked
        self.queries += 1
        self._wait_in_pass(lambda: pipe.storage_query_pending(rid))
        if pipe.storage_query_pending(rid):
            return pipe.state(rid)
        self.queries_answered_in_pass += 1
        if pipe.prefetch_pending(rid) and self._l3_wait_left > 0:
            pipe.poll()  # the IO commits: this hit's read starts now, or it is declined
            # (until the record leaves pending: one that ends waiting on a sibling is not
            # waited for here, and is told "not yet")
            self._wait_in_pass(lambda: pipe.state(rid) in self._pending)
            self.staged_in_pass += pipe.has_hold(rid)
        return pipe.state(rid)

    def _wait_in_pass(self, waiting: Callable[[], bool]) -> None:
        """Fire IO completions as they land while ``waiting()`` and the pass's wait lasts."""
        while waiting() and self._l3_wait_left > 0:
            started = time.perf_counter()
            landed = self.io.wait(self._l3_wait_left)
            self._l3_wait_left -= time.perf_counter() - started
            if not landed:
                return
            self.pipeline.fire_completions()

    def _ack_published(self) -> None:
        """A landed load is acknowledged once vLLM published its blocks in the prefix cache
        (the splice is then visible to every re-match, as a tree insert is), or its request
        finished (vLLM frees them unpublished)."""
        blocks = self.cache.pool.blocks if self.landed else ()
        for rid, load in list(self.landed.items()):
            published = all(blocks[b].block_hash is not None for b in load.block_ids)
            if published or rid not in self.requests:
                load.handle.finish()
                del self.landed[rid]

    def _saves(self, scheduler_output: Any) -> list[SaveOrder]:
        """Every full block a scheduled request computes this step and L3 lacks (past those a
        store that knows its writes holds already, from the first)."""
        if not self.write_through or self.kv_cache_manager is None:
            return []
        orders = []
        size = self.block_size
        for rid, scheduled in scheduler_output.num_scheduled_tokens.items():
            kept = self.requests.get(rid)
            if kept is None:
                continue
            kept.attempt_open = False
            request = kept.request
            if not kept.scheduled:
                kept.scheduled = True
                kept.saved = max(kept.saved, request.num_computed_tokens)
            end = min(request.num_computed_tokens + scheduled, len(request.all_token_ids))
            end -= end % size
            if end <= kept.saved:
                continue
            first = kept.saved // size
            if kept.chain is not None and kept.chain[0] == first:
                new = list(request.all_token_ids[first * size : end])
                digests = page_hashes(new, size, kept.namespace, seed=kept.chain[1])
            else:  # the chain starts here (or the saved mark moved past it): hash it whole
                digests = page_hashes(list(request.all_token_ids[:end]), size, kept.namespace)
                digests = digests[first:]
            kept.chain = (end // size, digests[-1])
            block_ids = self.kv_cache_manager.get_block_ids(rid)[0][first : end // size]
            keys = [self._storage_key(d) for d in digests[: len(block_ids)]]
            # a request that computed what L3 holds (declined, or given up) stores only the rest
            writes = self._remembered_writes
            held = 0 if writes is None else writes.written_prefix(keys)
            if held < len(keys):
                orders.append(SaveOrder(keys[held:], block_ids[held : len(keys)]))
            kept.saved = end
        return orders
