"""When each request arrives: at its trace time (open loop), or after the turn it follows.

Open-loop arrivals are the trace's timestamps divided by the replay's speed. Causal arrivals
(:mod:`.conversations` says how turns are found) hold a turn until the turn before it has
finished, then let it arrive at the later of its own time and that finish plus the trace's gap
between the two turns (at the replay's speed): a user answers what they read, so a faster
replay cannot make them ask before the answer came.
"""

from __future__ import annotations

import heapq

from pydantic import BaseModel, ConfigDict

from .conversations import Turns
from .engine_model import Percentiles
from .trace import TraceRequest


class ArrivalMetrics(BaseModel):
    """The ``arrivals`` block of ``stagefate replay --json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: str
    """``open`` (the trace's times) or ``causal`` (a turn after the one it follows)."""
    turns: int
    """Requests that follow an earlier turn of their conversation."""
    turns_whole_prompt: int
    """Of them, those that extend the turn before's whole prompt (it ended on a whole block)."""
    turns_less_partial_block: int
    """Those that extend the turn before less its partial last block (Mooncake's re-hash)."""
    shared_prefixes: int
    """Prompts or kept prefixes several requests extend or share: not turns."""
    delayed: int
    """Turns that arrived later than their trace time."""
    delay_ms: Percentiles
    """How much later, over the delayed turns."""


class Arrivals:
    """The requests still to arrive, in arrival order."""

    def __init__(self, trace: list[TraceRequest], speed: float, turns: Turns, causal: bool) -> None:
        self._speed = speed
        self._start = trace[0].timestamp_ms
        self._turns = turns
        self._causal = causal
        self._by_index = {item.index: item for item in trace}
        self._heap: list[tuple[float, int]] = []
        self._held: dict[int, list[int]] = {}
        """A turn's index → the turns waiting for it to finish."""
        for item in trace:
            before = turns.predecessor.get(item.index) if causal else None
            if before is None:
                self._heap.append((self.trace_ms(item), item.index))
            else:
                self._held.setdefault(before, []).append(item.index)
        heapq.heapify(self._heap)
        self.arrived_ms: dict[int, float] = {}
        self._delays: list[float] = []

    def trace_ms(self, item: TraceRequest) -> float:
        """When ``item`` arrives open-loop."""
        return (item.timestamp_ms - self._start) / self._speed

    def __bool__(self) -> bool:
        return bool(self._heap or self._held)

    def next_ms(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[TraceRequest]:
        """The requests whose arrival has come, in order (their arrival times recorded)."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            at, index = heapq.heappop(self._heap)
            self.arrived_ms[index] = at
            out.append(self._by_index[index])
        return out

    def finished(self, index: int, at_ms: float) -> None:
        """Request ``index`` finished at ``at_ms``: the turns that follow it may arrive."""
        for follower in self._held.pop(index, []):
            item, before = self._by_index[follower], self._by_index[index]
            own = self.trace_ms(item)
            arrival = max(own, at_ms + (item.timestamp_ms - before.timestamp_ms) / self._speed)
            if arrival > own:
                self._delays.append(arrival - own)
            heapq.heappush(self._heap, (arrival, follower))

    def metrics(self) -> ArrivalMetrics:
        return ArrivalMetrics(
            mode="causal" if self._causal else "open",
            turns=len(self._turns.predecessor),
            turns_whole_prompt=self._turns.whole_prompt,
            turns_less_partial_block=len(self._turns.less_partial_block),
            shared_prefixes=self._turns.shared_prefixes,
            delayed=len(self._delays),
            delay_ms=Percentiles.of(self._delays),
        )
