"""``replay --tp N``: one replay as N tensor-parallel ranks, each a whole engine, in lockstep.

Under tensor parallelism every rank runs a scheduler of its own over the same requests (each
SGLang TP rank runs a ``Scheduler``; the tokenizer's requests are broadcast to all), so a rank
here is a whole :class:`~.replay.Replay`: engine, tree, pools and a pipeline over its shard of
the KV heads (``tp_size`` and ``tp_rank`` in its config, its L3 keys carrying the rank). The
ranks agree through one :class:`~stagefate.statemachine.group.LocalGroup`, each rank's replay on
a thread of its own. Everything a rank decides from is the same on every rank (the trace, the
seeded IO jitter, the facts the pipelines agree), so the ranks fire the same transitions, which
each pipeline's lockstep check verifies every pass (docs/tensor-parallel.md); at the end their
figures must be equal too, and each rank's transition log line for line.
"""

from __future__ import annotations

from collections.abc import Callable

from ..runtime import Storage
from ..statemachine.errors import LockstepError
from ..statemachine.group import LocalGroup
from .live import LivePolicy
from .policy import Policy, PolicyFactory
from .replay import Replay, ReplayMetrics, ReplayOptions
from .trace import TraceRequest

RANK_TIMEOUT_S = 120.0
"""How long a rank waits at an agreement for the others: a pass of the slowest rank, with
every rank's thread sharing one interpreter, is far shorter; a rank that failed is named."""


class RankedReplay:
    """``options.tp_size`` ranks of one replay; rank 0 is what the report shows."""

    def __init__(
        self,
        policy: PolicyFactory,
        trace: list[TraceRequest],
        options: ReplayOptions,
        storage: Storage | None = None,
    ) -> None:
        if options.tp_size < 2:
            raise ValueError(f"tp_size={options.tp_size}: one rank is a plain Replay")
        groups = LocalGroup.create(options.tp_size, RANK_TIMEOUT_S)
        self._group = groups[0]
        # each rank's pipeline agrees its config with the others' as it is built: all at once
        self.ranks: list[Replay] = self._group.run(
            *[_builder(policy, trace, options, storage, group) for group in groups]
        )
        self.options = options
        self.policy: Policy = self.ranks[0].policy
        if not isinstance(self.policy, LivePolicy):
            raise ValueError(
                f"tp_size={options.tp_size} runs the live policy's pipeline as ranks; "
                f"{self.policy.name} keeps its own books outside the lifecycle (blind) or is "
                "SGLang's code: replay it with tp_size 1"
            )

    def run(self, on_request: Callable[[], None] | None = None) -> ReplayMetrics:
        """Every rank's replay at once; rank 0's figures, once every rank's equal them."""
        results = self._group.run(
            *[
                _runner(replay, on_request if rank == 0 else None)
                for rank, replay in enumerate(self.ranks)
            ]
        )
        first = results[0].model_dump(exclude={"wall_seconds"})
        for rank, metrics in enumerate(results[1:], start=1):
            theirs = metrics.model_dump(exclude={"wall_seconds"})
            if theirs != first:
                field = next(name for name in first if first[name] != theirs[name])
                raise LockstepError(
                    f"the ranks' replays ended apart: {field} is {first[field]!r} on rank 0 "
                    f"and {theirs[field]!r} on rank {rank}, though every pass agreed on their "
                    "transitions"
                )
        self.metrics = results[0]
        return self.metrics


def _builder(
    policy: PolicyFactory,
    trace: list[TraceRequest],
    options: ReplayOptions,
    storage: Storage | None,
    group: LocalGroup,
) -> Callable[[], Replay]:
    return lambda: Replay(policy, trace, options, storage, group)


def _runner(replay: Replay, on_request: Callable[[], None] | None) -> Callable[[], ReplayMetrics]:
    return lambda: replay.run(on_request)


def build_replay(
    policy: PolicyFactory,
    trace: list[TraceRequest],
    options: ReplayOptions,
    storage: Storage | None = None,
) -> Replay | RankedReplay:
    """One replay of ``policy``: a :class:`Replay`, or its ranks under ``options.tp_size``."""
    if options.tp_size == 1:
        return Replay(policy, trace, options, storage)
    return RankedReplay(policy, trace, options, storage)


def replays_of(replay: Replay | RankedReplay) -> list[Replay]:
    """Each rank's replay, in rank order (one for a plain replay)."""
    return replay.ranks if isinstance(replay, RankedReplay) else [replay]
