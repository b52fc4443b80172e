"""SGLang's buffer-mode pipeline (any release of :mod:`.releases`), stepped on the caller's thread.

Theory of operation
-------------------
Two ``UnifiedRadixCache`` instances share one L3 directory (SGLang's ``file`` backend): a
*producer* that inserts token sequences and writes them through to L3, and the *consumer* whose
``BufferModePipeline`` is under test. Both are built as SGLang's scheduler builds them
(``init_hicache`` with ``hicache_host_memory_mode="buffer_only"``, the ``direct`` IO backend with
the ``layer_first`` layout, the ``wait_complete`` prefetch policy), with the two CPU patches of
:mod:`.shim`.

SGLang runs its storage work on four controller threads. They are stopped right after
construction, and each body is run here, on the caller's thread, when the driver is told to:
:meth:`run_existence_queries` (the prefetch thread: L3 existence queries), :meth:`run_reads`
(the IO thread and the sync thread: L3 reads into the bounce, their acks) and :meth:`run_backups`
(the backup thread: writes to L3). A body runs until its input queue is empty: its
``storage_stop_event`` is swapped for one that reads "set" exactly then. :meth:`tick` is one
scheduler pass (``check_hicache_events``: parked hits, IO commits, acks). So every interleaving
of scheduler passes, IO completions, evictions and publishes is chosen by the caller, and a run
is deterministic.

The scheduler's calls are made in the scheduler's order (``scheduler.py``/``schedule_policy.py``):
issue re-anchors on the deepest device node and calls ``prefetch_from_storage``; admission calls
``check_prefetch_progress``, ``pop_prefetch_loaded_tokens``, the generation's plan (0.5.19:
``plan_staged_splice``; 0.5.20 and later: ``prepare_staged_prefetch``) and ``init_load_back``
with the request's prefix locked, then ``ready_to_load_host_cache``; a later tick finishes the
load. The ``Req`` admission needs is SGLang's own class. This module is the part both API
generations share; :mod:`.generations` holds what each does differently, and
:func:`~.generations.stepped_sglang` builds the one of the release installed.

Every KV value written is a *mark* (the fuzz world's :func:`~stagefate.fuzz.world.mark`: token
id plus 1000 per namespace, exact in float16 below 2048), by the producer and by a sibling
publishing on the consumer, so any device slot can be checked against the tokens the tree says
it holds.
"""

from __future__ import annotations

import json
import math
import queue
import shutil
import tempfile
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch

from ...fuzz.world import mark
from ...integrations.sglang.tree import device_prefix_indices, device_prefix_len
from ...runtime.pools import SlotPool
from . import require, shim
from .cache import pool_bridge_class, tiny_kv_pool, unified_cache
from .hit_accounting import WorldLoads, keeps_hit_metrics
from .hybrid import (
    SlidingWindow,
    allocate,
    device_allocator,
    full_allocator,
    is_hybrid,
    kv_buffers,
    swa_peers,
    write,
)
from .releases import Release
from .slot_owners import slot_problems


def _mark(tokens: Sequence[int], namespace: str | None) -> torch.Tensor:
    """The KV every slot of ``tokens`` holds under ``namespace``: the fuzz world's mark, in
    the float16 of SGLang's tiny KV pool."""
    return mark(tokens, namespace, torch.float16)


SETTLE_ROUNDS = 200
"""The most scheduler rounds quiescence waits for the pipeline to idle: far beyond what a fuzz
program's work needs (a hundred moves), so a pipeline still busy then is stuck."""


class Undeployable(ValueError):
    """SGLang refuses to start with these settings (its own validation, as at server start: a
    combination a campaign draws, such as an SWA staging pool below two windows)."""


class _SetWhenEmpty:
    """Stands in for a controller's ``storage_stop_event``: "set" once ``queue`` is empty, so a
    thread body run on the caller's thread drains its input and returns."""

    def __init__(self, work: queue.Queue[Any]) -> None:
        self.work = work

    def is_set(self) -> bool:
        return self.work.empty()


def retry_settings() -> tuple[int, int]:
    """SGLang's ``hicache_storage_prefetch_retry_poll_interval`` and ``..._max_attempts`` (0.5.19:
    0 and 4, the retry off; 0.5.20 on: 8 and 8)."""
    from sglang.srt.runtime_context import get_memory

    memory = get_memory()
    return (
        int(memory.hicache_storage_prefetch_retry_poll_interval),
        int(memory.hicache_storage_prefetch_retry_max_attempts),
    )


@dataclass
class Request:
    """One prefetch as the driver issued it."""

    handle: Any
    """What SGLang keys the request by: a ``CacheRequestHandle`` (0.5.20 and later) or the rid
    itself (0.5.19)."""
    tokens: list[int]
    namespace: str | None
    loaded_tokens: int = 0
    """Tokens its admission loaded onto the device."""
    lacking_tokens: int = 0
    """Tokens of its staged span the device lacked at admission: the most a load may bring."""
    hit_base: int = 0
    """Where its last issue's L3 hit begins: the device prefix that issue matched."""
    unlocked_tokens: int = 0
    """A hybrid's: tokens of the staged span its load made usable without loading them, their
    full-attention KV on the device already but out of reach without the SWA window the load
    brings (the joint match stops short of them). So a hybrid's load makes usable all of its
    hit it lacked, from the joint match (or the hit's base) to the staged span's end, a head
    the IO commit trimmed off the read included; SGLang's metrics count that as storage's
    ("resident FULL the aux tail unlocks"), and so does the world."""
    state: Literal["waiting", "admitted", "aborted"] = "waiting"
    """Where the scheduler has it: in the waiting queue (its prefetch in flight, staged, or
    ended with nothing to load), admitted, or aborted."""
    retracted: bool = False
    """Re-queued by a retraction (SGLang's ``retracted_stain``): its admission leaves its
    storage hit out of the metrics."""

    @property
    def credited_tokens(self) -> int:
        """What its admission's load made usable: the tokens loaded and those it unlocked (a
        hybrid's load may bring the window alone)."""
        return self.loaded_tokens + self.unlocked_tokens


@dataclass
class Side:
    """One of the two caches (producer or consumer) and the pools it was built on."""

    cache: Any
    allocator: Any
    req_to_token_pool: Any


@dataclass
class SteppedSGLang(ABC):
    """A producer and a consumer over one L3 directory; see the module's theory of operation."""

    page_size: int = 4
    device_tokens: int = 512
    core: str = "python"
    anchor_cap: float = 0.5
    """SGLang's ``SGLANG_HICACHE_BUFFER_ANCHOR_LOCK_CAP``: the anchor-lock cap as a fraction of
    the device pool (its default 0.5; the fuzzer lowers it so the cap's branches are reached)."""
    anchor_lock: bool | None = None
    """Pin the splice base (the anchor lock); None: the release's default (0.5.19 off, behind
    ``SGLANG_ENABLE_HICACHE_BUFFER_ANCHOR_LOCK``; later releases on, off with a cap of 0)."""
    retry_interval: int | None = None
    """``--hicache-storage-prefetch-retry-poll-interval`` (0: paced retries off); None: the
    release's default."""
    retry_max_attempts: int | None = None
    """``--hicache-storage-prefetch-retry-max-attempts``; None: the release's default."""
    host_tokens: int | None = None
    """The host bounce buffer; None: SGLang's default (``hicache_ratio`` x the device pool)."""
    prefetch_threshold: int = 1
    """Spans shorter than this (tokens) are not fetched (SGLang's ``prefetch_threshold``)."""
    prefetch_policy: str = "wait_complete"
    """``--hicache-storage-prefetch-policy``. With ``timeout`` the wall-clock deadline is
    disabled: a caller with its own clock expires a wait with :meth:`expire_wait`."""
    max_context_len: int | None = None
    """The request-to-token pool's row length; None: half the device pool."""
    device_pool: SlotPool | None = None
    """When given, the consumer allocates from and frees into this stagefate pool (the replay's
    engine shares it), and only the consumer is built (it writes through to L3 itself)."""
    storage_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sgl-l3-")))
    requests: dict[str, Request] = field(default_factory=dict)
    expired: set[str] = field(default_factory=set)
    """Rids whose wait the caller's clock ended (0.5.19 to 0.5.22's deadline hook)."""
    decoding: dict[str, torch.Tensor] = field(default_factory=dict)
    """The running batch's decode KV: device slots each running request grew by, held by the
    scheduler (not the tree) until the request finishes or is retracted."""
    tp_group: Any = None
    """A ``torch.distributed`` process group of the tensor-parallel ranks (one process each;
    gloo on a CPU): SGLang's cache agrees its hit counts and acks over it. None: one rank."""
    tp_rank: int = 0
    swa_window: int | None = None
    """A hybrid model's sliding window (tokens): SWA layers beside full attention, with an SWA
    device pool of a quarter of full attention's (:mod:`.hybrid`); None: full attention only."""
    world_loads: WorldLoads = field(default_factory=WorldLoads)
    """What admissions loaded and what aborts and retractions left out, in the terms of
    SGLang's storage-hit metrics (:mod:`.hit_accounting`)."""

    def __post_init__(self) -> None:
        require()
        if self.swa_window is not None and self.device_pool is not None:
            raise ValueError(
                "a hybrid model (swa_window) is built on SGLang's own pools: leave device_pool "
                "unset, or drop swa_window to share a stagefate pool"
            )
        shim.patch_for_cpu()
        try:
            self._build_sides()
        except Undeployable:
            shutil.rmtree(self.storage_dir, ignore_errors=True)
            raise

    def _build_sides(self) -> None:
        # The producer only fills L3 for the world, on the Python core: 0.5.22's Rust core
        # lacks the write-through call the driver makes of it (``request_buffer_backup``).
        self.producer = self._build("python") if self.device_pool is None else None
        self.consumer = self._build(self.core, self.device_pool)
        self.baseline_host = self.pipeline_host_available()

    # ------------------------------------------------------------------ construction

    def _build(self, core: str, device_pool: SlotPool | None = None) -> Side:
        from sglang.srt.environ import envs
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.runtime_context import get_parallel
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        server_args = ServerArgs(
            model_path="dummy",
            page_size=self.page_size,
            hicache_io_backend="direct",
            hicache_mem_layout="layer_first",
            hicache_write_policy="write_through",
            hicache_storage_backend="file",
            hicache_storage_backend_extra_config=json.dumps(
                {"prefetch_threshold": self.prefetch_threshold}
            ),
            hicache_storage_prefetch_policy=self.prefetch_policy,
            hicache_host_memory_mode="buffer_only",
            **(
                {}
                if self.host_tokens is None
                else {"hicache_ratio": self.host_tokens / self.device_tokens}
            ),
            **self._retry_arguments(),
        )
        set_global_server_args_for_scheduler(server_args)
        size = self.device_tokens
        if device_pool is None:
            allocator = device_allocator(size, self.page_size, self.sliding_window)
        else:
            kv = tiny_kv_pool(size, self.page_size)
            allocator = pool_bridge_class()(
                size=size, dtype=torch.float16, device="cpu", kvcache=kv, need_sort=False
            )
            allocator.bind(device_pool, allocates=True)
        req_to_token_pool = ReqToTokenPool(
            size=64,
            max_context_len=self.max_context_len or size // 2,
            device="cpu",
            enable_memory_saver=False,
        )
        tp_size = 1 if self.tp_group is None else self.tp_group.size()
        cache, params = unified_cache(
            core,
            swa_window=self.swa_window,
            disable=False,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=allocator,
            page_size=self.page_size,
            **({} if self.tp_group is None else {"tp_cache_group": self.tp_group}),
        )
        # a plain TP deployment: one attention-TP group of every rank (SGLang checks the layout)
        layout = (
            {}
            if tp_size == 1
            else {"attn_tp_size": tp_size, "attn_tp_rank": self.tp_rank, "moe_tp_size": tp_size}
        )
        with (
            get_parallel().override(
                tp_rank=self.tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, **layout
            ),
            envs.SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR.override(str(self.storage_dir)),
            self._anchor_lock_environment(envs),
        ):
            try:
                cache.init_hicache(server_args, params)
            except ValueError as refusal:
                if not str(refusal).startswith("--"):  # SGLang's refusals name the flag
                    raise
                raise Undeployable(f"SGLang refuses this deployment: {refusal}") from refusal
        cache.cache_controller._stop_storage_threads()
        if self.prefetch_policy == "timeout":
            self.stop_wall_clock(cache)
        return Side(cache, allocator, req_to_token_pool)

    @property
    def sliding_window(self) -> SlidingWindow | None:
        if self.swa_window is None:
            return None
        return SlidingWindow(self.swa_window, self.device_tokens // 4)

    def _retry_arguments(self) -> dict[str, int]:
        arguments = {
            "hicache_storage_prefetch_retry_poll_interval": self.retry_interval,
            "hicache_storage_prefetch_retry_max_attempts": self.retry_max_attempts,
        }
        return {name: value for name, value in arguments.items() if value is not None}

    @contextmanager
    def _anchor_lock_environment(self, envs: Any) -> Iterator[None]:
        """The cap, and the lock on or off where this release has a switch for it (0.5.19's
        ``SGLANG_ENABLE_HICACHE_BUFFER_ANCHOR_LOCK``; later ones read a cap of 0 as off)."""
        cap = 0.0 if self.anchor_lock is False else self.anchor_cap
        switch = self.anchor_lock_switch(envs)
        with ExitStack() as stack:
            stack.enter_context(envs.SGLANG_HICACHE_BUFFER_ANCHOR_LOCK_CAP.override(cap))
            if self.anchor_lock is not None and switch is not None:
                stack.enter_context(switch.override(self.anchor_lock))
            yield

    def stop_wall_clock(self, cache: Any) -> None:
        """SGLang's ``timeout`` deadline is wall-clock time: switch it off, so that only the
        caller's clock (:meth:`expire_wait`) ends a wait. The clock is a release's, not an API
        generation's: 0.5.23 keeps a wait book (``_StoragePrefetchWait``) timed from
        ``prefetch_timeout_base``; 0.5.19 to 0.5.22 ask ``_prefetch_timeout_check_linear_func``
        of each operation (whose ``request_id`` is the rid in every release)."""
        if self.release.times_prefetch_wait:
            cache.prefetch_timeout_base = math.inf
        else:
            cache._prefetch_timeout_check_linear_func = lambda operation: (
                operation.request_id in self.expired
            )

    def close(self) -> None:
        import atexit

        for side in self.sides():
            side.cache.cache_controller._stop_storage_threads()
            atexit.unregister(side.cache.shutdown)  # init_hicache registers it
        shutil.rmtree(self.storage_dir, ignore_errors=True)

    # ------------------------------------------------------------------ the storage threads

    def _run_body(
        self, side: Side, body: Callable[[], None], work: Any, only_oldest: bool = False
    ) -> None:
        """Run a thread ``body`` until its ``work`` queue is empty; ``only_oldest``: on the
        oldest item only, the others held back, in their order, ahead of what the body queued.
        SGLang's storage threads take their queues first in first out, so no other item may go
        first."""
        controller = side.cache.cache_controller
        saved = controller.storage_stop_event
        controller.storage_stop_event = _SetWhenEmpty(work)
        held: list[Any] = []
        if only_oldest and not work.empty():
            held = list(work.queue)
            chosen = held.pop(0)
            work.queue.clear()
            work.queue.append(chosen)
        try:
            body()
        finally:
            controller.storage_stop_event = saved
            if held:
                work.queue.extendleft(reversed(held))

    def run_existence_queries(self, only_oldest: bool = False) -> None:
        """The queued L3 existence queries (``only_oldest``: the oldest one alone)."""
        controller = self.consumer.cache.cache_controller
        self._run_body(
            self.consumer, controller.prefetch_thread_func, controller.prefetch_queue, only_oldest
        )

    def run_reads(self, failing: bool = False, only_oldest: bool = False) -> None:
        """The queued L3 reads and their acks; ``failing``: every page read fails as an IO
        error does in SGLang's file backend (its ``get`` returns None); ``only_oldest``: the
        oldest read alone, the others still queued."""
        controller = self.consumer.cache.cache_controller
        backend = controller.storage_backend
        if failing:
            backend.get = lambda key, target_location, target_sizes=None: None
        try:
            self._run_body(
                self.consumer,
                controller.prefetch_io_aux_func,
                controller.prefetch_buffer,
                only_oldest,
            )
        finally:
            if failing:
                del backend.get  # the class's own again
        self._run_body(
            self.consumer, controller.prefetch_sync_thread_func, controller.prefetch_sync_queue
        )

    def run_backups(self, side: Side | None = None) -> None:
        side = side or self.consumer
        controller = side.cache.cache_controller
        self._run_body(side, controller.backup_thread_func, controller.backup_queue)

    def tick(self) -> None:
        """One scheduler pass of the consumer: parked hits, IO commits, acks."""
        self.consumer.cache.check_hicache_events()

    def settle(self, rounds: int = 8) -> None:
        """Ticks and every thread body, ``rounds`` times."""
        for _ in range(rounds):
            self.tick()
            self.run_existence_queries()
            self.run_reads()
            self.run_backups()

    def settle_until_idle(self, most: int = SETTLE_ROUNDS) -> int:
        """Rounds of :meth:`settle` until the consumer is idle (:meth:`idle`), at most
        ``most``; returns the rounds run. A write-through backlog drains a bounce's worth a
        round, so a small bounce under many publishes needs more than a fixed few."""
        for rounds in range(most):
            self.settle(rounds=1)
            if self.idle():
                return rounds + 1
        return most

    def idle(self) -> bool:
        """The consumer's pipeline is idle and no queue of its cache controller holds work.
        The pipeline's own ``is_idle`` does not look at the controller's queues: a bounce an
        ack released in this pass waits in ``host_mem_release_queue`` for the next pass (each
        drain takes only what its queues held when it started)."""
        controller = self.consumer.cache.cache_controller
        queues = [value for value in vars(controller).values() if isinstance(value, queue.Queue)]
        queues += getattr(controller, "extra_host_mem_release_queues", {}).values()
        return bool(self.consumer.cache.buffer_pipeline.is_idle()) and all(
            waiting.empty() for waiting in queues
        )

    # ------------------------------------------------------------------ keys and KV

    def _key(self, tokens: Sequence[int], namespace: str | None) -> Any:
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(array("q", tokens), extra_key=namespace)

    def _match(self, side: Side, tokens: Sequence[int], namespace: str | None) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        return side.cache.match_prefix(MatchPrefixParams(key=self._key(tokens, namespace)))

    def _insert_marked(self, side: Side, tokens: Sequence[int], namespace: str | None) -> Any:
        """Insert ``tokens`` with marked KV into ``side``; returns the node that ends there."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        self._reclaim_swa(side, len(tokens))
        slots = allocate(side.allocator, len(tokens))
        if slots is None:
            return None
        write(side.allocator, slots, _mark(tokens, namespace))
        side.cache.insert(InsertParams(key=self._key(tokens, namespace), value=slots))
        return self._match(side, tokens, namespace).last_device_node

    def _reclaim_swa(self, side: Side, tokens: int) -> None:
        """A hybrid's SWA pool short of ``tokens``: evict SWA from the tree first (the SWA
        side of full-attention nodes goes, leaving tombstones), as SGLang's allocator does
        before it allocates (``reclaim_for_prealloc``): the scheduler prices only full
        attention's pool in its budget."""
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        if not is_hybrid(side.allocator):
            return
        short = tokens - int(side.allocator.swa_available_size())
        if short > 0:
            side.cache.evict(EvictParams(num_tokens=0, swa_num_tokens=short))

    # ------------------------------------------------------------------ the world

    def sides(self) -> list[Side]:
        return [side for side in (self.producer, self.consumer) if side is not None]

    def produce(self, tokens: Sequence[int], namespace: str | None) -> None:
        """The producer inserts ``tokens`` (whole pages) and writes them through to L3."""
        if self.producer is None:
            raise RuntimeError("built over a device pool: there is no producer")
        node = self._insert_marked(self.producer, tokens, namespace)
        if node is None:
            raise RuntimeError("the producer's pool is full; give it more device_tokens")
        self.request_backup(self.producer, node)
        for _ in range(4):
            self.producer.cache.check_hicache_events()
            self.run_backups(self.producer)
        self.producer.cache.check_hicache_events()

    def publish(self, tokens: Sequence[int], namespace: str | None) -> bool:
        """A sibling request computes ``tokens`` on the consumer and publishes them."""
        return self._insert_marked(self.consumer, tokens, namespace) is not None

    def evict(self, tokens: int) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        result = self.consumer.cache.evict(EvictParams(num_tokens=tokens))
        return int(result.num_tokens_evicted)

    def decode(self, rid: str, tokens: int) -> bool:
        """The running request ``rid`` decodes ``tokens`` more: device slots for them, evicting
        from the tree first with the scheduler's own call before it grows a batch
        (``evict_from_tree_cache``: a hybrid's allocator plans what of each pool to reclaim,
        so full-attention KV is not evicted for a short SWA pool). False when even then they
        do not fit (the scheduler retracts a request)."""
        from sglang.srt.mem_cache.common import evict_from_tree_cache

        allocator = self.consumer.allocator
        evict_from_tree_cache(self.consumer.cache, tokens)
        slots = allocate(allocator, tokens)  # None when the pool is still short
        if slots is None:
            return False
        grown = self.decoding.get(rid)
        self.decoding[rid] = slots if grown is None else torch.cat([grown, slots])
        return True

    def stop_decoding(self, rid: str) -> None:
        """``rid`` left the running batch (finished or retracted): its decode slots are freed."""
        slots = self.decoding.pop(rid, None)
        if slots is not None:
            self.consumer.allocator.free(slots)

    def retract(self, rid: str) -> Request:
        """The running batch grew and ``rid`` is retracted: its decode slots are freed and the
        scheduler re-queues it, issuing its prefetch again under the same rid and handle
        (``_add_request_to_queue`` with ``is_retracted``), whatever of its earlier attempt is
        still in flight."""
        self.stop_decoding(rid)
        request = self.requests[rid]
        return self.issue(rid, request.tokens, request.namespace, fresh=True, retracted=True)

    def drop_l3(self, keep: Callable[[str], bool]) -> int:
        """Delete the L3 objects whose file name ``keep`` rejects; returns how many."""
        dropped = 0
        for path in list(self.storage_dir.rglob("*")):
            if path.is_file() and not keep(path.name):
                path.unlink()
                dropped += 1
        return dropped

    # ------------------------------------------------------------------ the scheduler's calls
    # What differs between API generations is in :mod:`.generations`; what is here is the
    # scheduler's order, which both keep.

    def request_backup(self, side: Side, node: Any) -> None:
        """Write ``node`` (and its unwritten ancestors) through to L3 now. Earlier releases queue
        the write in the insert itself (``write_through``); 0.5.22 and later write once a node's
        hit count reaches the threshold, and offer ``request_buffer_backup`` to write at once
        (no SGLang code of theirs calls it: the producer, which fills L3 for the world, does)."""
        if self.release.backs_up_on_request:
            side.cache.request_buffer_backup(node)

    def issue(
        self,
        rid: str,
        tokens: list[int],
        namespace: str | None,
        stale: bool = False,
        storage_hit_end: int | None = None,
        fresh: bool = False,
        retracted: bool = False,
    ) -> Request:
        """Re-anchor on the deepest device node and prefetch the rest (``stale``: as if the
        match were one page longer than the live one, the way a match made before an eviction
        would be). Issuing a known ``rid`` again is a retry: the same key, as SGLang's ``Req``
        keeps it; ``storage_hit_end`` is what 0.5.20's retry book returned (0.5.19 has none).
        ``fresh``: a new request under a known rid, or one the scheduler re-queued (a new
        ``Req`` reusing an aborted one's id; a retracted ``Req``): the same key, and the
        scheduler's retry fields start over; ``retracted``: the second of the two."""
        cache = self.consumer.cache
        match = self._match(self.consumer, tokens, namespace)
        matched = min(device_prefix_len(match) + (self.page_size if stale else 0), len(tokens))
        anchor = match.last_device_node
        if cache.is_root(anchor):
            anchor = cache.root_node_handle(namespace)
        request = self.requests.get(rid)
        if request is None or fresh:
            request = Request(self.request_key(rid), tokens, namespace, retracted=retracted)
            self.requests[rid] = request
            self.forget_retries(rid)
        elif request.state != "waiting":
            raise ValueError(
                f"{rid} is {request.state}: a retry re-issues a waiting request; pass fresh=True "
                "for a retracted request or a new one reusing the id"
            )
        request.hit_base = matched
        cache.prefetch_from_storage(
            request.handle,
            anchor,
            tokens[matched:],
            cache.get_last_hash_value(anchor),
            None,
            matched_prefix_tokens=tokens[:matched],
            extra_key=namespace,
            **self.issue_extras(storage_hit_end),
        )
        return request

    @cached_property
    def release(self) -> Release:
        """The release this interpreter imports: what differs between releases of one API
        generation is declared there (:mod:`.releases`), not probed."""
        return require()

    @abstractmethod
    def request_key(self, rid: str) -> Any:
        """What SGLang keys a request by (see :attr:`Request.handle`)."""

    @abstractmethod
    def issue_extras(self, storage_hit_end: int | None) -> dict[str, Any]:
        """Keyword arguments of ``prefetch_from_storage`` beyond those both generations take."""

    def live(self, rid: str) -> bool:
        handle = self.requests[rid].handle
        cache = self.consumer.cache
        return handle in cache.ongoing_prefetch or cache.buffer_pipeline.has_staged(handle)

    @abstractmethod
    def load_back_rid(self, pending: Any) -> str:
        """The rid of one of ``ongoing_buffer_load_back``'s entries."""

    def abandoned(self) -> list[str]:
        """Requests an abort let go of whose read is still queued (SGLang frees its bounce
        when it lands)."""
        reads = self.consumer.cache.cache_controller.prefetch_buffer.queue
        rids = {op.request_id for op in reads if op.request_id in self.requests}
        return sorted(rid for rid in rids if not self.live(rid))

    def admit(self, rid: str, make_room: Callable[[int], object] | None = None) -> int:
        """Admission as the scheduler's adder does it; returns the tokens loaded (0: none).
        ``make_room(tokens)`` runs after the plan, before the load allocates (the replay's
        engine evicts there, as its scheduler does before ``init_load_back``)."""
        request = self.requests[rid]
        cache = self.consumer.cache
        if not cache.check_prefetch_progress(request.handle):
            return 0  # still waiting: the adder skips it this pass
        self._pop_loaded(request)
        request.loaded_tokens = request.unlocked_tokens = 0
        pipeline = cache.buffer_pipeline
        if pipeline.has_staged(request.handle):
            self._load(rid, request, make_room)
            if pipeline.has_staged(request.handle):
                return 0  # the device could not take the tail: deferred, still waiting
        self._admitted(request)
        return request.loaded_tokens

    def loading(self, rid: str) -> bool:
        """Whether a load back of ``rid``'s is in flight (its ack still to come)."""
        pending = self.consumer.cache.buffer_pipeline.ongoing_buffer_load_back.values()
        return any(self.load_back_rid(load) == rid for load in pending)

    @abstractmethod
    def _pop_loaded(self, request: Request) -> None:
        """The adder takes what L3 loaded as soon as the prefetch is done, staged or not."""

    def _admitted(self, request: Request) -> None:
        """What the adder does once a request is admitted, loaded or not."""
        request.state = "admitted"
        self.close_storage_wait(request)

    @abstractmethod
    def close_storage_wait(self, request: Request) -> None:
        """What the generation's scheduler does with an admitted request's storage wait."""

    @abstractmethod
    def anchor_lock_switch(self, envs: Any) -> Any:
        """The release's on/off switch of the anchor lock (None: a cap of 0 turns it off)."""

    def _load(self, rid: str, request: Request, make_room: Callable[[int], object] | None) -> None:
        """The staged span's plan and load back, as the adder makes them."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams
        from sglang.srt.sampling.sampling_params import SamplingParams

        cache = self.consumer.cache
        pipeline = cache.buffer_pipeline
        staged = pipeline.staged_prefetches[request.handle]
        req = Req(
            rid=rid,
            origin_input_text="",
            origin_input_ids=array("q", request.tokens),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=1),
        )
        self.consumer.req_to_token_pool.alloc([req])
        try:
            req.extra_key = request.namespace
            req.cache_salt = None
            match = self._match(self.consumer, request.tokens, request.namespace)
            req.last_node = match.last_device_node
            span_end = staged.matched_len + staged.num_tokens
            request.lacking_tokens = max(0, span_end - device_prefix_len(match))
            if not self.plan_load(req, request, match):
                return
            if make_room is not None and req.host_hit_length:
                make_room(int(req.host_hit_length))
            with self._locked(req.last_node):
                loaded = cache.init_load_back(
                    InitLoadBackParams(
                        best_match_node=None, host_hit_length=req.host_hit_length, req=req
                    )
                )
            cache.ready_to_load_host_cache()
        finally:
            self.consumer.req_to_token_pool.free(req)
        request.loaded_tokens = self.loaded_tokens(loaded)
        if not pipeline.has_staged(request.handle):  # loaded: the window at least
            request.unlocked_tokens = self._unlocked_by_window(request, span_end - request.hit_base)

    def _unlocked_by_window(self, request: Request, hit_tokens: int) -> int:
        """See :attr:`Request.unlocked_tokens` (0 for full attention only, and where the release
        keeps no hit metrics to credit them in: 0.5.19). Resident KV the window unlocks ahead
        of the hit's base (the device lost its window there since the issue) was no hit."""
        if self.swa_window is None or not keeps_hit_metrics(self.consumer.cache):
            return 0
        return max(0, min(request.lacking_tokens, hit_tokens) - request.loaded_tokens)

    def loaded_tokens(self, result: Any) -> int:
        """Tokens an ``init_load_back`` result loaded: up to 0.5.21 it returns ``(device
        slots, node)``; 0.5.22 and later ``(tokens, node)``, or None when nothing loads."""
        if result is None:
            return 0
        loaded = result[0]
        return int(loaded) if isinstance(loaded, int) else int(loaded.numel())

    @abstractmethod
    def plan_load(self, req: Any, request: Request, match: Any) -> bool:
        """The generation's admission plan on SGLang's ``Req``: whether a load follows (its
        ``host_hit_length`` set)."""

    @contextmanager
    def _locked(self, node: Any) -> Iterator[None]:
        cache = self.consumer.cache
        receipt = cache.inc_lock_ref(node)
        try:
            yield
        finally:
            cache.dec_lock_ref(node, receipt.to_dec_params())

    def abort(self, rid: str) -> None:
        """The scheduler aborts ``rid``: SGLang lets go of its prefetch, staged hold or load
        back, and leaves what it had not resolved of its storage hit out of the metrics (a
        load back in flight then counts for nothing there)."""
        request = self.requests[rid]
        if request.state == "admitted" and not request.retracted and self.loading(rid):
            self.world_loads.loaded -= request.credited_tokens
        self.world_loads.leave_out(self.consumer.cache, request.handle)
        self.consumer.cache.release_aborted_request(request.handle)
        request.state = "aborted"
        self.forget_retries(rid)
        self.expired.discard(rid)

    @abstractmethod
    def retry_budget(self) -> int:
        """Retries SGLang allows a request (the release's settings as built)."""

    @abstractmethod
    def forget_retries(self, rid: str) -> None:
        """``rid`` left the waiting queue (admitted, aborted) or entered it anew: the
        scheduler's retry fields of the request go (``_add_request_to_queue`` resets them for a
        retracted request; a new ``Req`` has its own)."""

    @abstractmethod
    def due_retries(self, waiting: Sequence[str]) -> list[tuple[str, int | None]]:
        """The retries SGLang makes due this pass among the ``waiting`` rids (queue order):
        ``(rid, storage_hit_end)`` each; the caller re-issues them."""

    def expire_wait(self, rid: str) -> bool:
        """The caller's clock says the request's prefetch wait is over (``timeout`` policy):
        SGLang's own deadline path ends it. False when its KV landed and it keeps waiting for
        the ack, as SGLang decides."""
        cache = self.consumer.cache
        handle = self.requests[rid].handle
        if cache.prefetch_stop_policy == "timeout":
            if self.release.times_prefetch_wait:
                from sglang.srt.mem_cache.unified_radix_cache import _StoragePrefetchWait

                wait = cache._storage_prefetch_wait.setdefault(handle, _StoragePrefetchWait())
                wait.expired = True
            else:
                self.expired.add(rid)
        ended = bool(cache.check_prefetch_progress(handle))
        if ended:
            self.expired.discard(rid)
        return ended

    # ------------------------------------------------------------------ observation

    def pipeline_host_available(self) -> int:
        return int(self.consumer.cache.cache_controller.mem_pool_host.available_size())

    def device_marks(self, tokens: Sequence[int], namespace: str | None) -> tuple[int, bool]:
        """``(tokens on the device, whether their slots hold their marks)``: full attention's
        slots, and a hybrid's SWA slots the allocator maps them to (those in the window)."""
        match = self._match(self.consumer, tokens, namespace)
        length = device_prefix_len(match)
        if not length:
            return 0, True
        slots = device_prefix_indices(self.consumer.cache, match)
        expected = _mark(tokens[:length], namespace)
        full, swa = kv_buffers(self.consumer.allocator)
        if not torch.equal(full[slots].reshape(-1), expected):
            return length, False
        if swa is None:
            return length, True
        peers = swa_peers(self.consumer.allocator, slots)
        windowed = peers > 0  # 0: no SWA peer (out of the window, or evicted)
        return length, bool(torch.equal(swa[peers[windowed]].reshape(-1), expected[windowed]))

    def slot_problems(self) -> list[str]:
        """What breaks one owner per slot in the consumer's device pool and host bounce buffer
        (:mod:`.slot_owners`; empty: none)."""
        decoding = list(self.decoding.values())
        return slot_problems(
            self.consumer.cache,
            self.consumer.allocator,
            self.device_tokens,
            torch.cat(decoding) if decoding else torch.empty(0, dtype=torch.int64),
        )

    def device_books(self) -> tuple[int, int, int]:
        """``(free device slots, tokens in the consumer's tree, pool size)`` of full
        attention's pool."""
        cache = self.consumer.cache
        cached = int(cache.evictable_size()) + int(cache.protected_size())
        free = int(full_allocator(self.consumer.allocator).available_size())
        return free, cached, self.device_tokens

    def swa_books(self) -> tuple[int, int, int] | None:
        """The same of a hybrid's SWA pool (tokens the tree's SWA component holds); None for
        full attention only."""
        allocator = self.consumer.allocator
        if not is_hybrid(allocator):
            return None
        cache = self.consumer.cache
        cached = int(cache.swa_evictable_size()) + int(cache.swa_protected_size())
        return int(allocator.swa_available_size()), cached, int(allocator.size_swa)
