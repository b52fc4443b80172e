"""SGLang's ``UnifiedRadixCache`` (Python or Rust tree core) as a stagefate ``PrefixTree``.

The cache is SGLang's own, built as its scheduler builds it, and every decision (match, split,
insert, lock, LRU eviction, its own ``sanity_check``) is its code: in SGLang's engine the cache
its scheduler built (:mod:`.pipeline`), in the pipeline target one built over a stagefate pool
(:mod:`stagefate.targets.sglang.tree`). Insert contracts differ: SGLang's insert frees the part
of ``value`` it already holds (the caller passed its own copy of those tokens); stagefate's
protocol leaves that part with the caller (the pipeline passes the tree's own slots there). The
adapter takes the frees SGLang issues *during* an insert, checks they are exactly that part, and
does not pass them on.

Nodes are SGLang's node ids, wrapped so the pipeline and the fuzzer can ask what they ask of any
tree: is it still attached (not evicted), is it locked. The Rust core keeps its nodes to itself,
so :meth:`SGLangTree.nodes` gives one view per cached prefix of every key inserted (with the
tokens and device slots SGLang's match returns for it), which is what the fuzzer's byte check
needs, and ``total_tokens`` is SGLang's own count.

Also here: reading a ``match_prefix`` result the same way in every release
(:func:`device_prefix_len`, :func:`device_prefix_indices`).
"""

from __future__ import annotations

import contextlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...runtime.hashing import Namespace, namespace_of
from ...runtime.pools import SlotPool
from ...runtime.prefix_tree import check_insert_slots
from ...runtime.tokens import TokenKey, Tokens


class SGLangTreeError(RuntimeError):
    """SGLang did something the adapter's contract forbids (the message says what)."""


_EMPTY = torch.empty(0, dtype=torch.int64)
_FREES = ("free", "free_full", "free_segment", "free_full_segment")
"""The allocator methods through which SGLang's tree frees slots."""


@dataclass(eq=False)
class SGLangNode:
    """A node id of the SGLang tree, as the pipeline and fuzzer see nodes."""

    tree: SGLangTree
    node_id: int
    namespace: Namespace

    @property
    def attached(self) -> bool:
        return self.tree.node_attached(self.node_id)

    @property
    def lock_ref(self) -> int:
        return len(self.tree.receipts.get(self.node_id, ()))


@dataclass(frozen=True)
class SGLangMatch:
    """A match in SGLang's tree as the lifecycle reads it (:class:`PrefixMatch`)."""

    length: int
    last_node: SGLangNode
    device_indices: torch.Tensor


@dataclass(frozen=True)
class PrefixView:
    """One cached prefix of an inserted key, as SGLang's match returns it (for byte checks)."""

    namespace: Namespace
    token_ids: tuple[int, ...]
    value: torch.Tensor

    def tokens(self) -> list[int]:
        return list(self.token_ids)


class SGLangTree:
    """:class:`~stagefate.runtime.prefix_tree.PrefixTree` over SGLang's ``UnifiedRadixCache``."""

    def __init__(
        self, cache: Any, allocator: Any, device_pool: SlotPool, remember_keys: bool = True
    ) -> None:
        """The tree of SGLang's built ``cache``, whose ``allocator`` frees what its tree
        frees; ``device_pool`` is the pipeline's view of those slots. ``remember_keys`` keeps
        every key inserted, for :meth:`nodes` (the fuzzer's byte check; a serving engine
        inserts without end and keeps none)."""
        self.page_size = int(cache.page_size)
        self.pool = device_pool
        self.cache, self.allocator = cache, allocator
        self.core = str(getattr(cache, "_tree_core_backend", "radix"))
        self.remembers_keys = remember_keys
        self.receipts: dict[int, list[Any]] = {}
        """Lock receipts per node id: SGLang's dec_lock_ref takes the receipt of its inc."""
        self.keys: dict[tuple[Namespace, bytes], None] = {}
        """Every key inserted (namespace, bytes), for :meth:`nodes`."""

    # ------------------------------------------------------------------ sizes

    @property
    def protected_size(self) -> int:
        return int(self.cache.protected_size())

    @property
    def evictable_size(self) -> int:
        return int(self.cache.evictable_size())

    def total_tokens(self) -> int:
        return int(self.cache.tree_core.total_size()[0])

    # ------------------------------------------------------------------ match and insert

    def _key(self, tokens: Tokens, namespace: Namespace) -> tuple[Any, TokenKey]:
        from sglang.srt.mem_cache.radix_cache import RadixKey

        key = TokenKey.of(tokens).whole_pages(self.page_size)
        ids = array("q")
        ids.frombytes(key.data)  # little-endian int64, as TokenKey stores them
        extra_key, cache_salt = namespace
        return RadixKey(ids, extra_key=extra_key, cache_salt=cache_salt), key

    def match_prefix(
        self, tokens: Tokens, extra_key: str | None = None, cache_salt: str | None = None
    ) -> SGLangMatch:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        namespace = namespace_of(extra_key, cache_salt)
        radix_key, _ = self._key(tokens, namespace)
        result = self.cache.match_prefix(MatchPrefixParams(key=radix_key))
        node = result.last_device_node
        length = device_prefix_len(result)
        indices = self._path(node, namespace)[:length]
        return SGLangMatch(length, SGLangNode(self, int(node), namespace), indices)

    def _path(self, node: int, namespace: Namespace) -> torch.Tensor:
        root = self.cache.root_node_handle(namespace[0])
        path = self.cache.tree_core.collect_full_device_indices(node, root)
        return path.to(torch.int64).cpu() if path is not None else _EMPTY

    def insert(
        self,
        tokens: Tokens,
        device_indices: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        return self.insert_node(tokens, device_indices, extra_key, cache_salt)[0]

    def insert_node(
        self,
        tokens: Tokens,
        device_indices: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> tuple[int, SGLangNode]:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        namespace = namespace_of(extra_key, cache_salt)
        radix_key, key = self._key(tokens, namespace)
        total = len(key)
        check_insert_slots(total, device_indices)
        value = device_indices[:total].clone()
        with self._holding_frees() as held:
            result = self.cache.insert(InsertParams(key=radix_key, value=value))
        present = int(result.prefix_len)
        freed = torch.cat(held) if held else _EMPTY
        if not torch.equal(freed.sort().values, value[:present].sort().values):
            raise SGLangTreeError(
                f"SGLang's insert freed {freed.tolist()}, not the {present} tokens it already held"
            )
        if self.remembers_keys:
            self.keys[(namespace, key.data)] = None
        node = self.match_prefix(key, *namespace).last_node
        return present, node

    def insert_leaf(
        self,
        parent: SGLangNode,
        tokens: Tokens,
        present: int,
        slots: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> SGLangNode:
        namespace = namespace_of(extra_key, cache_salt)
        key = TokenKey.of(tokens).whole_pages(self.page_size)
        prefix = self.match_prefix(key.prefix(present), *namespace).device_indices
        added, node = self.insert_node(key, torch.cat([prefix, slots]), *namespace)
        if added != present:
            raise SGLangTreeError(f"insert_leaf: SGLang held {added} tokens, not {present}")
        return node

    @contextlib.contextmanager
    def _holding_frees(self) -> Iterator[list[torch.Tensor]]:
        """The allocator's frees collected instead of made, for the block (the part of an
        insert's value SGLang already holds: the caller's, kept by the caller). Every way
        SGLang's allocators free is held: ``free`` and, from 0.5.23, the segment frees its
        tree's actions call (the paged allocator's does not go through ``free``)."""
        held: list[torch.Tensor] = []
        allocator = self.allocator

        def hold(free_index: torch.Tensor, *_position: Any, **_start: Any) -> None:
            if free_index.numel():
                held.append(free_index.to(torch.int64).cpu())

        names = [name for name in _FREES if hasattr(type(allocator), name)]
        for name in names:
            setattr(allocator, name, hold)
        try:
            yield held
        finally:
            for name in names:
                delattr(allocator, name)  # the class's own method again

    # ------------------------------------------------------------------ locks and eviction

    def inc_lock_ref(self, node: SGLangNode) -> int:
        receipt = self.cache.inc_lock_ref(node.node_id)
        self.receipts.setdefault(node.node_id, []).append(receipt)
        return int(receipt.delta)

    def dec_lock_ref(self, node: SGLangNode) -> int:
        held = self.receipts.get(node.node_id)
        if not held:
            raise SGLangTreeError(f"dec_lock_ref on node {node.node_id} without a matching inc")
        receipt = held.pop()
        if not held:
            del self.receipts[node.node_id]
        before = self.evictable_size
        self.cache.dec_lock_ref(node.node_id, receipt.to_dec_params())
        return self.evictable_size - before

    def move_lock_ref(self, old: SGLangNode, new: SGLangNode) -> None:
        if not self.receipts.get(old.node_id):
            raise SGLangTreeError(f"move_lock_ref from node {old.node_id} without a matching inc")
        self.inc_lock_ref(new)
        self.dec_lock_ref(old)

    def evict(self, num_tokens: int) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        if not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"evict: num_tokens must be a non-negative int, got {num_tokens!r}")
        if num_tokens == 0:
            return 0
        return int(self.cache.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted)

    def node_attached(self, node_id: int) -> bool:
        try:
            return not bool(self.cache.tree_core.is_full_device_evicted(node_id))
        except (KeyError, IndexError, ValueError, RuntimeError):
            return False  # SGLang no longer knows the id

    # ------------------------------------------------------------------ inspection

    def attach_aux(self, node: SGLangNode, aux_indices: torch.Tensor) -> None:
        raise SGLangTreeError(
            "the SGLang target is built with the FULL component only: no sliding-window aux"
        )

    def aux_slots(self) -> torch.Tensor:
        return _EMPTY

    def cached_page_key(self, node: SGLangNode) -> bytes | None:
        return None  # SGLang's node hashes are its own keys, not stagefate's page keys

    def remember_page_keys(
        self,
        tokens: Tokens,
        digests: Sequence[bytes],
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> None:
        return None  # nothing kept: every prefetch over this tree hashes from the start

    def nodes(self) -> list[PrefixView]:
        """One view per cached prefix of each inserted key (its tokens and device slots)."""
        views = []
        for namespace, data in self.keys:
            match = self.match_prefix(TokenKey(data), *namespace)
            if match.length:
                ids = TokenKey(data).prefix(match.length).tolist()
                views.append(PrefixView(namespace, tuple(ids), match.device_indices))
        return views

    def sanity_check(self) -> None:
        self.cache.sanity_check()


def match_counts_tokens(match: Any) -> bool:
    """Whether a ``match_prefix`` result counts its device tokens (``device_prefix_len``,
    0.5.22 and later) rather than returning their slots (``device_indices``, up to 0.5.21)."""
    return getattr(match, "device_prefix_len", None) is not None


def device_prefix_len(match: Any) -> int:
    """Tokens of a ``match_prefix`` result on the device."""
    return int(match.device_prefix_len) if match_counts_tokens(match) else len(match.device_indices)


def device_prefix_indices(cache: Any, match: Any) -> torch.Tensor:
    """The device slots of a ``match_prefix`` result, in token order."""
    if not match_counts_tokens(match):
        return match.device_indices  # type: ignore[no-any-return]
    slots: torch.Tensor = cache.path_device_indices(match.last_device_node)
    return slots[: int(match.device_prefix_len)]
