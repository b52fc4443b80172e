"""``stagefate replay``: a trace replayed through a continuous-batching engine, one policy a run.

Theory of operation
-------------------
Time is simulated milliseconds from the trace's first arrival, advanced from event to event.
Requests arrive at their trace timestamps (divided by ``speed``); the engine (:mod:`.engine_model`,
with its own essay) runs back-to-back steps while it has work, each taking the cost model's
time. Before every step the replay:

1. takes the arrivals due: each matches the live device tree and issues a prefetch of the rest
   of its prompt through the policy, then joins the waiting queue;
2. completes the IO operations whose modelled time has come and lets the policy poll (SGLang's
   ``check_hicache_events``, once per scheduling pass);
3. re-issues the due paced retries of waiting requests (the queue head's at once: stagefate's
   retry book never delays the head; SGLang 0.5.23 instead cancels the head's retry);

then runs one engine step and gives every IO operation queued meanwhile its completion time: it
waits for a free server (``l3_channels`` for storage, one copy stream for H2D), then takes the
cost model's time, scaled by a seeded jitter of up to ``io_jitter`` either way. When the engine
has nothing to run (everything waits on a prefetch) the clock jumps to the next arrival, IO
completion or prefetch timeout.

The policy decides the fate of every prefetch; the engine is the same for all of them, so the
figures differ only by what the policy does with the live tree.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..runtime import Storage, TokenKey
from ..statemachine.config import PipelineConfig
from ..statemachine.group import Group
from .arrivals import ArrivalMetrics, Arrivals
from .conversations import infer_turns
from .costs import CostModel
from .engine_model import Engine, EngineMetrics, EngineOptions, EngineRequest
from .policy import PolicyFactory, PolicyInputs
from .prefetches import PrefetchCounts
from .trace import TraceRequest

DEFAULT_SPEED = 0.3
"""One H200 running Llama-3.1-8B has about a third of the prefill capacity the trace's arrival
rate asks for (at speed 1 the embedded slice keeps it busy 3.3 times longer than its 241 s of
arrivals), so by default arrivals come at 0.3x: the engine runs near its capacity."""


class ReplayOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    page_size: int = Field(64, ge=1)
    device_tokens: int | None = Field(None, ge=1)
    """The device KV pool; None: what the cost model's GPU holds after the model's weights."""
    host_tokens: int = Field(256 * 1024, ge=1)
    """The host bounce buffer (staging only)."""
    prefetch_threshold: int = Field(256, ge=1)
    """Spans shorter than this are not fetched (SGLang's default ``prefetch_threshold``)."""
    speed: float = Field(DEFAULT_SPEED, gt=0)
    """Arrival timestamps are divided by this: 2 replays the trace twice as fast."""
    seed: int = Field(0, ge=0)
    storage: str = "memory"
    """The L3: ``memory``, ``file:PATH`` or ``mooncake://HOST:PORT``."""
    dedup_inflight: bool = True
    tree: str = "stagefate"
    """The radix tree: stagefate's, or ``sglang-python`` / ``sglang-rust`` (``make sglang``)."""
    io_jitter: float = Field(0.2, ge=0, lt=1)
    arrivals: Literal["open", "causal"] = "open"
    """``open``: each request at its trace time; ``causal``: a conversation's turn after the
    turn it follows has finished (:mod:`.arrivals`)."""
    tp_size: int = Field(1, ge=1)
    """Tensor-parallel ranks: one engine and pipeline per rank over its shard, agreeing every
    pass (:mod:`.ranks`)."""
    costs: CostModel = CostModel()
    engine: EngineOptions = EngineOptions()


class WastedReads(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    reads: int
    tokens: int


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
    """Prompt tokens computed at admission (a retracted request's re-run counts again)."""
    declined_anchor_lost: int
    declined_device_covered: int
    hit_rate: float
    """Share of admitted prompt tokens not computed: found on the device or spliced."""
    wall_seconds: float
    wasted_by_reason: dict[str, WastedReads]
    """Wasted reads and tokens by why (docs/replay.md); they add up to the two totals."""
    engine: EngineMetrics
    arrivals: ArrivalMetrics
    prefetches: PrefetchCounts
    l3_damage: str = ""
    """Pages L3 found damaged and healed during the run, in words ("" when none were)."""


def replay_config(
    options: ReplayOptions, trace: list[TraceRequest], rank: int = 0
) -> PipelineConfig:
    """The pipeline a replay of ``trace`` runs (rank ``rank`` of ``options.tp_size``)."""
    page = options.page_size
    longest = max(request.input_length + request.output_length for request in trace)
    max_context = -(-longest // page) * page + page
    pool = options.device_tokens or options.costs.device_kv_tokens()
    device_tokens = -(-pool // page) * page
    if device_tokens < 2 * max_context:
        given = (
            f"--device-tokens {pool:,}"
            + ("" if pool == device_tokens else f" ({device_tokens:,} in whole pages)")
            if options.device_tokens
            else f"the GPU's {device_tokens:,} KV tokens"
        )
        raise ValueError(
            f"{given} cannot hold the trace's longest request ({longest:,} tokens of prompt "
            f"and output) twice over; pass --device-tokens {2 * max_context} or more (or a "
            "GPU with more memory)"
        )
    return PipelineConfig(
        page_size=page,
        layers=1,
        kv_heads=options.tp_size,  # one head a rank: the replay's KV is only a placeholder
        head_dim=1,
        device_tokens=device_tokens,
        host_tokens=-(-options.host_tokens // page) * page,
        max_context_len=max_context,
        prefetch_threshold=-(-options.prefetch_threshold // page) * page,
        device="cpu",
        io="manual",
        dedup_inflight=options.dedup_inflight,
        storage=options.storage,
        tp_size=options.tp_size,
        tp_rank=rank,
    )


STALLED = (
    "the replay stalled: requests wait but nothing can run and no event is due (device pool too "
    "small for what the prefetches pin); pass a larger --device-tokens"
)


class Replay:
    """One policy over one trace; :meth:`run` returns its metrics."""

    def __init__(
        self,
        policy: PolicyFactory,
        trace: list[TraceRequest],
        options: ReplayOptions | None = None,
        storage: Storage | None = None,
        group: Group | None = None,
        arrivals: Arrivals | None = None,
        on_splice: Callable[[str], None] | None = None,
    ) -> None:
        """``group``: this replay is one tensor-parallel rank of ``options.tp_size``
        (:mod:`.ranks` builds them all). ``arrivals``: the requests come from outside (an
        instance behind a router, :mod:`.instances`), through :meth:`advance`. ``on_splice``:
        the engine's observer of admissions that spliced (:class:`~.engine_model.Engine`)."""
        self.options = opts = options or ReplayOptions()
        config = replay_config(opts, trace, 0 if group is None else group.rank)
        inputs = PolicyInputs(config, storage, opts.tree, opts.engine.prefetch_policy, group)
        self.policy = policy(inputs)
        self.engine = Engine(
            self.policy.tree,
            self.policy.device_pool,
            self.policy,
            self.policy.write_through,
            opts.costs,
            opts.engine,
            on_splice,
        )
        self.owns_arrivals = arrivals is None
        self.arrivals = (
            arrivals
            if arrivals is not None  # an Arrivals is falsy once nothing is left to arrive
            else Arrivals(trace, opts.speed, infer_turns(trace), opts.arrivals == "causal")
        )
        self.requests = 0
        """Requests that arrived here."""
        self.stepped = False
        """Whether the last :meth:`advance` ran a step (else it waits for its next event, and
        an arrival may wake it sooner)."""
        self._random = random.Random(opts.seed)
        self._due: list[tuple[float, int]] = []
        self._timed: set[int] = set()
        # when each server is next free: L3 channels, and the H2D copy stream
        self._servers = {"l3": [0.0] * opts.costs.l3_channels, "h2d": [0.0]}

    # ------------------------------------------------------------------ the loop

    def run(self, on_request: Callable[[], None] | None = None) -> ReplayMetrics:
        """Replay the whole trace; the metrics are also kept as :attr:`metrics`."""
        started = time.perf_counter()
        arrivals = self.arrivals
        now = 0.0
        while arrivals or self.has_work():
            now = self.advance(now, arrivals.due(now), on_request)
            if now == math.inf:
                raise RuntimeError(STALLED)
        return self.close(now, time.perf_counter() - started)

    def has_work(self) -> bool:
        """Requests in the engine, or IO operations not yet completed."""
        return self.engine.busy() or bool(self.policy.io.pending())

    def advance(
        self,
        now: float,
        arrived: list[TraceRequest],
        on_request: Callable[[], None] | None = None,
    ) -> float:
        """One pass at ``now``: ``arrived`` join, IO due completes, due retries re-issue, one
        engine step runs. When this engine next acts: the step's end, else its next event
        (inf: it has work and no event will come, a stall), else ``now`` (it is idle)."""
        engine = self.engine
        for item in arrived:  # prompts are synthesized at arrival: a trace's would be ~0.5 GB
            engine.arrive(self._request(item, self.arrivals.arrived_ms[item.index]))
            self.requests += 1
            if on_request is not None:
                on_request()
        self._complete_io(now)
        by_id = {request.request_id: request for request in engine.waiting}
        for request_id in self.policy.due_retries(list(by_id)):
            engine.issue(by_id[request_id], retry=True)
        finished = engine.finished
        duration = engine.step(now)
        self._time_new_ops(now)
        self.stepped = duration is not None
        if duration is None:
            pending_arrival = self.owns_arrivals and bool(self.arrivals)
            return self._next_event(now) if self.has_work() or pending_arrival else now
        now += duration
        for index in engine.finished_indices[finished:]:
            self.arrivals.finished(index, now)
        return now

    def close(self, now: float, wall_seconds: float) -> ReplayMetrics:
        """The trace is done at ``now``: background work lands, the figures are taken."""
        self.policy.finish()
        self.metrics = self._metrics(now, wall_seconds)
        return self.metrics

    def _request(self, item: TraceRequest, arrived_ms: float) -> EngineRequest:
        prompt = item.tokens()
        # The last prompt token is always computed (it yields the first output token), so the
        # cacheable key stops before it, as SGLang's prefix match does.
        key = TokenKey.of(prompt[: item.input_length - 1]).whole_pages(self.options.page_size)
        return EngineRequest(item, f"r{item.index}", prompt, key, arrived_ms)

    def _next_event(self, now: float) -> float:
        """The earliest of this engine's own events (and the next arrival, where the replay
        owns its arrivals); inf when there is none."""
        times = [math.inf]
        upcoming_arrival = self.arrivals.next_ms() if self.owns_arrivals else None
        if upcoming_arrival is not None:
            times.append(upcoming_arrival)
        if self._due:
            times.append(self._due[0][0])
        deadline = self.engine.next_deadline()
        if deadline is not None:
            times.append(deadline)
        return max(now, min(times))

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

    # ------------------------------------------------------------------ results

    def _metrics(self, simulated_ms: float, wall_seconds: float) -> ReplayMetrics:
        counters = self.policy.counters()
        books = self.engine.books
        computed = books.prompt_tokens_computed
        hit = 1 - computed / books.input_tokens if books.input_tokens else 0.0
        wasted = {
            reason: WastedReads(reads=reads, tokens=tokens)
            for reason, (reads, tokens) in sorted(self.policy.wasted_by_reason().items())
        }
        return ReplayMetrics(
            requests=self.requests,
            prefill_tokens_computed=computed,
            hit_rate=round(hit, 6),
            wall_seconds=round(wall_seconds, 3),
            wasted_by_reason=wasted,
            engine=self.engine.metrics(simulated_ms),
            arrivals=self.arrivals.metrics(),
            prefetches=PrefetchCounts.of(self.engine.prefetch_counts, self.policy.declines()),
            l3_damage=self.policy.l3_damage(),
            **counters,
        )
