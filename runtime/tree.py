"""The live radix tree: which token prefixes have KV in the device pool, and where.

Theory of operation
-------------------
Keys are token sequences cut to whole pages, held as bytes (:mod:`.tokens`: 8 bytes a token). A
node owns a run of pages (``key``) and the device slots holding their KV (``value``, one slot per
token). The root's children are keyed by ``(namespace, first page)``, so requests with different
``(extra_key, cache_salt)`` never share nodes, even for equal tokens; below the root every node
shares its parent's namespace, so deeper children are keyed by their first page alone.

* ``match_prefix`` walks from the root; each node costs one dict lookup and one ``memcmp`` of its
  whole key (``bytes.startswith`` at an offset), so the cost grows with the nodes on the matched
  path, not with the size of the tree. A match that ends inside a node splits it there, so
  ``last_node`` always ends exactly at the match length: that node is what a caller pins. The
  device indices are concatenated on first use, since most callers only pin ``last_node``.
* ``insert`` adds only what is missing and returns the length already present; slots of the
  present part are never overwritten (the caller still owns its duplicate slots for that part).
  ``insert_leaf`` is that insert when a fresh match already ended where the new tokens start:
  the tail hangs below the match's ``last_node`` without a second walk.
* Page keys (:mod:`.hashing`) offered by a write-through are kept on the nodes holding those
  pages (``remember_page_keys``: a read-only walk, no split, no access stamp), so a prefetch
  anchored at a node continues the chain from ``cached_page_key`` and hashes only its span.
  Each node also keeps the very key it hangs under in its parent's ``children``
  (``child_key``): unlinking a leaf slices and hashes no page.
* A split keeps ``lock_ref``, last access and page hashes on both halves: the new parent is on
  every path through the old node, so it inherits its lock count.
* ``inc_lock_ref``/``dec_lock_ref`` walk node → root. Tokens are accounted as evictable
  (lock_ref 0) or protected. ``lock_ref`` never decreases towards the root (a parent is on every
  path through its children), so checking the start node is enough to refuse a decrement below
  zero before anything changes.
* ``evict`` frees least-recently-used unlocked leaves. Candidates sit in a heap keyed by last
  access with lazy invalidation (a touched or locked node leaves a stale entry that is skipped),
  so one eviction costs O(log n), not a scan of the tree. Only the end of a walk can be a leaf,
  so a walk stamps last access on every node but pushes at most one heap entry.
* Access time is a logical clock (one tick per operation), so runs are deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import torch

from .hashing import Namespace, namespace_of, page_hashes
from .pools import SlotPool
from .prefix_tree import check_insert_slots
from .tokens import TOKEN_BYTES, TokenKey, Tokens

_EMPTY = torch.empty(0, dtype=torch.int64)
ChildKey = tuple[Namespace, bytes] | bytes


class TreeNode:
    """One node of :class:`RadixTree`: whole pages of one namespace, their device (and aux)
    slots, its children by first page, and its lock count."""

    __slots__ = (
        "_hashes",
        "aux_value",
        "child_key",
        "children",
        "heap_stamp",
        "key",
        "last_access",
        "length",
        "lock_ref",
        "namespace",
        "node_id",
        "parent",
        "value",
    )

    def __init__(
        self,
        node_id: int,
        key: bytes,
        value: torch.Tensor,
        parent: TreeNode | None,
        namespace: Namespace,
    ) -> None:
        self.node_id = node_id
        self.key = key
        self.length = len(key) // TOKEN_BYTES
        self.value = value
        self.parent = parent
        self.namespace = namespace
        self.children: dict[ChildKey, TreeNode] = {}
        self.child_key: ChildKey = b""
        """This node's key in its parent's ``children`` (the very object: its hash is cached)."""
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

    def tokens(self) -> list[int]:
        return TokenKey(self.key).tolist()

    def __repr__(self) -> str:
        return f"TreeNode(id={self.node_id}, len={self.length}, lock_ref={self.lock_ref})"


class MatchResult:
    """The longest cached prefix: its length, the node that ends exactly there, and its slots."""

    __slots__ = ("_indices", "_values", "last_node", "length")

    def __init__(self, values: list[torch.Tensor], last_node: TreeNode, length: int) -> None:
        self._values = values
        self._indices: torch.Tensor | None = None
        self.last_node = last_node
        self.length = length

    @property
    def device_indices(self) -> torch.Tensor:
        """Device slots of the prefix (int64, one per token), concatenated on first use."""
        if self._indices is None:
            values = self._values
            self._indices = (
                values[0] if len(values) == 1 else torch.cat(values) if values else _EMPTY
            )
        return self._indices


class TreeError(RuntimeError):
    """A tree operation was misused (unbalanced lock, foreign node, bad key)."""


class RadixTree:
    """stagefate's own paged radix tree over a device pool (the theory of operation is at the
    top of this module): what the replay, the fuzzers and a standalone pipeline run on."""

    def __init__(self, page_size: int, device_pool: SlotPool, aux_pool: SlotPool | None = None):
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.page_size = page_size
        self.device_pool = device_pool
        self.aux_pool = aux_pool
        self._page_bytes = page_size * TOKEN_BYTES
        self._ids = itertools.count()
        self.root = TreeNode(next(self._ids), b"", _EMPTY, None, (None, None))
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

    def _aligned(self, tokens: Tokens) -> bytes:
        data = tokens.data if type(tokens) is TokenKey else TokenKey.of(tokens).data
        cut = len(data) % self._page_bytes
        return data[: len(data) - cut] if cut else data

    def _common_bytes(self, node_key: bytes, key: bytes, pos: int) -> int:
        """Bytes of whole pages of ``node_key`` equal to ``key[pos:]`` (binary search)."""
        page = self._page_bytes
        # The first page is equal (it found the child); the bound is the shorter of the two.
        low, high = 1, min(len(node_key), len(key) - pos) // page
        while low < high:
            middle = (low + high + 1) // 2
            if key.startswith(node_key[: middle * page], pos):
                low = middle
            else:
                high = middle - 1
        return low * page

    def _child_slot(self, parent: TreeNode, namespace: Namespace, first_page: bytes) -> ChildKey:
        """Where a child hangs in ``parent.children``: namespaces only split the root's children
        (below it every node shares its parent's namespace), so deeper lookups key on the page."""
        return (namespace, first_page) if parent is self.root else first_page

    def _walk(self, key: bytes, namespace: Namespace) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Follow ``key`` from the root, cutting the node the match ends inside; stamps access.

        Returns the last node matched, the bytes matched and the device slots of each node.
        """
        now = self._tick()
        page = self._page_bytes
        node, pos, values = self.root, 0, []
        child = self.root.children.get((namespace, key[:page])) if key else None
        while child is not None:
            if key.startswith(child.key, pos):
                pos += len(child.key)
            else:  # the match ends inside ``child``: cut it there (the next lookup misses)
                common = self._common_bytes(child.key, key, pos)
                child = self._split(child, common)
                pos += common
            child.last_access = now
            values.append(child.value)
            node = child
            child = child.children.get(key[pos : pos + page]) if pos < len(key) else None
        return node, pos, values

    def _push_if_evictable(self, node: TreeNode) -> None:
        if node.lock_ref == 0 and not node.children and node.parent is not None:
            node.heap_stamp += 1
            heapq.heappush(self._heap, (node.last_access, node.heap_stamp, node.node_id, node))

    def _split(self, node: TreeNode, cut: int) -> TreeNode:
        """Cut ``node`` after ``cut`` bytes of key; return the new parent holding the head."""
        parent = node.parent
        assert parent is not None and 0 < cut < len(node.key)
        tokens = cut // TOKEN_BYTES
        head = TreeNode(
            next(self._ids), node.key[:cut], node.value[:tokens], parent, node.namespace
        )
        self._node_count += 1
        head.lock_ref = node.lock_ref
        head.last_access = node.last_access
        if node._hashes is not None:
            head._hashes = node._hashes[: tokens // self.page_size]
            node._hashes = node._hashes[tokens // self.page_size :]
        self._hang(parent, head)  # the head takes the node's place: same first page
        node.key = node.key[cut:]
        node.length -= tokens
        node.value = node.value[tokens:]
        node.parent = head
        self._hang(head, node)
        return head

    def _hang(self, parent: TreeNode, child: TreeNode) -> None:
        """Put ``child`` in ``parent.children`` under its first page (and namespace at the root)."""
        child.child_key = self._child_slot(parent, child.namespace, child.key[: self._page_bytes])
        parent.children[child.child_key] = child

    # ------------------------------------------------------------------ queries

    def match_prefix(
        self,
        tokens: Tokens,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> MatchResult:
        """Longest cached whole-page prefix of ``tokens`` under the namespace."""
        key = self._aligned(tokens)
        node, pos, values = self._walk(key, namespace_of(extra_key, cache_salt))
        self._push_if_evictable(node)
        return MatchResult(values, node, pos // TOKEN_BYTES)

    def insert(
        self,
        tokens: Tokens,
        device_indices: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """Add what is missing of ``tokens``; return the length that was already present."""
        return self.insert_node(tokens, device_indices, extra_key, cache_salt)[0]

    def insert_node(
        self,
        tokens: Tokens,
        device_indices: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> tuple[int, TreeNode]:
        """:meth:`insert`, also returning the node that ends at the inserted length."""
        namespace = namespace_of(extra_key, cache_salt)
        key = self._aligned(tokens)
        total = len(key) // TOKEN_BYTES
        check_insert_slots(total, device_indices)
        node, pos, _values = self._walk(key, namespace)
        present = pos // TOKEN_BYTES
        if pos < len(key):
            slots = device_indices[present:total].clone()
            node = self._add_leaf(node, key[pos:], slots, namespace, self._clock)
        self._push_if_evictable(node)
        return present, node

    def _add_leaf(
        self, parent: TreeNode, key: bytes, slots: torch.Tensor, namespace: Namespace, access: int
    ) -> TreeNode:
        leaf = TreeNode(next(self._ids), key, slots, parent, namespace)
        leaf.last_access = access
        if not parent.children:
            parent.heap_stamp += 1  # its heap entry is stale: it has a child now
        self._hang(parent, leaf)
        self.evictable_size += leaf.length
        self._node_count += 1
        return leaf

    def insert_leaf(
        self,
        parent: TreeNode,
        tokens: Tokens,
        present: int,
        slots: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> TreeNode:
        """Hang ``tokens[present:]`` below ``parent`` with ``slots`` (one per token, kept by the
        tree); return the node ending at ``len(tokens)``.

        ``parent`` is the ``last_node`` of a match of ``tokens`` that found exactly ``present``
        tokens, with the tree unchanged since: :meth:`insert_node` without a second walk.
        """
        page = self._page_bytes
        tail = self._aligned(tokens)[present * TOKEN_BYTES :]
        if slots.shape[0] != len(tail) // TOKEN_BYTES:
            raise ValueError(
                f"insert_leaf: {len(tail) // TOKEN_BYTES} tokens but {slots.shape[0]} slots"
            )
        if not tail:
            return parent
        namespace = namespace_of(extra_key, cache_salt)
        if self._child_slot(parent, namespace, tail[:page]) in parent.children:
            raise TreeError(
                f"insert_leaf: {parent!r} already holds the page after {present} tokens; "
                "match first (its last_node ends where the cached prefix ends)"
            )
        leaf = self._add_leaf(parent, tail, slots, namespace, self._tick())
        self._push_if_evictable(leaf)
        return leaf

    # ------------------------------------------------------------------ locks

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Pin ``node`` and its ancestors; return the tokens that became protected."""
        return self._lock_up(node, self.root)[0]

    def _lock_up(self, node: TreeNode, stop: TreeNode) -> tuple[int, TreeNode | None]:
        """Add one lock from ``node`` up to ``stop`` (not included) or the root; return the
        tokens that became protected and where the walk stopped."""
        root = self.root
        newly = 0
        current: TreeNode | None = node
        while current is not None and current is not root and current is not stop:
            if not current.lock_ref:
                newly += current.length
            current.lock_ref += 1
            current = current.parent
        self.evictable_size -= newly
        self.protected_size += newly
        return newly, current

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Undo one :meth:`inc_lock_ref`; return the tokens that became evictable."""
        if node.lock_ref <= 0 and node is not self.root:
            raise TreeError(f"dec_lock_ref below zero on {node!r}: every dec must match an inc")
        root = self.root
        freed = 0
        current: TreeNode | None = node
        while current is not None and current is not root:
            current.lock_ref -= 1
            if not current.lock_ref:
                freed += current.length
                if not current.children:
                    self._push_if_evictable(current)
            current = current.parent
        self.evictable_size += freed
        self.protected_size -= freed
        return freed

    def move_lock_ref(self, old: TreeNode, new: TreeNode) -> None:
        """:meth:`inc_lock_ref` of ``new``, then :meth:`dec_lock_ref` of ``old``.

        When ``old`` lies on ``new``'s path (a splice moving its pin down to the leaf it hung
        below the anchor), the path from ``old`` up keeps its count: one short walk, not two
        walks to the root. Otherwise both walks run. Raises, changing nothing, when ``old`` is
        not locked.
        """
        if old.lock_ref <= 0 and old is not self.root:
            raise TreeError(f"move_lock_ref from {old!r}: it is not locked (lock it first)")
        if self._lock_up(new, old)[1] is not old:  # ``old`` is off the path: undo it fully
            self.dec_lock_ref(old)

    # ------------------------------------------------------------------ eviction

    def evict(self, num_tokens: int) -> int:
        """Free LRU unlocked leaves until ``num_tokens`` are freed or none is left.

        Leaves are detached one by one (O(log n) heap work each) and their slots returned to
        the pool in one call at the end: a bulk eviction of k leaves pays the pool's checks once,
        not k times.
        """
        if not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"evict: num_tokens must be a non-negative int, got {num_tokens!r}")
        freed = 0
        slots: list[torch.Tensor] = []
        aux: list[torch.Tensor] = []
        heap, pop, detach = self._heap, heapq.heappop, self._detach_leaf  # hot loop: local names
        while freed < num_tokens and heap:
            _access, stamp, _nid, node = pop(heap)
            if stamp != node.heap_stamp or node.lock_ref or node.children or node.parent is None:
                continue
            freed += detach(node, slots, aux)
        self._free_slots(slots, aux)
        if len(self._heap) > 64 and len(self._heap) > 4 * (self._node_count + 1):
            self._rebuild_heap()
        return freed

    def _remove_leaf(self, node: TreeNode) -> int:
        slots: list[torch.Tensor] = []
        aux: list[torch.Tensor] = []
        removed = self._detach_leaf(node, slots, aux)
        self._free_slots(slots, aux)
        return removed

    def _detach_leaf(
        self, node: TreeNode, slots: list[torch.Tensor], aux: list[torch.Tensor]
    ) -> int:
        """Unlink ``node``; its device (and aux) slots go to ``slots`` (``aux``) to be freed."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.child_key]
        node.parent = None
        node.heap_stamp += 1
        slots.append(node.value)
        if node.aux_value is not None and self.aux_pool is not None:
            aux.append(node.aux_value)
            node.aux_value = None
        self.evictable_size -= node.length
        self._node_count -= 1
        self._push_if_evictable(parent)
        return node.length

    def _free_slots(self, slots: list[torch.Tensor], aux: list[torch.Tensor]) -> None:
        if slots:
            self.device_pool.free_many(slots)
        if aux and self.aux_pool is not None:
            self.aux_pool.free_many(aux)

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

    def cached_page_key(self, node: TreeNode) -> bytes | None:
        """The page key of the last page ending at ``node`` when the tree remembers it."""
        hashes = node._hashes
        return hashes[-1] if hashes else None

    def remember_page_keys(
        self,
        tokens: Tokens,
        digests: Sequence[bytes],
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Keep ``digests``, the page-key chain of ``tokens``, on the nodes holding those pages.

        A prefetch seeded at such a node hashes only its span. Nodes the pages do not cover
        whole are left alone; no node is split and no access is stamped (an LRU order must not
        depend on who hashed what).
        """
        page = self._page_bytes
        key = self._aligned(tokens)[: len(digests) * page]
        pos = 0
        child = self.root.children.get((namespace_of(extra_key, cache_salt), key[:page]))
        while child is not None and key.startswith(child.key, pos):
            end = pos + len(child.key)
            if child._hashes is None:
                child._hashes = list(digests[pos // page : end // page])
            pos = end
            child = child.children.get(key[pos : pos + page]) if pos < len(key) else None

    def node_hashes(self, node: TreeNode) -> list[bytes]:
        """The page-key chain of ``node``'s pages (computed on first use, kept across splits)."""
        if node.is_root:
            return []
        if node._hashes is None:
            parent = node.parent
            assert parent is not None
            seed = self.node_hashes(parent)[-1] if not parent.is_root else None
            node._hashes = page_hashes(TokenKey(node.key), self.page_size, node.namespace, seed)
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
        return sum(node.length for node in self.nodes())

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
            if parent is None or parent.children.get(node.child_key) is not node:
                raise TreeError(f"{node!r} is not reachable under its own child key")
            if node.child_key != self._child_slot(
                parent, node.namespace, node.key[: self._page_bytes]
            ):
                raise TreeError(f"{node!r} hangs under a key that is not its first page")
            if not node.key or len(node.key) % self._page_bytes:
                raise TreeError(f"{node!r} has a key of {len(node.key)} bytes, not whole pages")
            if node.length * TOKEN_BYTES != len(node.key) or node.value.numel() != node.length:
                raise TreeError(f"{node!r}: {node.value.numel()} slots for {node.length} tokens")
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
                protected += node.length
            else:
                evictable += node.length
            if node._hashes is not None:
                seed = self.node_hashes(parent)[-1] if not parent.is_root else None
                if node._hashes != page_hashes(
                    TokenKey(node.key), self.page_size, node.namespace, seed
                ):
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
