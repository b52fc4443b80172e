"""``stagefate replay``: a discrete-event scheduler simulation over a Mooncake-format trace.

Theory of operation
-------------------
One engine, one prefill at a time, FIFO admission; time is simulated milliseconds, advanced from
event to event (an arrival, an IO completion due, a prefill finishing, the queue head's prefetch
timeout). At every event the replay:

1. takes the arrivals due: each matches the live device tree and issues a prefetch of the rest
   (the policy declines spans below the threshold or absent from L3);
2. completes the IO operations whose modelled time has come, then lets the policy poll;
3. re-issues due retries of waiting requests (``due_retries``);
4. finishes the running prefill: its computed pages are inserted into the tree and written
   through to L3, so later requests find them on the device or in L3;
5. admits the queue head when the engine is free and the head's prefetch is settled (or waited
   past its timeout, which grows with the span): it re-matches the live tree, lets the policy
   splice what it staged (``plan_staged_splice`` + ``init_load_back`` for ``live``), pins the
   request's prefix, allocates device slots for the rest (evicting LRU leaves) and computes it.

The device pool is far smaller than the trace's working set, so eviction, splits and sibling
publishes (a request computed and inserted while another's read of the same span is in flight)
happen for real. IO operations get their completion time when they are queued: they wait for a
free server (``l3_channels`` for storage, one copy stream for H2D), then take the cost model's
time, scaled by a seeded jitter of up to ``io_jitter`` either way.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field

from ..runtime import Storage, TokenKey
from ..runtime.prefix_tree import Node, alloc_evicting
from ..statemachine.config import PipelineConfig
from ..statemachine.pipeline import BufferPipeline
from .costs import CostModel
from .policies import BlindPolicy, LivePolicy, Policy
from .trace import TraceRequest

POLICIES: dict[str, Callable[[BufferPipeline], Policy]] = {
    "live": LivePolicy,
    "blind": BlindPolicy,
}


class ReplayOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    page_size: int = Field(64, ge=1)
    device_tokens: int = Field(512 * 1024, ge=1)
    """The device KV pool; the default holds a few dozen average prompts of the trace."""
    host_tokens: int = Field(256 * 1024, ge=1)
    seed: int = 0
    storage: str = "memory"
    """The L3: ``memory``, ``file:PATH`` or ``mooncake://HOST:PORT``."""
    dedup_inflight: bool = True
    io_jitter: float = Field(0.2, ge=0, lt=1)
    costs: CostModel = CostModel()


class ReplayMetrics(BaseModel):
    """One policy's outcome; the field names are the JSON keys of ``stagefate replay --json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int
    l3_reads: int
    l3_read_tokens: int
    l3_reads_wasted: int
    """Spans read from L3 and then discarded (nothing of them spliced)."""
    l3_read_tokens_wasted: int
    """Tokens read from L3 and not spliced (whole discarded spans, trimmed heads, short tails)."""
    tokens_spliced: int
    tokens_trimmed: int
    prefill_tokens_computed: int
    declined_anchor_lost: int
    declined_device_covered: int
    hit_rate: float
    """Share of prompt tokens not computed: found on the device at admission or spliced."""
    wall_seconds: float


@dataclass(eq=False)
class _Request:
    trace: TraceRequest
    request_id: str
    key: TokenKey
    """The prompt cut to whole pages: what the tree and L3 can hold."""
    issued_ms: float = 0.0
    span_tokens: int = 0
    """When its last prefetch was issued and what it asked for: admission waits for it from
    then, for a time that grows with the span."""


@dataclass(eq=False)
class _Running:
    request: _Request
    finish_ms: float
    cached: int
    """Tokens of the prompt already on the device when it was admitted (prefix + splice)."""
    node: Node
    slots: torch.Tensor | None
    """Device slots for the computed pages (None: no room; they are computed, not cached)."""


class Replay:
    """One policy over one trace; :meth:`run` returns its metrics."""

    def __init__(
        self,
        policy: str,
        trace: list[TraceRequest],
        options: ReplayOptions | None = None,
        storage: Storage | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {sorted(POLICIES)}")
        self.options = opts = options or ReplayOptions()
        longest = max(request.input_length for request in trace)
        page = opts.page_size
        device_tokens = -(-opts.device_tokens // page) * page
        if device_tokens < 2 * longest:
            raise ValueError(
                f"device_tokens={opts.device_tokens} cannot hold the trace's longest prompt "
                f"({longest} tokens) twice over; pass --device-tokens {2 * longest} or more"
            )
        config = PipelineConfig(
            page_size=page,
            layers=1,
            kv_heads=1,
            head_dim=1,
            device_tokens=device_tokens,
            host_tokens=-(-opts.host_tokens // page) * page,
            max_context_len=-(-longest // page) * page,
            prefetch_threshold=page,
            device="cpu",
            io="manual",
            dedup_inflight=opts.dedup_inflight,
            storage=opts.storage,
        )
        self.pipe = BufferPipeline(config, storage=storage)
        self.policy = POLICIES[policy](self.pipe)
        self.trace = trace
        self._random = random.Random(opts.seed)
        self._due: list[tuple[float, int]] = []
        self._timed: set[int] = set()
        # when each server is next free: L3 channels, and the H2D copy stream
        self._servers = {"l3": [0.0] * opts.costs.l3_channels, "h2d": [0.0]}
        self.input_tokens = self.device_hit_tokens = self.prefill_tokens = 0

    # ------------------------------------------------------------------ the loop

    def run(self, on_request: Callable[[], None] | None = None) -> ReplayMetrics:
        """Replay the whole trace; the metrics are also kept as :attr:`metrics`."""
        started = time.perf_counter()
        # Prompts are synthesized at arrival: a full trace's tokens at once would be ~0.5 GB.
        arrivals = deque(self.trace)
        waiting: deque[_Request] = deque()
        running: _Running | None = None
        now = 0.0
        while arrivals or waiting or running is not None or self.policy.io.pending():
            now = self._next_event(now, arrivals, waiting, running)
            while arrivals and arrivals[0].timestamp_ms <= now:
                item = arrivals.popleft()
                page = self.options.page_size
                request = _Request(item, f"r{item.index}", item.tokens().whole_pages(page))
                self._issue(request, now)
                waiting.append(request)
                if on_request is not None:
                    on_request()
            self._complete_io(now)
            by_id = {request.request_id: request for request in waiting}
            for request_id in self.policy.due_retries(list(by_id)):
                self._issue(by_id[request_id], now)
            if running is not None and running.finish_ms <= now:
                self._finish(running)
                running = None
            if running is None and waiting and self._may_admit(waiting[0], now):
                running = self._admit(waiting.popleft(), now)
            self._time_new_ops(now)
        self.metrics = self._metrics(time.perf_counter() - started)
        return self.metrics

    def _next_event(
        self,
        now: float,
        arrivals: deque[TraceRequest],
        waiting: deque[_Request],
        running: _Running | None,
    ) -> float:
        times = [math.inf]
        if arrivals:
            times.append(arrivals[0].timestamp_ms)
        if self._due:
            times.append(self._due[0][0])
        if running is not None:
            times.append(running.finish_ms)
        elif waiting:
            times.append(self._deadline(waiting[0]))
        upcoming = min(times)
        assert upcoming < math.inf, "the replay stalled: no event left while work remains"
        return max(now, upcoming)

    def _deadline(self, request: _Request) -> float:
        if not self.policy.pending(request.request_id):
            return -math.inf  # admissible now
        return request.issued_ms + self.options.costs.prefetch_timeout(request.span_tokens)

    def _may_admit(self, request: _Request, now: float) -> bool:
        return self._deadline(request) <= now

    # ------------------------------------------------------------------ IO on the clock

    def _time_new_ops(self, now: float) -> None:
        costs, jitter = self.options.costs, self.options.io_jitter
        io = self.policy.io
        for kind in ("exists", "read", "load"):
            for op_id in io.queued(kind):
                if op_id in self._timed:
                    continue
                self._timed.add(op_id)
                scale = 1 + self._random.uniform(-jitter, jitter)
                duration = costs.io_ms(kind, self.policy.op_tokens(op_id)) * scale
                free_at = self._servers["h2d" if kind == "load" else "l3"]
                done = max(now, heapq.heappop(free_at)) + duration
                heapq.heappush(free_at, done)
                heapq.heappush(self._due, (done, op_id))

    def _complete_io(self, now: float) -> None:
        io = self.policy.io
        while self._due and self._due[0][0] <= now:
            _, op_id = heapq.heappop(self._due)
            self._timed.discard(op_id)
            io.complete(op_id)
        self.policy.poll()

    # ------------------------------------------------------------------ requests

    def _issue(self, request: _Request, now: float) -> None:
        match = self.pipe.tree.match_prefix(request.key)
        request.issued_ms, request.span_tokens = now, len(request.key) - match.length
        self.policy.issue(request.request_id, request.key, match.length)

    def _admit(self, request: _Request, now: float) -> _Running:
        tree = self.pipe.tree
        prefix = tree.match_prefix(request.key)
        tail = self.policy.admit(request.request_id, prefix)
        cached = prefix.length + tail.numel()
        node = tree.match_prefix(request.key.prefix(cached)).last_node
        tree.inc_lock_ref(node)  # the request's KV stays put while it computes
        new_pages = len(request.key) - cached
        slots = alloc_evicting(tree, self.pipe.device_pool, new_pages, node)
        computed = request.trace.input_length - cached
        self.input_tokens += request.trace.input_length
        self.device_hit_tokens += prefix.length
        self.prefill_tokens += computed
        costs = self.options.costs
        finish = now + costs.io_ms("load", tail.numel()) + costs.prefill_ms(computed)
        return _Running(request, finish, cached, node, slots)

    def _finish(self, running: _Running) -> None:
        tree, key = self.pipe.tree, running.request.key
        if running.slots is not None and running.slots.numel():
            prefix = tree.match_prefix(key.prefix(running.cached)).device_indices
            present = tree.insert(key, torch.cat([prefix, running.slots]))
            assert present == running.cached, "one prefill at a time: nothing else inserts"
            self.pipe.write_through(key, tree.match_prefix(key).device_indices)
        tree.dec_lock_ref(running.node)

    # ------------------------------------------------------------------ results

    def _metrics(self, wall_seconds: float) -> ReplayMetrics:
        counters = self.policy.counters()
        hit = 1 - self.prefill_tokens / self.input_tokens if self.input_tokens else 0.0
        return ReplayMetrics(
            requests=len(self.trace),
            prefill_tokens_computed=self.prefill_tokens,
            hit_rate=round(hit, 6),
            wall_seconds=round(wall_seconds, 3),
            **counters,
        )
