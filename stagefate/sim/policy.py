"""The interface between the replay's engine and a prefetch policy, and what every policy shares.

The engine (:mod:`.engine_model`) and the replay (:mod:`.replay`) know a policy only through
:class:`Policy`; the policies a replay can compare are registered at the public face
(:mod:`stagefate.registry`), which is the one place that knows the targets (SGLang's pipeline).

A policy hands the engine the tree it decides over, the device pool and the write-through, and
the replay an ``io`` with ManualIO's face (``queued``, ``complete``, ``pending``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from ..runtime import Storage, TokenKey
from ..runtime.io import OpKind
from ..runtime.pools import SlotPool
from ..runtime.prefix_tree import Node, PrefixMatch, PrefixTree
from ..statemachine.config import PipelineConfig
from ..statemachine.group import Group
from ..transition_log import TransitionLog

EMPTY = torch.empty(0, dtype=torch.int64)
"""What ``admit`` returns when nothing was spliced."""


MakeRoom = Callable[[int, Node], bool]
"""The engine's evict-before-alloc: ``make_room(tokens, keep)`` frees LRU leaves (never
``keep``'s path) until ``tokens`` slots are free; False when they cannot be."""


@dataclass(frozen=True)
class PolicyInputs:
    """What a replay builds every policy from."""

    config: PipelineConfig
    storage: Storage | None
    tree: str
    """``stagefate``, ``sglang-python`` or ``sglang-rust``."""
    prefetch_policy: str
    """The engine's ``best_effort`` / ``wait_complete`` / ``timeout``."""
    group: Group | None = None
    """The tensor-parallel ranks this policy's pipeline agrees with (None: one rank)."""


class ReplayIO(Protocol):
    """The IO a replay completes on its clock (:class:`~stagefate.runtime.ManualIO`'s face)."""

    def queued(self, kind: OpKind | None = None) -> list[int]: ...

    def complete(self, op_id: int) -> None: ...

    def pending(self) -> int:
        """How many operations wait to be completed."""
        ...


class Policy(Protocol):
    name: str

    @property
    def io(self) -> ReplayIO: ...

    @property
    def tree(self) -> PrefixTree:
        """The tree the engine matches, inserts into and evicts from."""
        ...

    @property
    def device_pool(self) -> SlotPool: ...

    def write_through(self, key: TokenKey, device_indices: torch.Tensor) -> None:
        """A finished request's prompt pages go to L3 (the producer side)."""
        ...

    def issue(self, request_id: str, key: TokenKey, matched_len: int) -> None: ...

    def op_tokens(self, op_id: int) -> int:
        """Tokens a queued IO operation moves (for the time model)."""
        ...

    def poll(self) -> None: ...

    def pending(self, request_id: str) -> bool:
        """A prefetch is still on its way (admission may wait for it)."""
        ...

    def terminate(self, request_id: str) -> None:
        """The request is admitted without its prefetch: let go of it (a read in flight is
        abandoned and its bounce freed when it lands)."""
        ...

    def admit(self, request_id: str, prefix: PrefixMatch, make_room: MakeRoom) -> torch.Tensor:
        """Use what the prefetch staged; return the device slots spliced after ``prefix``."""
        ...

    def spliced_keys(self, request_id: str) -> list[str]:
        """The L3 keys of the pages ``request_id``'s last :meth:`admit` spliced, in order
        (empty when it spliced none): who wrote them is a fact about the store, not the
        policy (:mod:`.instances` counts the pages another instance wrote)."""
        ...

    def due_retries(self, waiting: Sequence[str]) -> list[str]: ...

    def counters(self) -> dict[str, int]:
        """``l3_reads`` … ``declined_device_covered`` for the replay's metrics."""
        ...

    def wasted_by_reason(self) -> dict[str, tuple[int, int]]:
        """``{reason: (reads, tokens)}`` of wasted L3 reads; sums to the wasted totals."""
        ...

    def declines(self) -> dict[str, int]:
        """Prefetches ended before or instead of a read, by the policy's own reason
        (:attr:`~.prefetches.PrefetchCounts.declined`)."""
        ...

    def finish(self) -> None:
        """The trace is done and the engine idle: let background work (write acks) land."""
        ...

    def l3_damage(self) -> str:
        """What L3 found damaged during the run, in words ("" when nothing was)."""
        ...


class LastSplice:
    """:meth:`Policy.spliced_keys` for a policy that notes its last splice in
    :attr:`last_splice` as it makes it (every policy here)."""

    last_splice: tuple[str, list[str]] = ("", [])
    """``(request id, L3 keys)`` of the last admission that spliced (replaced, never mutated)."""

    def spliced_keys(self, request_id: str) -> list[str]:
        rid, keys = self.last_splice
        return keys if rid == request_id else []


@runtime_checkable
class LogsTransitions(Protocol):
    """A policy whose pipeline can write its transitions to a log in its own design's words
    (SGLang's: ``replay --log``)."""

    def log_transitions(self, log: TransitionLog) -> Path:
        """From now on, write the pipeline's transitions to ``log``; the spec of the design
        they are written in."""


PolicyFactory = Callable[[PolicyInputs], Policy]
"""What a replay builds each policy with (the registry at the face maps names to these)."""
