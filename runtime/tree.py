"""The live radix tree: which token prefixes have KV in the device pool, and where.

Theory of operation
-------------------
Keys are token sequences cut to whole pages. A node owns a run of pages (``key``) and the device
slots holding their KV (``value``, one slot per token). Children are keyed by
``(namespace, first page)``, so requests with different ``(extra_key, cache_salt)`` never share
nodes, even for equal tokens.

* ``match_prefix`` walks from the root comparing whole node keys (one C-level tuple compare per
  node), so its cost grows with the matched prefix, not with the size of the tree. A match that
  ends inside a node splits it there, so ``last_node`` always ends exactly at the match length:
  that node is what a caller pins.
* ``insert`` adds only what is missing and returns the length already present; slots of the
  present part are never overwritten (the caller still owns its duplicate slots for that part).
* A split keeps ``lock_ref``, last access and page hashes on both halves: the new parent is on
  every path through the old node, so it inherits its lock count.
* ``inc_lock_ref``/``dec_lock_ref`` walk node → root. Tokens are accounted as evictable
  (lock_ref 0) or protected; a decrement below zero raises.
* ``evict`` frees least-recently-used unlocked leaves. Candidates sit in a heap keyed by last
  access with lazy invalidation (a touched or locked node leaves a stale entry that is skipped),
  so one eviction costs O(log n), not a scan of the tree.
* Access time is a logical clock (one tick per operation), so runs are deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .hashing import Namespace, namespace_of, page_hashes
from .pools import SlotPool

_EMPTY = torch.empty(0, dtype=torch.int64)


class TreeNode:
    __slots__ = (
        "_hashes",
        "aux_value",
        "children",
        "heap_stamp",
        "key",
        "last_access",
        "lock_ref",
        "namespace",
        "node_id",
        "parent",
        "value",
    )

    def __init__(
        self,
        node_id: int,
        key: tuple[int, ...],
        value: torch.Tensor,
        parent: TreeNode | None,
        namespace: Namespace,
    ) -> None:
        self.node_id = node_id
        self.key = key
        self.value = value
        self.parent = parent
        self.namespace = namespace
        self.children: dict[tuple[Namespace, tuple[int, ...]], TreeNode] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.heap_stamp = 0
        self._hashes: list[bytes] | None = None
        self.aux_value: torch.Tensor | None = None

    @property
    def is_root(self) -> bool:
        return self.node_id == 0

    @property
    def attached(self) -> bool:
        """False once the node (or an ancestor) was evicted: it no longer hangs below the root."""
        node = self
        while node.parent is not None:
            node = node.parent
        return node.is_root

    def __repr__(self) -> str:
        return f"TreeNode(id={self.node_id}, len={len(self.key)}, lock_ref={self.lock_ref})"


@dataclass(frozen=True)
class MatchResult:
    """The device slots of the longest cached prefix and the node that ends exactly there."""

    device_indices: torch.Tensor
    last_node: TreeNode

    @property
    def length(self) -> int:
        return int(self.device_indices.numel())


class TreeError(RuntimeError):
    """A tree operation was misused (unbalanced lock, foreign node, bad key)."""


class RadixTree:
    def __init__(self, page_size: int, device_pool: SlotPool, aux_pool: SlotPool | None = None):
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.page_size = page_size
        self.device_pool = device_pool
        self.aux_pool = aux_pool
        self._ids = itertools.count()
        self.root = TreeNode(next(self._ids), (), _EMPTY, None, (None, None))
        self.root.lock_ref = 1  # the root is never evicted
        self._clock = 0
        self._heap: list[tuple[int, int, int, TreeNode]] = []
        self.evictable_size = 0
        self.protected_size = 0
        self._node_count = 0

    # ------------------------------------------------------------------ helpers

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _aligned(self, tokens: Sequence[int]) -> tuple[int, ...]:
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.tolist()
        usable = len(tokens) - len(tokens) % self.page_size
        return tuple(tokens[:usable])

    def _child_key(
        self, namespace: Namespace, key: tuple[int, ...], pos: int
    ) -> tuple[Namespace, tuple[int, ...]]:
        return (namespace, key[pos : pos + self.page_size])

    def _common_length(self, node_key: tuple[int, ...], key: tuple[int, ...], pos: int) -> int:
        """Whole pages of ``node_key`` equal to ``key[pos:]``, in tokens."""
        if key[pos : pos + len(node_key)] == node_key:  # the common case: the whole node
            return len(node_key)
        page = self.page_size
        limit = min(len(node_key), len(key) - pos)
        matched = 0
        while (
            matched + page <= limit
            and node_key[matched : matched + page] == key[pos + matched : pos + matched + page]
        ):
            matched += page
        return matched

    def _push_if_evictable(self, node: TreeNode) -> None:
        if node.lock_ref == 0 and not node.children and not node.is_root:
            node.heap_stamp += 1
            heapq.heappush(self._heap, (node.last_access, node.heap_stamp, node.node_id, node))

    def _touch(self, node: TreeNode, now: int) -> None:
        node.last_access = now
        self._push_if_evictable(node)

    def _split(self, node: TreeNode, length: int) -> TreeNode:
        """Cut ``node`` after ``length`` tokens; return the new parent holding the head."""
        assert node.parent is not None and 0 < length < len(node.key)
        head = TreeNode(
            next(self._ids), node.key[:length], node.value[:length], node.parent, node.namespace
        )
        self._node_count += 1
        head.lock_ref = node.lock_ref
        head.last_access = node.last_access
        if node._hashes is not None:
            head._hashes = node._hashes[: length // self.page_size]
            node._hashes = node._hashes[length // self.page_size :]
        node.parent.children[self._child_key(node.namespace, node.key, 0)] = head
        node.key = node.key[length:]
        node.value = node.value[length:]
        node.parent = head
        head.children[self._child_key(node.namespace, node.key, 0)] = node
        return head

    # ------------------------------------------------------------------ queries

    def match_prefix(
        self,
        tokens: Sequence[int],
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> MatchResult:
        """Longest cached whole-page prefix of ``tokens`` under the namespace."""
        namespace = namespace_of(extra_key, cache_salt)
        key = self._aligned(tokens)
        now = self._tick()
        node = self.root
        values: list[torch.Tensor] = []
        pos = 0
        while pos < len(key):
            child = node.children.get(self._child_key(namespace, key, pos))
            if child is None:
                break
            end = pos + len(child.key)
            if key[pos:end] == child.key:
                values.append(child.value)
                pos = end
                node = child
                self._touch(child, now)
                continue
            common = self._common_length(child.key, key, pos)
            node = self._split(child, common)
            values.append(node.value)
            pos += common
            self._touch(node, now)
            break
        indices = values[0] if len(values) == 1 else (torch.cat(values) if values else _EMPTY)
        return MatchResult(indices, node)

    def insert(
        self,
        tokens: Sequence[int],
        device_indices: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """Add what is missing of ``tokens``; return the length that was already present."""
        return self.insert_node(tokens, device_indices, extra_key, cache_salt)[0]

    def insert_node(
        self,
        tokens: Sequence[int],
        device_indices: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> tuple[int, TreeNode]:
        """:meth:`insert`, also returning the node that ends at the inserted length."""
        namespace = namespace_of(extra_key, cache_salt)
        key = self._aligned(tokens)
        if not isinstance(device_indices, torch.Tensor) or device_indices.dtype != torch.int64:
            raise TypeError("device_indices must be an int64 tensor of device slots")
        if device_indices.numel() < len(key):
            raise ValueError(
                f"insert: {len(key)} page-aligned tokens but only {device_indices.numel()} slots"
            )
        now = self._tick()
        node = self.root
        pos = 0
        while pos < len(key):
            child = node.children.get(self._child_key(namespace, key, pos))
            if child is None:
                break
            common = self._common_length(child.key, key, pos)
            if common < len(child.key):
                child = self._split(child, common)
            node = child
            pos += common
            self._touch(node, now)
        present = pos
        if pos < len(key):
            leaf = TreeNode(
                next(self._ids), key[pos:], device_indices[pos : len(key)].clone(), node, namespace
            )
            leaf.last_access = now
            was_leaf = not node.children
            node.children[self._child_key(namespace, key, pos)] = leaf
            self.evictable_size += len(leaf.key)
            self._node_count += 1
            self._push_if_evictable(leaf)
            if was_leaf:
                node.heap_stamp += 1  # its heap entry is stale: it has a child now
            node = leaf
        return present, node

    # ------------------------------------------------------------------ locks

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Pin ``node`` and its ancestors; return the tokens that became protected."""
        newly = 0
        current: TreeNode | None = node
        while current is not None and not current.is_root:
            if current.lock_ref == 0:
                self.evictable_size -= len(current.key)
                self.protected_size += len(current.key)
                newly += len(current.key)
            current.lock_ref += 1
            current = current.parent
        return newly

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Undo one :meth:`inc_lock_ref`; return the tokens that became evictable."""
        path: list[TreeNode] = []
        current: TreeNode | None = node
        while current is not None and not current.is_root:
            if current.lock_ref <= 0:
                raise TreeError(
                    f"dec_lock_ref below zero on {current!r}: every dec must match an inc"
                )
            path.append(current)
            current = current.parent
        freed = 0
        for item in path:
            item.lock_ref -= 1
            if item.lock_ref == 0:
                self.evictable_size += len(item.key)
                self.protected_size -= len(item.key)
                freed += len(item.key)
                self._push_if_evictable(item)
        return freed

    # ------------------------------------------------------------------ eviction

    def evict(self, num_tokens: int) -> int:
        """Free LRU unlocked leaves until ``num_tokens`` are freed or none is left."""
        if not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"evict: num_tokens must be a non-negative int, got {num_tokens!r}")
        freed = 0
        while freed < num_tokens and self._heap:
            _access, stamp, _nid, node = heapq.heappop(self._heap)
            if stamp != node.heap_stamp or node.lock_ref or node.children or node.parent is None:
                continue
            freed += self._remove_leaf(node)
        if len(self._heap) > 64 and len(self._heap) > 4 * (self._node_count + 1):
            self._rebuild_heap()
        return freed

    def _remove_leaf(self, node: TreeNode) -> int:
        parent = node.parent
        assert parent is not None
        del parent.children[self._child_key(node.namespace, node.key, 0)]
        node.parent = None
        node.heap_stamp += 1
        self.device_pool.free(node.value)
        if node.aux_value is not None and self.aux_pool is not None:
            self.aux_pool.free(node.aux_value)
            node.aux_value = None
        self.evictable_size -= len(node.key)
        self._node_count -= 1
        self._push_if_evictable(parent)
        return len(node.key)

    def _rebuild_heap(self) -> None:
        self._heap = []
        for node in self.nodes():
            self._push_if_evictable(node)

    # ------------------------------------------------------------------ aux + hashes

    def attach_aux(self, node: TreeNode, aux_indices: torch.Tensor) -> None:
        """Give ``node`` the aux (sliding-window) slots of the window that ends at its end."""
        if self.aux_pool is None:
            raise TreeError("attach_aux needs a tree built with an aux_pool")
        if node.aux_value is not None:
            self.aux_pool.free(node.aux_value)
        node.aux_value = aux_indices

    def node_hashes(self, node: TreeNode) -> list[bytes]:
        """The page-key chain of ``node``'s pages (computed on first use, kept across splits)."""
        if node.is_root:
            return []
        if node._hashes is None:
            parent = node.parent
            assert parent is not None
            seed = self.node_hashes(parent)[-1] if not parent.is_root else None
            node._hashes = page_hashes(node.key, self.page_size, node.namespace, seed)
        return node._hashes

    # ------------------------------------------------------------------ inspection

    def nodes(self) -> list[TreeNode]:
        """Every node but the root, parents before children."""
        out: list[TreeNode] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def node_count(self) -> int:
        return self._node_count

    def total_tokens(self) -> int:
        return sum(len(node.key) for node in self.nodes())

    def device_slots(self) -> torch.Tensor:
        values = [node.value for node in self.nodes()]
        return torch.cat(values) if values else _EMPTY

    def aux_slots(self) -> torch.Tensor:
        values = [n.aux_value for n in self.nodes() if n.aux_value is not None]
        return torch.cat(values) if values else _EMPTY

    def sanity_check(self) -> None:
        """Raise :class:`TreeError` naming the first structural invariant that does not hold."""
        evictable = protected = 0
        seen_slots: set[int] = set()
        for node in self.nodes():
            parent = node.parent
            if (
                parent is None
                or parent.children.get(self._child_key(node.namespace, node.key, 0)) is not node
            ):
                raise TreeError(f"{node!r} is not reachable under its own child key")
            if not node.key or len(node.key) % self.page_size:
                raise TreeError(f"{node!r} has a key of {len(node.key)} tokens, not whole pages")
            if node.value.numel() != len(node.key):
                raise TreeError(f"{node!r}: {node.value.numel()} slots for {len(node.key)} tokens")
            if node.lock_ref < 0:
                raise TreeError(f"{node!r} has a negative lock_ref")
            if not parent.is_root and parent.namespace != node.namespace:
                raise TreeError(f"{node!r} crosses namespaces under its parent")
            child_locks = sum(child.lock_ref for child in node.children.values())
            if node.lock_ref < child_locks:
                raise TreeError(f"{node!r} has lock_ref below its children's ({child_locks})")
            slots = node.value.tolist()
            if seen_slots.intersection(slots):
                raise TreeError(f"{node!r} shares device slots with another node")
            seen_slots.update(slots)
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            if node._hashes is not None:
                seed = self.node_hashes(parent)[-1] if not parent.is_root else None
                if node._hashes != page_hashes(node.key, self.page_size, node.namespace, seed):
                    raise TreeError(f"{node!r} carries page hashes that do not match its tokens")
        if len(self.nodes()) != self._node_count:
            raise TreeError(
                f"node count drifted: {len(self.nodes())} nodes, tracked {self._node_count}"
            )
        if (evictable, protected) != (self.evictable_size, self.protected_size):
            raise TreeError(
                f"token accounting drifted: counted evictable={evictable} protected={protected}, "
                f"tracked {self.evictable_size}/{self.protected_size}"
            )
