"""The replay's engine: continuous batching over the live tree, after SGLang 0.5.23's scheduler.

Theory of operation
-------------------
The engine owns a waiting queue and a running batch, and runs in *steps*. One step is one
scheduling pass followed by one forward pass, as in SGLang's event loop
(``srt/managers/scheduler.py``, ``get_new_batch_prefill`` and the running-batch update):

1. **Admission** (``PrefillAdder``, ``srt/managers/schedule_policy.py``). A chunked request left
   over from the last step continues first. Then the waiting queue is walked in order (FCFS, or
   longest device prefix first with ``schedule="lpm"`` while the queue is at most 128 long). A
   request whose prefetch is still on its way is *skipped* (``check_prefetch_progress``), not
   waited for, unless the prefetch policy lets it go: ``best_effort`` at once, ``timeout`` once
   it has been blocked for ``base + per_ki_token x requested tokens / 1024`` (the timer starts
   at the first blocked poll), ``wait_complete`` never. A request that is let go is admitted
   without its prefetch: a read in flight is abandoned and wasted. Each candidate is charged
   against the memory budget *before* anything is spliced: free + evictable tokens, minus every
   running request's decode reservation (its remaining output, clipped at 4,096, times the
   *new-token ratio*), must cover the candidate's tokens beyond its live device prefix plus its
   own clipped output (and a page). The first candidate that does not fit ends the walk, as
   does the prefill token budget (``max_prefill_tokens``). A candidate that fits re-matches the
   live tree, lets the policy splice what it staged, locks its prefix, and allocates device
   slots for its first chunk (at most ``chunked_prefill_size`` tokens; the rest runs in later
   steps, one chunked request at a time).
2. **Decode**. Every running request needs KV for one more token; a request whose pages are full
   takes a new page. If free + evictable tokens cannot cover the step, requests are *retracted*
   (``retract_decode``, ``srt/managers/schedule_batch.py``): fewest output tokens first (then
   longest prompt), until the step fits, keeping at least one. A retracted request's KV is freed
   without entering the tree, it goes back to the end of the waiting queue and later re-runs
   its prompt and the output it had, and the new-token ratio is re-estimated from what the
   running batch has decoded (``NewTokenRatioTracker``); a step without retraction decays the
   ratio towards its minimum.
3. **The forward pass** takes the cost model's time for the prefill chunks (with their
   attention context), the decode batch, and any H2D splice the batch waits for.
4. **After it**, each chunk's whole pages enter the tree (``cache_unfinished_req``: siblings
   can match them at once) and the request's lock moves to the new last node; a request whose
   prompt is done samples its first output token; a request that has all its output tokens
   finishes: its prompt and output pages enter the tree, its prompt pages are written through to
   L3, its lock is released and its leftover slots (a partial last page) are freed.

Eviction frees unlocked LRU leaves whenever an allocation needs room (``make_room``), and is
counted. The engine never frees a slot it did not allocate: tokens already present in the tree
when a chunk is inserted (a sibling published them meanwhile) are freed as duplicates, as
SGLang's insert does. At the end, with nothing running, the device pool holds exactly the tree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from ..runtime import TokenKey
from ..runtime.pools import SlotPool
from ..runtime.prefix_tree import Node, PrefixTree, evict_for
from .costs import CostModel
from .policy import Policy
from .trace import TraceRequest

_EMPTY = torch.empty(0, dtype=torch.int64)
OUTPUT_TOKEN_BASE = 1 << 31
"""Output token ids start here (prompt ids are block id x 512 + offset, far below), so outputs
never match another request's prompt. Request ``i``'s outputs are ``BASE + i``, ``BASE + i +
1``, …: its first output token is its own, so no two requests share a path past their prompts,
and every id fits the unsigned 32 bits a tokenizer's vocabulary does (SGLang 0.5.19's page
hashes refuse wider ids)."""
CLIP_MAX_NEW_TOKENS = 4096
"""SGLang's ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``: reservations clip the output at this."""
LPM_QUEUE_LIMIT = 128
"""SGLang falls back from LPM to FCFS when the queue is longer (prefix matching is costly)."""


class EngineOptions(BaseModel):
    """The scheduler's settings; defaults are SGLang 0.5.23's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schedule: Literal["fcfs", "lpm"] = "fcfs"
    prefetch_policy: Literal["best_effort", "wait_complete", "timeout"] = "timeout"
    """``--hicache-storage-prefetch-policy``; SGLang's default is ``timeout``."""
    prefetch_timeout_base_ms: float = Field(1000.0, ge=0)
    prefetch_timeout_per_ki_token_ms: float = Field(250.0, ge=0)
    """SGLang's ``prefetch_timeout_base`` (1 s) and ``prefetch_timeout_per_ki_token`` (0.25 s)."""
    max_prefill_tokens: int = Field(16384, ge=1)
    chunked_prefill_size: int = Field(8192, ge=1)
    max_running_requests: int = Field(1024, ge=1)
    init_new_token_ratio: float = Field(0.7, gt=0, le=1)
    min_new_token_ratio_factor: float = Field(0.14, gt=0, le=1)
    new_token_ratio_decay_steps: int = Field(600, ge=1)
    retract_decode_steps: int = Field(20, ge=0)


class EngineMetrics(BaseModel):
    """What the engine did; the ``engine`` block of ``stagefate replay --json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int
    prefill_tokens: int
    """Tokens computed by prefill, re-runs of retracted requests included."""
    decode_tokens: int
    retractions: int
    evicted_tokens: int
    peak_running: int
    simulated_seconds: float
    busy_fraction: float
    """Share of the simulated time the engine ran a step (the rest it waited on arrivals or
    prefetches)."""
    queue_wait_ms: Percentiles
    """Admission waits: from a request's arrival to its first admission."""


class Percentiles(BaseModel):
    """Percentiles (nearest rank) of some waits, in ms: admissions', delayed turns'."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    p50: float
    p99: float

    @classmethod
    def of(cls, waits: list[float]) -> Percentiles:
        ordered = sorted(waits)

        def rank(share: float) -> float:
            if not ordered:
                return 0.0
            return round(ordered[max(0, math.ceil(share * len(ordered)) - 1)], 3)

        return cls(p50=rank(0.5), p99=rank(0.99))


@dataclass(eq=False)
class EngineRequest:
    trace: TraceRequest
    request_id: str
    prompt: torch.Tensor
    """The prompt's token ids (``input_length`` of them)."""
    key: TokenKey
    """The prompt cut to whole pages: what the tree and L3 can hold."""
    arrived_ms: float = 0.0
    """When it arrived on the replay's clock."""
    generated: int = 0
    admitted: bool = False
    """Admitted once already (a retracted request's re-admission is no queue wait)."""
    wait_started_ms: float | None = None
    """When admission first found its prefetch still on its way (the timeout's clock)."""
    requested_tokens: int = 0
    """What its prefetch asked for (the timeout grows with it)."""
    # while admitted
    node: Node | None = None
    """The tree node its prefix is locked on: tokens ``[0, tree_len)`` belong to the tree."""
    tree_len: int = 0
    tree_indices: torch.Tensor = field(default_factory=lambda: _EMPTY)
    own: torch.Tensor = field(default_factory=lambda: _EMPTY)
    """Slots it allocated, for tokens ``[tree_len, tree_len + own.numel())``."""
    computed: int = 0
    """Tokens of its sequence whose KV exists (prefix, splice and computed chunks)."""

    @property
    def sequence_len(self) -> int:
        return self.trace.input_length + self.generated

    @property
    def remaining_output(self) -> int:
        return max(self.trace.output_length - self.generated, 0)

    def sequence_key(self) -> TokenKey:
        """Prompt and output so far (output ids are unique to the request)."""
        start = OUTPUT_TOKEN_BASE + self.trace.index
        output = torch.arange(start, start + self.generated, dtype=torch.int64)
        return TokenKey.of(torch.cat([self.prompt, output]))


@dataclass
class _Books:
    """Where every admitted prompt token came from (the replay's books close on them)."""

    input_tokens: int = 0
    device_hit_tokens: int = 0
    spliced_tokens: int = 0
    prompt_tokens_computed: int = 0


class Engine:
    """Continuous batching over ``tree`` and ``device_pool``, prefetches through ``policy``."""

    def __init__(
        self,
        tree: PrefixTree,
        device_pool: SlotPool,
        policy: Policy,
        write_through: Callable[[TokenKey, torch.Tensor], object],
        costs: CostModel,
        options: EngineOptions,
        on_splice: Callable[[str], None] | None = None,
    ) -> None:
        """``on_splice(request_id)``: called right after an admission spliced L3 pages (an
        observer may then ask the policy which: :meth:`~.policy.Policy.spliced_keys`)."""
        self.tree, self.pool, self.policy = tree, device_pool, policy
        self.on_splice = on_splice
        self.write_through, self.costs, self.options = write_through, costs, options
        self.page = tree.page_size
        self.waiting: list[EngineRequest] = []
        self.running: list[EngineRequest] = []
        self.chunked: EngineRequest | None = None
        self.books = _Books()
        self._init_ratio = options.init_new_token_ratio
        self._min_ratio = self._init_ratio * options.min_new_token_ratio_factor
        self._ratio_decay = (
            self._init_ratio - self._min_ratio
        ) / options.new_token_ratio_decay_steps
        self.new_token_ratio = self._init_ratio
        self.steps = self.prefill_tokens = self.decode_tokens = 0
        self.retractions = self.evicted_tokens = self.peak_running = 0
        self.finished_indices: list[int] = []
        """The trace indices of the requests finished, in order (not the requests: their
        prompts would stay alive)."""
        self.busy_ms = 0.0
        self.queue_waits: list[float] = []
        self.prefetch_counts = dict.fromkeys(("issued", "retried", "timed_out", "hit"), 0)
        """What :class:`~.prefetches.PrefetchCounts` takes from the engine."""

    # ------------------------------------------------------------------ arrivals

    def arrive(self, request: EngineRequest) -> None:
        self.issue(request)
        self.waiting.append(request)

    def issue(self, request: EngineRequest, retry: bool = False) -> None:
        """Match the live tree and prefetch the rest of the prompt (at arrival, or a retry)."""
        matched = self.tree.match_prefix(request.key).length
        request.requested_tokens = len(request.key) - matched
        self.prefetch_counts["retried" if retry else "issued"] += 1
        self.policy.issue(request.request_id, request.key, matched)

    @property
    def finished(self) -> int:
        return len(self.finished_indices)

    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.chunked is not None)

    def next_deadline(self) -> float | None:
        """The earliest moment a blocked request's prefetch timeout lets it go."""
        if self.options.prefetch_policy != "timeout":
            return None
        deadlines = [
            self._deadline(request)
            for request in self.waiting
            if request.wait_started_ms is not None and self.policy.pending(request.request_id)
        ]
        return min(deadlines, default=None)

    def _deadline(self, request: EngineRequest) -> float:
        assert request.wait_started_ms is not None
        opts = self.options
        wait = opts.prefetch_timeout_base_ms
        wait += opts.prefetch_timeout_per_ki_token_ms * request.requested_tokens / 1024
        return request.wait_started_ms + wait

    # ------------------------------------------------------------------ one step

    def step(self, now: float) -> float | None:
        """One scheduling pass and forward pass; its duration in ms, or None when idle."""
        chunks: list[tuple[EngineRequest, int]] = []
        spliced = self._admit(now, chunks)
        decoding = self._reserve_decode()
        if not chunks and not decoding:
            return None
        self.steps += 1
        context = sum(request.sequence_len for request in decoding)
        duration = (
            self.costs.prefill_ms([(tokens, request.computed) for request, tokens in chunks])
            + self.costs.decode_ms(len(decoding), context)
            + self.costs.io_ms("load", spliced)
        )
        self._after_prefill(chunks)
        self._after_decode(decoding)
        self.peak_running = max(self.peak_running, len(self.running))
        self.busy_ms += duration
        return duration

    # ------------------------------------------------------------------ admission

    def _admit(self, now: float, chunks: list[tuple[EngineRequest, int]]) -> int:
        """Admit what fits; fill ``chunks`` with ``(request, tokens)``; return tokens spliced."""
        budget_tokens = self.options.max_prefill_tokens
        chunk_tokens = self.options.chunked_prefill_size
        room = self._memory_budget()
        if self.chunked is not None:
            request, self.chunked = self.chunked, None
            tokens = self._chunk(request, min(budget_tokens, chunk_tokens))
            if tokens:
                chunks.append((request, tokens))
                budget_tokens -= tokens
                chunk_tokens -= tokens
                room -= tokens
            else:
                self.chunked = request  # no room this step: it keeps its place
        spliced = 0
        for request in self._admission_order():
            if budget_tokens <= 0 or chunk_tokens < self.page or self.chunked is not None:
                break
            if len(self.running) + len(chunks) >= self.options.max_running_requests:
                break
            if not self._prefetch_settled(request, now):
                continue
            prefix = self.tree.match_prefix(request.key)
            extend = request.sequence_len - prefix.length
            reserve = min(request.remaining_output, CLIP_MAX_NEW_TOKENS)
            if extend + reserve + self.page > room:
                break  # SGLang's NO_TOKEN: the batch is full
            self.waiting.remove(request)
            if not request.admitted:
                request.admitted = True
                self.queue_waits.append(now - request.arrived_ms)
            tail = self.policy.admit(request.request_id, prefix, self.make_room)
            spliced += tail.numel()
            self.prefetch_counts["hit"] += bool(tail.numel())
            if tail.numel() and self.on_splice is not None:
                self.on_splice(request.request_id)
            self._lock_prefix(request, prefix.length + tail.numel())
            self._count_admission(request, prefix.length, tail.numel())
            tokens = self._chunk(request, min(budget_tokens, chunk_tokens))
            if not tokens:  # the budget's estimate was short of room: it goes on next step
                self.chunked = request
                break
            chunks.append((request, tokens))
            budget_tokens -= tokens
            chunk_tokens -= tokens
            room -= extend + reserve + self.page
        return spliced

    def _admission_order(self) -> list[EngineRequest]:
        if self.options.schedule == "lpm" and len(self.waiting) <= LPM_QUEUE_LIMIT:
            lengths = {id(r): self.tree.match_prefix(r.key).length for r in self.waiting}
            return sorted(self.waiting, key=lambda r: -lengths[id(r)])  # stable: FCFS on ties
        return list(self.waiting)

    def _prefetch_settled(self, request: EngineRequest, now: float) -> bool:
        """SGLang's ``check_prefetch_progress``: may the request be admitted now?"""
        if not self.policy.pending(request.request_id):
            return True
        policy = self.options.prefetch_policy
        if policy == "timeout":
            if request.wait_started_ms is None:
                request.wait_started_ms = now
            if self._deadline(request) > now:
                return False
        elif policy == "wait_complete":
            return False
        self.prefetch_counts["timed_out"] += 1
        self.policy.terminate(request.request_id)
        return True

    def _memory_budget(self) -> float:
        """Free + evictable tokens minus the running requests' decode reservations."""
        reserved = sum(
            min(request.remaining_output, CLIP_MAX_NEW_TOKENS) * self.new_token_ratio
            for request in self.running
        )
        return self.pool.available() + self.tree.evictable_size - reserved

    def _lock_prefix(self, request: EngineRequest, cached: int) -> None:
        match = self.tree.match_prefix(request.key.prefix(cached))
        assert match.length == cached, "the splice is in the tree"
        self.tree.inc_lock_ref(match.last_node)
        request.node, request.tree_len, request.tree_indices = (
            match.last_node,
            cached,
            match.device_indices,
        )
        request.computed = cached

    def _count_admission(self, request: EngineRequest, hit: int, spliced: int) -> None:
        books = self.books
        books.input_tokens += request.trace.input_length
        books.device_hit_tokens += hit
        books.spliced_tokens += spliced
        books.prompt_tokens_computed += request.trace.input_length - hit - spliced

    def _chunk(self, request: EngineRequest, limit: int) -> int:
        """Allocate KV for the request's next prefill chunk; its length (0: no room now)."""
        remaining = request.sequence_len - request.computed
        tokens = remaining if remaining <= limit else limit // self.page * self.page
        if not self._grow(request, request.computed + tokens):
            return 0
        if tokens < remaining:
            self.chunked = request
        return tokens

    # ------------------------------------------------------------------ memory

    def make_room(self, tokens: int, keep: Node) -> bool:
        """Evict LRU leaves (never ``keep``'s path) until ``tokens`` slots are free; counted."""
        self.evicted_tokens += evict_for(self.tree, self.pool, tokens, keep)
        return self.pool.available() >= tokens

    def _grow(self, request: EngineRequest, tokens: int) -> bool:
        """Own slots for the first ``tokens`` of the sequence, allocated in whole pages."""
        have = request.tree_len + request.own.numel()
        if tokens <= have:
            return True
        pages = -(-(tokens - have) // self.page) * self.page
        if not self.make_room(pages, request.node):
            return False
        slots = self.pool.alloc(pages)
        assert slots is not None
        request.own = torch.cat([request.own, slots])
        return True

    # ------------------------------------------------------------------ decode

    def _reserve_decode(self) -> list[EngineRequest]:
        """KV for one more token of every running request, retracting until it fits."""
        need = [r for r in self.running if r.tree_len + r.own.numel() < r.sequence_len]
        if len(need) * self.page > self.pool.available() + self.tree.evictable_size:
            self._retract(need)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self._ratio_decay, self._min_ratio)
        for request in list(self.running):
            if not self._grow(request, request.sequence_len):
                # Even alone it does not fit (prefetch pins, a chunked prefill hold the rest):
                # SGLang would abort it; here it waits for room, so no request is lost.
                self._retract_one(request)
        return list(self.running)

    def _retract(self, need: list[EngineRequest]) -> None:
        # keep order: most output first, then shortest prompt; retract from the end
        order = sorted(
            self.running, key=lambda r: (r.generated, -r.trace.input_length), reverse=True
        )
        needing = {id(r) for r in need}
        while len(order) > 1:
            pages = sum(1 for r in order if id(r) in needing) * self.page
            if pages <= self.pool.available() + self.tree.evictable_size:
                break
            self._retract_one(order.pop())
        decoded = sum(r.generated for r in self.running)
        max_new = sum(r.trace.output_length for r in self.running)
        steps = self.options.retract_decode_steps
        self.new_token_ratio = min(1.0, (decoded + steps * len(self.running)) / (max_new + 1))

    def _retract_one(self, request: EngineRequest) -> None:
        """Free its KV (it does not enter the tree) and queue it again at the end."""
        self._release(request)
        request.computed = 0
        self.running.remove(request)
        self.waiting.append(request)
        self.retractions += 1

    # ------------------------------------------------------------------ after the forward

    def _after_prefill(self, chunks: list[tuple[EngineRequest, int]]) -> None:
        for request, tokens in chunks:
            request.computed += tokens
            self.prefill_tokens += tokens
            self._publish(request, min(request.computed, request.trace.input_length))
            if request is self.chunked:
                continue
            if request.remaining_output:
                request.generated += 1  # the prefill samples the first output token
            if request.remaining_output:  # (that token may have been its last)
                self.running.append(request)
            else:
                self._finish(request)

    def _after_decode(self, decoding: list[EngineRequest]) -> None:
        for request in decoding:
            request.generated += 1
            request.computed += 1
            self.decode_tokens += 1
            if not request.remaining_output:
                self.running.remove(request)
                self._finish(request)

    def _publish(self, request: EngineRequest, tokens: int, key: TokenKey | None = None) -> None:
        """Whole pages of the sequence's first ``tokens`` enter the tree; the lock follows."""
        key = (key or request.key).prefix(tokens // self.page * self.page)
        length = len(key)
        if length <= request.tree_len:
            return
        slots = torch.cat([request.tree_indices, request.own[: length - request.tree_len]])
        present, node = self.tree.insert_node(key, slots)
        if present > request.tree_len:  # a sibling published these meanwhile: ours are spare
            self.pool.free(request.own[: present - request.tree_len])
        self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(request.node)
        request.node, request.own = node, request.own[length - request.tree_len :]
        request.tree_len, request.tree_indices = length, self.tree.match_prefix(key).device_indices

    def _finish(self, request: EngineRequest) -> None:
        self._publish(request, request.computed, request.sequence_key())
        prompt_pages = len(request.key)
        self.write_through(request.key, request.tree_indices[:prompt_pages])
        self._release(request)
        self.finished_indices.append(request.trace.index)

    def _release(self, request: EngineRequest) -> None:
        """Give back the request's lock and the slots it owns (they never entered the tree)."""
        if request.own.numel():
            self.pool.free(request.own)
        self.tree.dec_lock_ref(request.node)
        request.node, request.tree_len, request.tree_indices, request.own = None, 0, _EMPTY, _EMPTY

    # ------------------------------------------------------------------ results

    def metrics(self, simulated_ms: float) -> EngineMetrics:
        return EngineMetrics(
            steps=self.steps,
            prefill_tokens=self.prefill_tokens,
            decode_tokens=self.decode_tokens,
            retractions=self.retractions,
            evicted_tokens=self.evicted_tokens,
            peak_running=self.peak_running,
            simulated_seconds=round(simulated_ms / 1e3, 3),
            busy_fraction=round(self.busy_ms / simulated_ms, 6) if simulated_ms else 0.0,
            queue_wait_ms=Percentiles.of(self.queue_waits),
        )
