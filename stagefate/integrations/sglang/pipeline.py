"""stagefate's lifecycle as SGLang's buffer-mode pipeline (docs/sglang.md, "stagefate in
SGLang's engine").

SGLang builds its buffer-mode pipeline once per scheduler process, at one seam:
``TreeComponent.create_buffer_pipeline`` (called by ``UnifiedRadixCache.init_hicache``).
:func:`install` replaces that method, when ``STAGEFATE_SGLANG`` is set, with one that returns a
:class:`StagefateBufferPipeline`: SGLang's class, with every staged-fetch decision taken by
stagefate's :class:`~stagefate.statemachine.pipeline.BufferPipeline` (so by a transition of
``spec/lifecycle.yaml``) over SGLang's own tree, allocator and device KV, through the same
engine-cache protocol the vLLM connector uses (:class:`~stagefate.runtime.engine.EngineCache`).

Which SGLang call does what (the release's names, 0.5.20's API and later):

* ``prefetch_from_storage`` (the scheduler, as a request enters the queue): the lifecycle's
  ``issue`` for the uncomputed tail, its existence query on stagefate's IO threads;
* ``check_prefetch_progress`` (admission, each pass): "not ready" while the lifecycle says the
  prefetch is pending (query, commit, read, or waiting on a sibling);
* ``prepare_staged_prefetch`` (admission, after the request re-matched the device tree):
  ``plan_staged_splice`` at the device prefix SGLang has now; the plan's tokens become SGLang's
  ``host_hit_length`` (its memory budget charges them) and its storage hit;
* ``init_load_back`` (the prefill adder, under the prefix lock): the lifecycle's
  ``init_load_back`` (make room, allocate from SGLang's allocator, copy the bounce into SGLang's
  KV, insert the tail into SGLang's tree); SGLang gets the loaded length and the node the
  request then locks;
* ``check_hicache_events`` (every scheduler pass): ``poll()`` (IO completions, commits, acks);
* ``release_aborted_request`` (an abort): ``release_aborted_request``.

What the spec does not decide, and what the adapter does about it:

* **Writes to L3.** The lifecycle reads stagefate's L3 (pages keyed by the request's namespace,
  so one tenant never reads another's: SGLang's file keys ignore the namespace,
  docs/sglang-findings.md). Every KV SGLang inserts into its device tree is written through
  there: gathered and hashed on the scheduler's thread before the insert, stored by a writer
  thread (:class:`~stagefate.runtime.storage.WriteBehind`; pages already stored are skipped).
  SGLang's scheduler issues a prefetch from a device node only when the node has an L3 hash
  of SGLang's; the lifecycle keeps its own, so every node qualifies (``get_last_hash_value``).
  SGLang's own backup pipeline is given nothing (``enqueue_backup_intent`` drops the intent):
  its L3 backend stays idle.
* **Waiting on a sibling.** A prefetch declined because a sibling is reading its span's head
  keeps its request out of admission until that read lands or ends; the request then issues
  again, at the device prefix it has now, for the rest, at the next pass's event check.
* **No pin inside admission.** Every issue (and so every anchor pin) happens before the
  admission loop: on arrival, in the retry sweep, or at the event check. SGLang's memory
  budget counts evictable tokens request by request as it admits; a pin taken between its
  count and the prefill's allocation made the prefill run out of memory (seen in the
  benchmark's first run, when woken requests issued from ``check_prefetch_progress``).
* **Paced retries.** SGLang's scheduler sweeps its retry book each pass and re-issues the
  prefetch of a waiting request that is due; the adapter answers that sweep from the
  lifecycle's own retry book (:class:`LifecycleRetries`), with SGLang's rule that the head of
  the queue is never held back for a speculative retry.
* **Admission retries.** SGLang defers a staged request whose splice its memory budget cannot
  take and drops the hold after ``max_staged_admission_defers`` deferrals; the adapter keeps
  that count and releases the lifecycle's hold at the same point.
* **Stop policy.** Only ``wait_complete``: a request waits for its prefetch. ``best_effort`` and
  ``timeout`` end a prefetch on a rule of their own (at once; a deadline of a fixed base plus a
  cost per token), which the spec's ``give_up`` (a read that has run longer than computing its
  tokens takes, from measured speeds) does not state; they are not mapped onto it.

A read-side method of SGLang's pipeline the cache would call only from its own prefetch path
(``try_lock_anchor``, ``allocate_and_queue_prefetch``, ``stage_completed_prefetch``, ...)
raises: with the cache's prefetch entry points taken over, reaching one means this adapter
missed a path of the release.
"""

from __future__ import annotations

import atexit
from array import array
from typing import Any

import torch

from ...runtime.engine import EngineCache
from ...runtime.storage import WriteBehind, open_storage
from ...statemachine.config import PipelineConfig
from ...statemachine.pipeline import BufferPipeline
from ...transition_log import TransitionLog
from .kv import EngineLoads, EngineSlots
from .settings import VARIABLE, SGLangSettings
from .tree import SGLangTree, device_prefix_indices, device_prefix_len

VARIABLE_PORT = f"{VARIABLE}'s metrics_port"


def build_lifecycle(
    cache: Any, settings: SGLangSettings, max_context_len: int
) -> tuple[BufferPipeline, SGLangTree]:
    """stagefate's pipeline over SGLang's built cache: its tree, allocator and device KV, and
    SGLang's own prefetch threshold and anchor-lock cap."""
    from sglang.srt.environ import envs

    allocator = cache.token_to_kv_pool_allocator
    slots = EngineSlots(allocator)
    tree = SGLangTree(cache, allocator, slots, remember_keys=False)
    layout = slots.layout
    host = cache.cache_controller.mem_pool_host
    config = PipelineConfig(
        page_size=int(cache.page_size),
        layers=layout.layers,
        kv_heads=layout.kv_heads,
        head_dim=layout.head_dim,
        dtype=layout.dtype,
        device_tokens=slots.capacity,
        host_tokens=settings.host_tokens or int(host.size),
        device=str(slots.device),
        io="threaded",
        io_workers=settings.io_workers,
        prefetch_threshold=max(1, int(cache.prefetch_threshold)),
        anchor_lock_cap_fraction=float(envs.SGLANG_HICACHE_BUFFER_ANCHOR_LOCK_CAP.get()),
        max_context_len=max(1, max_context_len),
        retry_interval=settings.retry_interval,
        retry_max_attempts=settings.retry_max_attempts,
        retry_head_at_once=False,  # SGLang's rule: a speculative miss never delays the head
        dedup_inflight=settings.dedup_inflight,
    )
    engine = EngineCache(lambda _page, _device, _aux: tree, slots, None, EngineLoads(slots.device))
    storage = WriteBehind(open_storage(settings.storage, layout, config.page_size))
    return BufferPipeline(config, storage=storage, engine=engine), tree


class LifecycleRetries:
    """SGLang's retry sweep (``cache.storage_prefetch_retries``), its decisions the
    lifecycle's paced retries: each scheduler pass the scheduler asks which waiting requests
    re-issue their prefetch (``pop_ready``) and re-issues them through the cache; an admitted
    request leaves (``cancel``)."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    def pop_ready(
        self, waiting_queue: list[Any], interval: int, max_attempts: int
    ) -> list[tuple[Any, None]]:
        life = self.pipeline.lifecycle
        due = set(life.due_retries([req.rid for req in waiting_queue]))
        return [(req, None) for req in waiting_queue if req.rid in due]

    def cancel(self, req_id: str) -> None:
        self.pipeline.lifecycle.request_left(req_id)

    def poll_miss(self, req_id: str, storage_hit_end: int | None = None) -> None:
        """SGLang's own prefetch path arms its retries here; the lifecycle arms its own."""

    refetch = poll_miss

    def clear(self) -> None:
        """Nothing of SGLang's to clear: the lifecycle's retries are its own."""


def stagefate_pipeline_class() -> type:  # noqa: C901 (one class, its methods nested in it)
    """:class:`StagefateBufferPipeline`, built over the SGLang imported here (SGLang's base class
    exists only once sglang is imported, so the class is declared inside this call; the
    complexity counted is that of its methods together)."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.buffer_mode.pipeline import BufferModePipeline
    from sglang.srt.mem_cache.radix_cache import RadixKey

    class StagefateBufferPipeline(BufferModePipeline):  # type: ignore[misc]
        """SGLang's buffer-mode pipeline, its staged-fetch decisions taken by stagefate."""

        def __init__(
            self,
            cache: Any,
            swa_component: Any,
            write_backlog_cap: int,
            max_context_len: int = 0,
            *,
            auxiliary_swa_component: Any = None,
            settings: SGLangSettings,
        ) -> None:
            if swa_component is not None or auxiliary_swa_component is not None:
                raise ValueError(
                    "STAGEFATE_SGLANG serves full-attention models: this one has a "
                    "sliding-window component; unset STAGEFATE_SGLANG to run SGLang's pipeline"
                )
            super().__init__(
                cache,
                swa_component,
                write_backlog_cap,
                max_context_len,
                auxiliary_swa_component=auxiliary_swa_component,
            )
            self.settings = settings
            self._max_context_len = max_context_len
            self._life: BufferPipeline | None = None
            self.tree: SGLangTree | None = None
            self.log: TransitionLog | None = None
            self._splicing = False
            self._defers: dict[str, int] = {}
            self._asked: dict[str, tuple[list[int], str | None, str | None]] = {}
            """What each request waiting for admission asked for (to issue again, woken)."""
            self._woken_later: set[str] = set()
            """Requests declined while a sibling reads their span's head."""
            self._reissue: set[str] = set()
            """Requests woken this pass, to issue again at the next (before admission)."""
            self._insert = cache.insert
            self._events = cache.check_hicache_events
            cache.prefetch_from_storage = self._issue
            cache.check_prefetch_progress = self._progress
            cache.check_hicache_events = self._check_events
            cache.insert = self._insert_writing_through
            cache.storage_prefetch_retries = LifecycleRetries(self)
            self._released = cache.on_release
            cache.on_release = self._on_release
            # every device node can anchor a prefetch: the lifecycle keys L3 by its own page
            # hashes, so the scheduler's "has the node a hash" gate must not hold one back
            cache.get_last_hash_value = self._any_node_anchors

        # -------------------------------------------------------------- the lifecycle

        @property
        def lifecycle(self) -> BufferPipeline:
            """Built at first use: SGLang sets the prefetch threshold and builds the host pool
            after it builds this pipeline."""
            if self._life is None:
                cache = self._cache
                if cache.prefetch_stop_policy != "wait_complete":
                    raise ValueError(
                        f"STAGEFATE_SGLANG runs under hicache_storage_prefetch_policy="
                        f"'wait_complete', not {cache.prefetch_stop_policy!r}"
                    )
                self._life, self.tree = build_lifecycle(cache, self.settings, self._max_context_len)
                settings = self.settings
                if settings.log is not None:
                    self.log = TransitionLog.open(settings.log, line_buffered=True)
                    self._life.instruments.append(self.log)
                if settings.metrics_port is not None:
                    from ...metrics import serve

                    port, address = settings.metrics_port, settings.metrics_address
                    serve(self._life, port, address, {"engine": "sglang"}, VARIABLE_PORT)
                atexit.register(self.close)
            return self._life

        def close(self) -> None:
            """Stop the IO threads and close the transition log (once)."""
            if self._life is not None:
                self._life.io.close()
                self.writer.close()
            if self.log is not None:
                self.log.close()
                self.log = None

        # -------------------------------------------------------------- the cache's calls

        def _issue(
            self,
            request: Any,
            last_host_node_id: Any,
            new_input_tokens: list[int],
            last_hash: Any = None,
            prefix_keys: Any = None,
            matched_prefix_tokens: list[int] | None = None,
            extra_key: str | None = None,
            cache_salt: str | None = None,
            storage_hit_end: int | None = None,
        ) -> None:
            prefix = list(matched_prefix_tokens or ())
            tokens = prefix + list(new_input_tokens)
            self._asked[request.rid] = (tokens, extra_key, cache_salt)
            self.lifecycle.prefetch_from_storage(
                request.rid, tokens, len(prefix), extra_key, cache_salt
            )

        def _progress(self, request: Any) -> bool:
            """Ready unless the prefetch is pending. One declined while a sibling reads its
            span's head waits; woken (the sibling's span landed or ended), it issues again,
            for the rest, at the next pass's event check: an issue pins its anchor, and a pin
            taken inside admission would shrink what SGLang's memory budget has just counted
            as evictable (the prefill then runs out of memory). No poll here: the pass's
            ``check_hicache_events`` polled before admission began."""
            rid = request.rid
            life = self.lifecycle
            if life.prefetch_pending(rid):
                if life.state(rid) is None:  # no record: it waits on a sibling's read
                    self._woken_later.add(rid)
                return False
            if rid in self._woken_later:
                self._woken_later.discard(rid)
                self._reissue.add(rid)
                return False
            if rid in self._reissue:
                return False
            self._asked.pop(rid, None)
            return True

        def _issue_woken(self) -> None:
            """Issue again, at the device prefix each has now, the prefetches of the requests
            woken last pass (before admission: see :meth:`_progress`)."""
            life = self.lifecycle
            page = self._cache.page_size
            for rid in sorted(self._reissue):
                tokens, extra_key, cache_salt = self._asked[rid]
                matched = self.tree_matched(tokens, extra_key, cache_salt)
                if matched < len(tokens) - len(tokens) % page:
                    life.prefetch_from_storage(rid, tokens, matched, extra_key, cache_salt)
            self._reissue.clear()

        def tree_matched(self, tokens: list[int], extra_key: str | None, salt: str | None) -> int:
            """Tokens of ``tokens`` on the device in SGLang's tree now."""
            assert self.tree is not None
            return int(self.tree.match_prefix(tokens, extra_key, salt).length)

        def _check_events(self) -> None:
            self._events()
            self._issue_woken()
            self.lifecycle.poll()

        def _insert_writing_through(self, params: Any) -> Any:
            if not self._splicing:  # a splice inserts pages read from L3: stored already
                key = params.key
                value = params.value[: len(key)]
                self.lifecycle.write_through(
                    list(key.token_ids), value.to(torch.int64), key.extra_key, key.cache_salt
                )
            return self._insert(params)

        def _on_release(self, req: Any, *, checkpointed: bool) -> None:
            self._released(req, checkpointed=checkpointed)
            if self._life is not None:
                self._life.request_left(req.rid)

        @staticmethod
        def _any_node_anchors(node_id: Any) -> str:
            return "stagefate"

        # -------------------------------------------------------------- the pipeline's calls

        def has_staged(self, request: Any) -> bool:
            return self.lifecycle.has_hold(request.rid)

        @property
        def writer(self) -> WriteBehind:
            """The lifecycle's store, whose writes run on their own thread."""
            storage = self.lifecycle.storage
            assert isinstance(storage, WriteBehind)
            return storage

        def is_idle(self) -> bool:
            life = self._life
            idle = life is None or (life.is_idle() and not self.writer.pending())
            return bool(super().is_idle()) and idle

        def reset(self) -> None:
            super().reset()
            life = getattr(self, "_life", None)
            if life is not None and life.live_records:
                raise RuntimeError(
                    f"SGLang reset its cache while stagefate's lifecycle holds "
                    f"{sorted(life.live_records)}: flush only an idle engine"
                )

        def enqueue_backup_intent(self, node_id: Any) -> None:
            """Nothing to SGLang's L3: the lifecycle wrote the node's KV through at insert."""

        def prepare_staged_prefetch(self, req: Any) -> bool:
            life = self.lifecycle
            if not life.has_hold(req.rid):
                if not (req.host_hit_is_storage and req.host_loaded_length > 0):
                    self._clear_storage_hit(req)
                return True
            tokens, _ = life.plan_staged_splice(req.rid, int(req.prefix_len))
            if not tokens:  # the plan declined: the lifecycle released the hold
                req.host_hit_length = 0
                self._clear_storage_hit(req)
                return True
            req.host_hit_length = tokens
            req.swa_host_hit_length = 0
            req.mamba_host_hit_length = 0
            req.storage_hit_length = tokens
            req.storage_hit_start = int(req.prefix_len)
            req.host_hit_is_storage = True
            return True

        def defer_staged_admission(self, req: Any, pool: str) -> None:
            if not self.lifecycle.has_hold(req.rid):
                return
            defers = self._defers.get(req.rid, 0) + 1
            self._defers[req.rid] = defers
            if defers >= self.max_staged_admission_defers:
                self.lifecycle.release_staged_hold(req.rid)
                self._defers.pop(req.rid, None)
                req.host_hit_length = 0
                self._clear_storage_hit(req)

        def init_load_back(self, params: Any) -> tuple[int, Any]:
            req = params.req
            life = self.lifecycle
            unchanged = (0, req.last_node)
            if not life.has_hold(req.rid):
                return unchanged
            self._defers.pop(req.rid, None)
            cache = self._cache
            base = int(req.prefix_len)
            prefix = cache.prefix_device_indices(req).to(torch.int64).cpu()
            self._splicing = True
            try:
                tail = life.init_load_back(req.rid, prefix)
            finally:
                self._splicing = False
            if not tail.numel():  # the lifecycle ended the hold (dropped, device_capacity)
                return unchanged
            span_end = base + tail.numel()
            key = RadixKey(
                array("q", req.full_untruncated_fill_ids[:span_end]),
                extra_key=req.extra_key,
                cache_salt=req.cache_salt,
            )
            match = cache.match_prefix(MatchPrefixParams(key=key))
            spliced = device_prefix_indices(cache, match)[base:span_end].to(torch.int64).cpu()
            if device_prefix_len(match) < span_end or not torch.equal(spliced, tail):
                raise RuntimeError(
                    f"stagefate's splice of {req.rid} is not in SGLang's tree as loaded: "
                    f"matched {device_prefix_len(match)} of {span_end} tokens"
                )
            return tail.numel(), match.last_device_node

        def release_staged_hold(self, request: Any, reason: str | None = None) -> bool:
            """SGLang's abort path asks this first; the lifecycle releases whatever the
            request holds (a read in flight ends when it lands)."""
            life = self.lifecycle
            self._defers.pop(request.rid, None)
            self._asked.pop(request.rid, None)
            self._woken_later.discard(request.rid)
            self._reissue.discard(request.rid)
            if life.state(request.rid) is None and not life.retry_pending(request.rid):
                return False
            life.release_aborted_request(request.rid)
            return True

        def _not_reached(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                "SGLang's cache reached a read-side method of its own buffer pipeline while "
                "stagefate's lifecycle owns the read side: this release has a path the adapter "
                "does not take over (docs/sglang.md, 'stagefate in SGLang's engine')"
            )

        set_prefix_ctx = _not_reached
        try_lock_anchor = _not_reached
        staged_span_covered = _not_reached
        allocate_and_queue_prefetch = _not_reached
        stage_completed_prefetch = _not_reached

    return StagefateBufferPipeline


def install() -> bool:
    """Make SGLang build stagefate's pipeline at its seam when ``STAGEFATE_SGLANG`` is set
    (the settings are read and checked now); returns whether it did."""
    settings = SGLangSettings.from_environment()
    if settings is None:
        return False
    from sglang.srt.mem_cache.buffer_mode.pipeline import BufferModePipeline
    from sglang.srt.mem_cache.unified_cache.components.base import TreeComponent

    if not hasattr(BufferModePipeline, "prepare_staged_prefetch"):
        raise ValueError(
            "STAGEFATE_SGLANG takes over the buffer-mode API of SGLang 0.5.20 and later "
            "(prepare_staged_prefetch); this release has 0.5.19's (plan_staged_splice): serve "
            "it with its own pipeline (unset STAGEFATE_SGLANG) or use 0.5.20 or later"
        )
    pipeline_class = stagefate_pipeline_class()

    def create_buffer_pipeline(
        self: Any,
        *,
        swa_component: Any,
        write_backlog_cap: int,
        max_context_len: int = 0,
        auxiliary_swa_component: Any = None,
    ) -> Any:
        return pipeline_class(
            self.cache,
            swa_component,
            write_backlog_cap,
            max_context_len,
            auxiliary_swa_component=auxiliary_swa_component,
            settings=settings,
        )

    TreeComponent.create_buffer_pipeline = create_buffer_pipeline
    return True
