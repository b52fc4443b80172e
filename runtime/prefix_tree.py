"""What the pipeline (and the fuzzer) need from a radix tree: the adapter protocol.

:class:`~stagefate.runtime.tree.RadixTree` is the first implementation. Another one (SGLang's
``RadixCache`` behind a thin wrapper, a Rust core) can be driven by the pipeline, the replay and
the stateful fuzzer by passing its constructor as ``BufferPipeline(config, tree_factory=...)``
(called with the page size and the pipeline's device and aux pools) or setting
``PipelineFuzzer.tree_factory``. Its nodes are opaque to the pipeline (``Node`` is ``Any``):
they are only handed back to the tree, except for the checks below.

Semantics the pipeline relies on (the fuzzer's invariants check them):

* ``match_prefix`` returns the longest cached whole-page prefix under the namespace, and a
  ``last_node`` that ends exactly there (split a node if needed), with ``length`` and
  ``device_indices``;
* ``insert_node`` is add-only: it returns the length already present (those slots stay the
  caller's) and the node ending at the inserted length; ``insert_leaf`` is the same insert when
  a fresh match already ended where the new tokens start;
* ``inc_lock_ref`` / ``dec_lock_ref`` pin / unpin a node and its ancestors; a locked node is never
  evicted; ``evict(n)`` frees LRU unlocked leaves into the device pool, returns tokens freed;
* ``cached_page_key`` returns a page key the tree was offered through ``remember_page_keys``
  for exactly the pages on the node's path (or ``None``: keeping them is optional);
* nodes expose ``attached`` (still reachable from the root), ``lock_ref``, ``value`` (device
  slots), ``namespace`` and ``tokens()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from .pools import SlotPool
from .tokens import Tokens

Node = Any
"""A node of the tree in use (opaque to the pipeline)."""


class PrefixMatch(Protocol):
    """What a tree's ``match_prefix`` answers: how many tokens matched, the node where the match
    ends, and the device slots of those tokens."""

    @property
    def length(self) -> int:
        """Tokens matched: whole pages, from the start of the key."""
        ...

    @property
    def last_node(self) -> Node:
        """The node the match ends at exactly (a match inside a node splits it)."""
        ...

    @property
    def device_indices(self) -> torch.Tensor:
        """The device slots of the matched tokens, in order."""
        ...


class PrefixTree(Protocol):
    """The radix tree the lifecycle anchors and splices into: stagefate's :class:`RadixTree` or
    an engine's own (SGLang's tree, vLLM's prefix cache) behind an adapter."""

    page_size: int

    @property
    def protected_size(self) -> int:
        """Tokens on locked paths."""
        ...

    @property
    def evictable_size(self) -> int:
        """Tokens :meth:`evict` could free now (unlocked): a scheduler's memory budget counts
        them."""
        ...

    def match_prefix(
        self, tokens: Tokens, extra_key: str | None = None, cache_salt: str | None = None
    ) -> PrefixMatch:
        """The longest cached whole-page prefix of ``tokens`` in the namespace."""
        ...

    def insert(
        self,
        tokens: Tokens,
        device_indices: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """Add what of ``tokens`` is missing, with its slots; return the length already present
        (the caller's slots for that part stay the caller's)."""
        ...

    def insert_node(
        self,
        tokens: Tokens,
        device_indices: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> tuple[int, Node]:
        """:meth:`insert`, also returning the node the inserted key ends at."""
        ...

    def insert_leaf(
        self,
        parent: Node,
        tokens: Tokens,
        present: int,
        slots: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> Node:
        """Add ``tokens[present:]`` (``slots``, one per token) below ``parent``, the last node of
        a match of ``tokens`` that found exactly ``present`` tokens with the tree unchanged
        since; return the node ending at the inserted length."""
        ...

    def inc_lock_ref(self, node: Node) -> int:
        """Pin ``node`` and its ancestors; return the tokens that became protected."""
        ...

    def dec_lock_ref(self, node: Node) -> int:
        """Undo one :meth:`inc_lock_ref`; return the tokens that became evictable."""
        ...

    def move_lock_ref(self, old: Node, new: Node) -> None:
        """``inc_lock_ref(new)`` then ``dec_lock_ref(old)``; may share their common path."""
        ...

    def evict(self, num_tokens: int) -> int:
        """Free least recently used unlocked leaves until ``num_tokens`` are freed or none is
        left; return the tokens freed."""
        ...

    def attach_aux(self, node: Node, aux_indices: torch.Tensor) -> None:
        """Give ``node`` the aux (sliding-window) slots of the window ending at its end."""
        ...

    def cached_page_key(self, node: Node) -> bytes | None:
        """The page key (:mod:`.hashing`) of the last page ending at ``node``, when the tree
        remembers one; ``None`` makes the pipeline hash the request's pages from the start."""
        ...

    def remember_page_keys(
        self,
        tokens: Tokens,
        digests: Sequence[bytes],
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Offered the page-key chain of ``tokens`` (computed by a write-through or a cold
        prefetch); a tree may keep it for :meth:`cached_page_key`, changing nothing else."""
        ...

    def nodes(self) -> Sequence[Node]:
        """Every node but the root."""
        ...

    def total_tokens(self) -> int:
        """Tokens cached in the tree."""
        ...

    def aux_slots(self) -> torch.Tensor:
        """Every aux slot the tree's nodes hold."""
        ...

    def sanity_check(self) -> None:
        """Raise naming the first structural invariant of the tree that does not hold."""
        ...


TreeFactory = Callable[[int, SlotPool, SlotPool | None], PrefixTree]
"""Builds a tree over the pipeline's pools: ``(page_size, device_pool, aux_pool)``."""


def check_insert_slots(tokens: int, device_indices: torch.Tensor) -> None:
    """Every tree's insert takes one int64 slot per page-aligned token (at least)."""
    if not isinstance(device_indices, torch.Tensor) or device_indices.dtype != torch.int64:
        raise TypeError("device_indices must be an int64 tensor of device slots")
    if device_indices.numel() < tokens:
        raise ValueError(
            f"insert: {tokens} page-aligned tokens but only {device_indices.numel()} slots"
        )


@contextlib.contextmanager
def locked(tree: PrefixTree, node: Node) -> Iterator[None]:
    """``node``'s path pinned for the block, so eviction inside it cannot take it."""
    tree.inc_lock_ref(node)
    try:
        yield
    finally:
        tree.dec_lock_ref(node)


def evict_for(tree: PrefixTree, pool: SlotPool, tokens: int, keep: Node) -> int:
    """Evict LRU leaves until ``pool`` has ``tokens`` free slots (or nothing is left to
    evict); ``keep``'s path survives. Returns the tokens evicted."""
    short = tokens - pool.available()
    if short <= 0:
        return 0
    with locked(tree, keep):
        return tree.evict(short)


def alloc_evicting(
    tree: PrefixTree, pool: SlotPool, tokens: int, keep: Node
) -> torch.Tensor | None:
    """``tokens`` slots of ``pool``, evicting LRU leaves first when short; ``keep`` survives."""
    evict_for(tree, pool, tokens, keep)
    return pool.alloc(tokens)
