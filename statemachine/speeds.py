"""What a load and a forward cost, measured while serving, and the estimate the IO commit reads.

A staged load is worth its memory only when it ends sooner than computing the same tokens
would. Neither cost is a constant: a load's time is mostly latency on one machine and
bandwidth on another, and a forward's time per token depends on the model, the device and the
batch. So both are measured while serving: the pipeline times its own L3 reads
(:meth:`LoadSpeeds.observe_load`, from the completions a timing executor such as
:class:`~stagefate.runtime.ThreadedIO` gives: tokens read, seconds from submission to done),
and the engine reports its forwards (:meth:`LoadSpeeds.observe_forward`: tokens computed,
seconds). The spec's ``load_slower_than_compute`` guard reads a :class:`SpeedEstimate`: one rank
the current one (kept until the next observation changes it, since the guard runs at every
issue and commit), tensor-parallel ranks the one they agreed at the pass's start. The read is
what a load costs beyond computing: either way the request then waits for admission and a
forward.

A load is modelled as a fixed latency plus a cost per token (a least-squares line over the
recent reads, older ones weighing less); a forward as a cost per token. Until both have been
observed the estimate knows nothing and declines nothing, so an engine that reports no forward
loads every hit as before. A read still running is evidence too
(:meth:`LoadSpeeds.observe_running_read`): the oldest read in flight has taken at least its time
so far, so the estimate's latency is never below it. That is what stops a burst of hits from all
reading a slow L3 before the first of their reads has landed.

The first reads of a slow L3 are committed before any read has been timed, and one that
turns out slow must not hold its request longer than computing would: the scheduler asks
``give_up_slow_read`` before keeping a request waiting, and a read that has run longer than
computing its tokens takes (:meth:`SpeedEstimate.computes_sooner`) loses its request, which
computes. That bounds what an unmeasured L3 costs a request at about twice its compute time.

The estimate is three integers of nanoseconds, so that tensor-parallel ranks can agree one
(the smallest of each, through the pass's agreement: docs/tensor-parallel.md) and every rank's
guard answers alike.
"""

from __future__ import annotations

from dataclasses import dataclass

UNKNOWN = -1
"""A cost not measured yet (and, agreed as a MIN, a cost some rank has not measured)."""


@dataclass(frozen=True)
class SpeedEstimate:
    """A load's fixed cost and cost per token, and a forward's cost per token, in nanoseconds
    (:data:`UNKNOWN` for a cost not measured)."""

    load_latency_ns: int = UNKNOWN
    load_ns_per_token: int = UNKNOWN
    compute_ns_per_token: int = UNKNOWN

    @property
    def known(self) -> bool:
        """Whether every cost has been measured (otherwise nothing is declined)."""
        return min(self.as_facts()) > UNKNOWN

    def load_slower_than_compute(self, tokens: int) -> bool:
        """Whether loading ``tokens`` would take longer than computing them."""
        if not self.known or tokens <= 0:
            return False
        load = self.load_latency_ns + self.load_ns_per_token * tokens
        return load > self.compute_ns_per_token * tokens

    def computes_sooner(self, tokens: int, seconds: float) -> bool:
        """Whether computing ``tokens`` would have taken less than ``seconds`` (a read that has
        run that long loses to computing whenever it lands); False before a forward has been
        measured."""
        compute = self.compute_ns_per_token
        return compute > UNKNOWN and tokens > 0 and compute * tokens < seconds * 1e9

    def as_facts(self) -> list[int]:
        """The three costs, in the order :meth:`of_facts` reads them."""
        return [self.load_latency_ns, self.load_ns_per_token, self.compute_ns_per_token]

    @classmethod
    def of_facts(cls, facts: list[int]) -> SpeedEstimate:
        """The estimate the ranks agreed (:meth:`as_facts` of each, reduced)."""
        latency, per_token, compute = facts
        return cls(latency, per_token, compute)


class LoadSpeeds:
    """Loads and forwards as the engine measured them; :meth:`estimate` for the IO commit.

    ``memory``: how much an older observation still weighs against a new one (each new
    observation multiplies the weight of every older one by it).
    """

    def __init__(self, memory: float = 0.9) -> None:
        if not 0.0 < memory < 1.0:
            raise ValueError(
                f"memory={memory}: the weight an older observation keeps must lie in (0, 1); "
                "0.9 remembers about the last ten loads"
            )
        self.memory = memory
        self._loads = _WeightedLine()
        self._forward_seconds = 0.0
        self._forward_tokens = 0.0
        self._running: tuple[int, float] | None = None
        self._estimate: SpeedEstimate | None = None
        """The estimate of the observations so far; None once one changed them."""

    def observe_load(self, tokens: int, seconds: float) -> None:
        """An L3 read of ``tokens`` took ``seconds`` from its submission to its end."""
        if _usable(tokens, seconds, "observe_load"):
            self._loads.add(float(tokens), seconds, self.memory)
            self._estimate = None

    def observe_forward(self, tokens: int, seconds: float) -> None:
        """A forward computing ``tokens`` tokens (a prefill's, or a batch's) took ``seconds``."""
        if _usable(tokens, seconds, "observe_forward"):
            keep = self.memory
            self._forward_seconds = keep * self._forward_seconds + seconds
            self._forward_tokens = keep * self._forward_tokens + tokens
            self._estimate = None

    def observe_running_read(self, tokens: int, seconds: float) -> None:
        """The oldest L3 read in flight, of ``tokens``, has run ``seconds`` so far (reported
        every pass; ``tokens`` 0 when no read is in flight): a load takes at least that long."""
        running = (tokens, seconds) if _usable(tokens, seconds, "observe_running_read") else None
        if running != self._running:  # reported every pass, mostly "none in flight"
            self._running, self._estimate = running, None

    def forget(self) -> None:
        """Forget every observation (the estimate knows nothing again)."""
        self._loads = _WeightedLine()
        self._forward_seconds = self._forward_tokens = 0.0
        self._running = self._estimate = None

    def estimate(self) -> SpeedEstimate:
        """The costs as observed so far."""
        if self._estimate is None:
            self._estimate = self._fitted()
        return self._estimate

    def _fitted(self) -> SpeedEstimate:
        compute = UNKNOWN
        if self._forward_tokens > 0:
            compute = _nanoseconds(self._forward_seconds / self._forward_tokens)
        line = self._loads.fit()
        if line is None and self._running is None:
            return SpeedEstimate(compute_ns_per_token=compute)
        latency, per_token = (0.0, 0.0) if line is None else line
        if self._running is not None:  # the read in flight has taken at least this long
            tokens, seconds = self._running
            latency = max(latency, seconds - per_token * tokens)
        return SpeedEstimate(_nanoseconds(latency), _nanoseconds(per_token), compute)


class _WeightedLine:
    """``seconds = latency + per_token * tokens``, fitted by weighted least squares."""

    def __init__(self) -> None:
        self.weight = self.tokens = self.seconds = self.tokens_sq = self.cross = 0.0

    def add(self, tokens: float, seconds: float, memory: float) -> None:
        self.weight = memory * self.weight + 1.0
        self.tokens = memory * self.tokens + tokens
        self.seconds = memory * self.seconds + seconds
        self.tokens_sq = memory * self.tokens_sq + tokens * tokens
        self.cross = memory * self.cross + tokens * seconds

    def fit(self) -> tuple[float, float] | None:
        """(latency, seconds per token), both at least 0; None before any load. Loads all of
        one size tell no slope: their mean is the latency."""
        if self.weight == 0.0:
            return None
        mean_tokens, mean_seconds = self.tokens / self.weight, self.seconds / self.weight
        spread = self.tokens_sq / self.weight - mean_tokens * mean_tokens
        if spread <= 1e-9 * max(1.0, mean_tokens * mean_tokens):
            return mean_seconds, 0.0
        per_token = max(0.0, (self.cross / self.weight - mean_tokens * mean_seconds) / spread)
        latency = max(0.0, mean_seconds - per_token * mean_tokens)
        return latency, per_token


def _usable(tokens: int, seconds: float, call: str) -> bool:
    """A measurement worth keeping; a nonsensical one is refused naming the call."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"{call}: tokens={tokens!r} must be an int of at least 0")
    if not seconds >= 0.0:  # NaN fails this too
        raise ValueError(f"{call}: seconds={seconds!r} must be a duration of at least 0")
    return tokens > 0


def _nanoseconds(seconds: float) -> int:
    return round(seconds * 1e9)
