"""One prefetch's record, the lookups of the firing under way, and what instruments receive.

A :class:`Record` is what the pipeline knows of one request's prefetch: what was asked, what it
holds (pin, bounce, device slots), the plan, and the arguments of the event being fired, which
its guards and effects read. Nothing in it is a verdict about the live tree: that is looked up
again, through the firing's :class:`Lookups`, every time a decision is made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..runtime import Completion, TokenKey
from ..runtime.hashing import Namespace
from ..runtime.prefix_tree import Node, PrefixMatch
from ..spec.names import StateName
from .machine import Outcome

_EMPTY = torch.empty(0, dtype=torch.int64)


@dataclass(eq=False, slots=True)
class Record:
    """One prefetch: what was asked, what it holds, and the arguments of the event being fired."""

    request_id: str
    tokens: TokenKey
    """The request's tokens, cut to whole pages: the span ends at ``len(tokens)``."""
    matched_len: int
    namespace: Namespace
    state: StateName
    """Its state in the spec; a new record starts at the spec's ``initial``. Typed with the
    packaged spec's names (``spec/names.py``), so mypy rejects a misspelt state."""
    span_end: int = 0
    pinned_node: Node | None = None
    pinned_tokens: int = 0
    op_id: int | None = None
    hit_tokens: int = 0
    host_indices: np.ndarray | None = None
    """Bounce slots: a NumPy array, since no tensor op needs them (slices, copies, frees)."""
    host_aux_indices: np.ndarray | None = None
    aux_tokens: int = 0
    """The read's aux (sliding-window) tokens: planned at the hit, held in the bounce from the
    IO commit (``host_aux_indices``)."""
    plan_prefix: int | None = None
    device_indices: torch.Tensor | None = None
    """The spliced tail's device slots, handed to the caller (the tree keeps its own copy)."""
    device_slots: np.ndarray | None = None
    """The same slots as NumPy (the H2D copy's destination)."""
    spliced_node: Node | None = None
    aux_device_indices: torch.Tensor | None = None
    read_tokens: int = 0
    """Tokens the L3 read asked for (0: no read was launched)."""
    span_digests: Sequence[bytes] = ()
    """Page keys of the span's pages (set once the issue's lock decided;
    :func:`.io_ops.span_digests`)."""
    span_keys: Sequence[str] = ()
    """``span_digests`` as L3 object keys."""
    plan_tokens: int = 0
    """Tokens the read will bring: the hit within the span (set by ``record_hit``)."""
    spliced_tokens: int = 0
    # arguments of the event being fired, read by its guards and effects
    arg_prefix_len: int = 0
    arg_prefix_indices: torch.Tensor = _EMPTY
    arg_completion: Completion | None = None

    @property
    def span_tokens(self) -> int:
        """Tokens the span covers, ``[matched_len, span_end)``."""
        return self.span_end - self.matched_len


@dataclass(slots=True)
class Lookups:
    """What the guards of the firing under way looked up in the live tree, for its effects.

    Emptied when a firing starts; filled the first time a guard asks; never read by a later
    firing (the tree may have changed by then)."""

    anchor: PrefixMatch | None = None
    """The live match of the request's ``tokens[:matched_len]`` (its anchor is ``last_node``)."""
    span: PrefixMatch | None = None
    """The live match of the request's whole tokens (the splice hangs below ``last_node``)."""
    sibling: str | None = None
    """The live record found reading this record's head (in-flight dedup)."""


@dataclass(frozen=True)
class TransitionEvent:
    """What instruments receive after every transition."""

    request_id: str
    outcome: Outcome


Instrument = Callable[[TransitionEvent], None]
