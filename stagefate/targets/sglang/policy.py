"""``stagefate replay --policy sglang``: SGLang's buffer-mode pipeline inside the replay.

Theory of operation
-------------------
The engine's tree *is* the consumer cache of a :class:`~.pipeline_driver.SteppedSGLang` (seen
through the :class:`~stagefate.integrations.sglang.tree.SGLangTree` adapter), and the engine's
device pool is the stagefate pool that SGLang's allocator draws from and frees into. So the engine's
inserts, locks and evictions and SGLang's own load-backs act on one tree and one pool, and the
engine, trace, cost model and IO clock are the ones ``live`` and ``blind`` run on. The release
is the one this interpreter imports (another runs in its own environment's process,
:mod:`.worker`); the calls below are its scheduler's, in its order (``scheduler.py``), spelled
as its API generation spells them (:mod:`.generations`):

* **issue** (arrival, or a due retry): ``prefetch_from_storage`` re-anchored on the deepest
  device node, with the ``storage_hit_end`` the retry book handed back;
* **each scheduling pass** (:meth:`SGLangPolicy.poll`): ``check_hicache_events`` (parked hits,
  IO commits, acks, write staging), then the backup thread's body (writes to L3);
* **retries**: SGLang's own pacing over the waiting queue, with the release's defaults:
  0.5.20's ``StoragePrefetchRetries.pop_ready`` (a paced retry every 8 passes, 8 attempts; the
  head's paced retry is cancelled), 0.5.19's ``Scheduler._retry_missed_storage_prefetches``
  (off by default: poll interval 0);
* **admission**: ``check_prefetch_progress``, ``pop_prefetch_loaded_tokens``, the plan
  (``prepare_staged_prefetch``; 0.5.19: ``plan_staged_splice``), then the engine evicts for
  what the plan loads, then
  ``init_load_back`` under the prefix lock and ``ready_to_load_host_cache``;
* **a prefetch the engine stops waiting for** (``timeout`` expired, ``best_effort``): SGLang's
  own deadline path (its wall-clock deadline is off; the replay's clock expires the wait);
* **write-through**: ``request_buffer_backup`` of the finished prompt's node (up to 0.5.21
  the insert queues the write itself); SGLang stages and writes it in the following passes (live
  writes at once: L3 sees SGLang's writes a pass or two later).

IO on the replay's clock. SGLang's storage threads are stopped; :class:`SGLangIO` shows the
existence queries waiting in ``prefetch_queue`` and the reads waiting in ``prefetch_buffer`` as
operations. Completing one runs its thread body with only that operation in the queue (the
others go back after it, in order), and a read's acks through the sync thread's body; the next
pass drains them. H2D copies happen at ``ready_to_load_host_cache``; the engine charges their
time in the step, as for the other policies.

The books. A read's tokens are what its acks say it read (a read SGLang terminated before it
ran reads nothing and is not an L3 read). At admission the loaded tokens are spliced and the rest
of that read is wasted as ``trimmed`` (its head was on the device by then); a staged hold SGLang
releases (``release_staged_hold``) wastes its whole read under SGLang's reason. Anything a
request still holds once it is admitted is released through ``release_aborted_request``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from queue import Queue
from typing import Any

import torch

from ...integrations.sglang.tree import SGLangTree
from ...runtime.io import OpKind
from ...runtime.pools import DevicePool, KVLayout
from ...runtime.prefix_tree import PrefixMatch
from ...runtime.storage import ReportsDamage
from ...runtime.tokens import TokenKey
from ...sim.policy import LastSplice, MakeRoom, PolicyInputs
from ...sim.prefetches import declined_and_revoked
from ...statemachine.books import ReadBooks
from ...transition_log import TransitionLog
from .design_log import design_path, watch_design
from .generations import stepped_sglang
from .pipeline_driver import SteppedSGLang
from .shared_l3 import attach

_EMPTY = torch.empty(0, dtype=torch.int64)
RELEASE_REASONS: dict[str | None, str] = {None: "aborted"}
"""SGLang's ``release_staged_hold`` reasons in the replay's words (the rest keep SGLang's:
``device_covered``, ``shrunk``, ``device_capacity``)."""


class SGLangIO:
    """ManualIO's face over SGLang's storage queues (see the module's theory of operation)."""

    def __init__(self, driver: SteppedSGLang) -> None:
        controller = driver.consumer.cache.cache_controller
        self.driver = driver
        self.page = driver.page_size
        self._queues: dict[OpKind, Queue[Any]] = {
            "exists": controller.prefetch_queue,
            "read": controller.prefetch_buffer,
        }
        self._acks: Queue[Any] = controller.ack_prefetch_queue
        self._ops: dict[int, tuple[OpKind, Any]] = {}
        self._ids: dict[tuple[OpKind, int], int] = {}  # (kind, id(operation)) -> op id
        self._next_id = 0
        self.reads: list[tuple[str, int, list[str]]] = []
        """``(rid, tokens read, keys of the pages read)`` of each read completed since the
        policy last looked."""

    def queued(self, kind: OpKind | None = None) -> list[int]:
        """Ids of the operations waiting in SGLang's queues (of one kind), oldest first."""
        ids = []
        for queue_kind, work in self._queues.items():
            if kind is not None and kind != queue_kind:
                continue
            for operation in work.queue:
                if operation is None:  # a thread's stop sentinel
                    continue
                key = (queue_kind, id(operation))
                if key not in self._ids:
                    self._next_id += 1
                    self._ids[key] = self._next_id
                    self._ops[self._next_id] = (queue_kind, operation)
                ids.append(self._ids[key])
        return ids

    def pending(self) -> int:
        return sum(op is not None for work in self._queues.values() for op in work.queue)

    def tokens(self, op_id: int) -> int:
        """Tokens an operation moves: the span a query asks about, the pages a read fetches."""
        kind, operation = self._ops[op_id]
        if kind == "exists":
            return len(operation.token_ids)
        return len(operation.hash_value) * self.page

    def complete(self, op_id: int) -> None:
        """Run the thread body for this one operation now."""
        kind, operation = self._ops.pop(op_id)
        del self._ids[(kind, id(operation))]
        work = self._queues[kind]
        others = [item for item in work.queue if item is not operation]
        if len(others) == len(work.queue):
            return  # SGLang took it out of its queue itself
        work.queue.clear()
        work.queue.append(operation)
        try:
            if kind == "exists":
                self.driver.run_existence_queries()
            else:
                self.driver.run_reads()
        finally:
            work.queue.extend(others)
        if kind == "read":
            read = max(
                (
                    ack.completed_tokens or 0
                    for ack in self._acks.queue
                    if ack.operation is operation
                ),
                default=0,
            )
            self.reads.append(
                (operation.request_id, read, operation.hash_value[: read // self.page])
            )


class SGLangPolicy(LastSplice):
    name = "sglang"

    def __init__(self, inputs: PolicyInputs) -> None:
        config = inputs.config
        if config.storage != "memory" and inputs.storage is None:
            raise ValueError(
                "the sglang policy reads SGLang's own file backend (a temporary directory), not "
                f"{config.storage!r}: drop --storage, or replay --policy live/blind with it"
            )
        core = "rust" if inputs.tree == "sglang-rust" else "python"
        layout = KVLayout(config.layers, config.kv_heads, config.head_dim)
        self.device_pool = DevicePool(layout, config.device_tokens, "cpu")
        self.driver = stepped_sglang(
            page_size=config.page_size,
            device_tokens=config.device_tokens,
            core=core,
            host_tokens=config.host_tokens,
            prefetch_threshold=config.prefetch_threshold,
            prefetch_policy=inputs.prefetch_policy,
            max_context_len=config.max_context_len,
            device_pool=self.device_pool,
        )
        consumer = self.driver.consumer
        self.cache = consumer.cache
        self.shared_storage = inputs.storage
        if inputs.storage is not None:  # an L3 shared with other instances
            attach(self.cache, inputs.storage)
        self.tree = SGLangTree(consumer.cache, consumer.allocator, self.device_pool)
        self.io = SGLangIO(self.driver)
        self._hit_end: dict[str, int | None] = {}
        self._unsettled: dict[str, list[tuple[int, list[str]]]] = {}
        """``(tokens, page keys)`` of each request's reads not yet spliced or wasted."""
        self._admitted: set[str] = set()
        self.books = ReadBooks()
        self._watch_released_holds()

    def _watch_released_holds(self) -> None:
        """Book a hold SGLang releases under its reason. Where a release decides the reason
        but does not pass it to ``release_staged_hold``, the deciding call names it for the
        release it makes: 0.5.20 and 0.5.21 release a device-covered hold from
        ``_resolve_device_covered`` with no reason; 0.5.19's ``plan_staged_splice`` releases a
        hold that can no longer splice with none, for one of the two cases of its
        ``staged_splice_tokens`` (aux windows, the third, do not exist on this FULL-only
        cache), named as the later releases name them."""
        pipeline = self.cache.buffer_pipeline
        release = pipeline.release_staged_hold
        decided: dict[str, str] = {}

        def watched(request: Any, reason: str | None = None) -> bool:
            released = bool(release(request) if reason is None else release(request, reason))
            if released:
                rid = getattr(request, "rid", request)
                reason = reason or decided.get(rid)
                self._settle(rid, 0, RELEASE_REASONS.get(reason, reason or "released"))
            return released

        def naming(decide: Any, reason_of: Any) -> Any:
            def named(*args: Any) -> Any:
                rid, reason = reason_of(*args)
                if reason is not None:
                    decided[rid] = reason
                try:
                    return decide(*args)
                finally:
                    decided.pop(rid, None)

            return named

        def unsplicable(rid: str, device_prefix_len: int) -> tuple[str, str | None]:
            staged = pipeline.staged_prefetches.get(rid)
            if staged is None:
                return rid, None
            return rid, "shrunk" if device_prefix_len < staged.matched_len else "device_covered"

        pipeline.release_staged_hold = watched
        if hasattr(pipeline, "plan_staged_splice"):  # 0.5.19
            pipeline.plan_staged_splice = naming(pipeline.plan_staged_splice, unsplicable)
        if hasattr(pipeline, "_resolve_device_covered"):  # 0.5.20 on (0.5.22 on pass it too)
            pipeline._resolve_device_covered = naming(
                pipeline._resolve_device_covered,
                lambda req, *rest: (req.cache_request_handle.rid, "device_covered"),
            )

    # ------------------------------------------------------------------ the books

    def _take_reads(self) -> None:
        for rid, tokens, keys in self.io.reads:
            if not tokens:
                continue
            self.books.read(tokens)
            self._unsettled.setdefault(rid, []).append((tokens, keys))
            if rid in self._admitted:  # it landed after its request was let go
                self._settle(rid, 0, "aborted")
        self.io.reads.clear()

    def _settle(self, rid: str, spliced: int, reason: str) -> None:
        """The request's unsettled reads end: the last one gave ``spliced`` tokens (its rest
        was trimmed), the others are wasted under ``reason``."""
        reads = self._unsettled.pop(rid, [])
        if spliced:
            last, keys = reads.pop()
            self.books.spliced(spliced, last - spliced)
            self.books.waste("trimmed", 0, last - spliced)
            self.last_splice = (rid, keys[len(keys) - spliced // self.io.page :])  # the tail
        for tokens, _keys in reads:
            self.books.waste(reason, 1, tokens)

    # ------------------------------------------------------------------ the scheduler's calls

    def write_through(self, key: TokenKey, device_indices: torch.Tensor) -> None:
        node = self.tree.match_prefix(key).last_node
        self.driver.request_backup(self.driver.consumer, node.node_id)

    def issue(self, request_id: str, key: TokenKey, matched_len: int) -> None:
        hit_end = self._hit_end.pop(request_id, None)
        self.driver.issue(request_id, key.tolist(), None, storage_hit_end=hit_end)

    def op_tokens(self, op_id: int) -> int:
        return self.io.tokens(op_id)

    def poll(self) -> None:
        self.driver.tick()
        self.driver.run_backups()
        self._take_reads()

    def pending(self, request_id: str) -> bool:
        request = self.driver.requests.get(request_id)
        return request is not None and request.handle in self.cache.ongoing_prefetch

    def terminate(self, request_id: str) -> None:
        self.driver.expire_wait(request_id)

    def admit(self, request_id: str, prefix: PrefixMatch, make_room: MakeRoom) -> torch.Tensor:
        request = self.driver.requests.get(request_id)
        if request is None:
            return _EMPTY
        loaded = self.driver.admit(request_id, lambda tokens: make_room(tokens, prefix.last_node))
        self._take_reads()
        self._admitted.add(request_id)
        if loaded:
            self._settle(request_id, loaded, "released")
        # what it still holds (a hold deferred for device room, a read still landing) goes
        self.cache.release_aborted_request(request.handle)
        self._settle(request_id, 0, "released")
        if not loaded:
            return _EMPTY
        span = request.tokens[: prefix.length + loaded]  # the tokens it was issued with
        return self.tree.match_prefix(span).device_indices[prefix.length :]

    def log_transitions(self, log: TransitionLog) -> Path:
        """SGLang's decisions, in its design's words, to ``log`` (:mod:`.design_log`); the
        design's spec."""
        watch_design(self.driver, log)
        return design_path(self.driver.consumer.cache.buffer_pipeline)

    def due_retries(self, waiting: Sequence[str]) -> list[str]:
        due = self.driver.due_retries(waiting)
        self._hit_end.update(due)
        return [rid for rid, _ in due]

    def counters(self) -> dict[str, int]:
        stats = self.cache._prefetch_outcome_stats
        return {
            **self.books.replay_counters(),
            "declined_anchor_lost": int(stats["declined_anchor_lost"]),
            "declined_device_covered": int(stats["declined_device_covered"]),
        }

    def wasted_by_reason(self) -> dict[str, tuple[int, int]]:
        return self.books.wasted_by_reason()

    def declines(self) -> dict[str, int]:
        return declined_and_revoked(self.cache._prefetch_outcome_stats)

    def l3_damage(self) -> str:
        """The damage a shared L3 found (SGLang's own file backend keeps no such count)."""
        shared = self.shared_storage
        return shared.damage_report() if isinstance(shared, ReportsDamage) else ""

    def finish(self) -> None:
        """The last writes land and their staging is freed; then SGLang's L3 directory goes."""
        self.driver.settle()
        self._take_reads()
        self.driver.close()
