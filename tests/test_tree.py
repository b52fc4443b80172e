"""The live radix tree against a plain reference model, plus unit cases for split/lock/evict."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from stagefate.runtime import DevicePool, KVLayout, RadixTree, TreeError
from stagefate.runtime.hashing import page_hashes

LAYOUT = KVLayout(layers=1, kv_heads=1, head_dim=1)


def make_tree(page_size: int = 1, slots: int = 256) -> RadixTree:
    return RadixTree(page_size, DevicePool(LAYOUT, slots, "cpu"))


def test_split_keeps_lock_ref_hashes_and_matches() -> None:
    tree = make_tree()
    slots = tree.device_pool.alloc(6)
    assert slots is not None
    tree.insert([1, 2, 3, 4, 5, 6], slots)
    leaf = tree.match_prefix([1, 2, 3, 4, 5, 6]).last_node
    tree.inc_lock_ref(leaf)
    hashes = list(tree.node_hashes(leaf))
    head = tree.match_prefix([1, 2, 3]).last_node  # splits the node
    assert head is not leaf and head.lock_ref == 1 and leaf.parent is head
    assert tree.node_hashes(head) + tree.node_hashes(leaf) == hashes
    assert tree.evict(100) == 0  # everything is locked
    tree.dec_lock_ref(leaf)
    tree.sanity_check()
    assert tree.evict(100) == 6 and tree.device_pool.available() == 256


def test_remembered_page_keys_seed_the_chain_and_change_nothing_else() -> None:
    """A write-through offers its page keys; the tree keeps them on the nodes holding those
    pages without splitting a node or stamping an access, and a key continues the chain."""
    tree = make_tree(page_size=2)
    slots = tree.device_pool.alloc(6)
    assert slots is not None
    tree.insert([1, 2, 3, 4, 5, 6], slots, cache_salt="s")
    node = tree.match_prefix([1, 2, 3, 4, 5, 6], cache_salt="s").last_node
    access, count = node.last_access, tree.node_count()
    assert tree.cached_page_key(node) is None
    chain = page_hashes([1, 2, 3, 4, 5, 6, 7, 8], 2, (None, "s"))
    tree.remember_page_keys([1, 2, 3, 4], chain[:2], cache_salt="s")  # ends inside the node
    assert tree.cached_page_key(node) is None and tree.node_count() == count
    tree.remember_page_keys([1, 2, 3, 4, 5, 6, 7, 8], chain, cache_salt="s")  # past its end
    assert tree.cached_page_key(node) == chain[2] and node.last_access == access
    assert page_hashes([7, 8], 2, (None, "s"), seed=chain[2]) == chain[3:]
    tree.sanity_check()  # the kept keys are the node's own chain


def test_insert_leaf_hangs_the_tail_below_a_fresh_match() -> None:
    tree = make_tree(page_size=2)
    head, tail = tree.device_pool.alloc(4), tree.device_pool.alloc(4)
    assert head is not None and tail is not None
    tree.insert([1, 2, 3, 4], head)
    match = tree.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9])
    leaf = tree.insert_leaf(match.last_node, [1, 2, 3, 4, 5, 6, 7, 8, 9], match.length, tail)
    assert leaf.parent is match.last_node and leaf.tokens() == [5, 6, 7, 8]
    again = tree.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])
    assert again.last_node is leaf and torch.equal(again.device_indices, torch.cat([head, tail]))
    tree.sanity_check()
    spare = tree.device_pool.alloc(4)
    assert spare is not None
    with pytest.raises(TreeError, match="already holds the page"):
        tree.insert_leaf(match.last_node, [1, 2, 3, 4, 5, 6, 7, 8], 4, spare)
    with pytest.raises(ValueError, match="4 tokens but 2 slots"):
        tree.insert_leaf(leaf, [1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0], 8, spare[:2])
    with pytest.raises(ValueError, match="0 tokens but 1 slots"):  # nothing to hang: no slots
        tree.insert_leaf(leaf, [1, 2, 3, 4, 5, 6, 7, 8], 8, spare[:1])
    assert tree.insert_leaf(leaf, [1, 2, 3, 4, 5, 6, 7, 8], 8, spare[:0]) is leaf
    assert tree.node_count() == 2 and tree.evict(100) == 8


def test_dec_lock_ref_below_zero_raises_and_changes_nothing() -> None:
    tree = make_tree()
    slots = tree.device_pool.alloc(2)
    assert slots is not None
    tree.insert([1, 2], slots)
    node = tree.match_prefix([1, 2]).last_node
    with pytest.raises(TreeError, match="below zero"):
        tree.dec_lock_ref(node)
    tree.sanity_check()


def _locks(tree: RadixTree) -> tuple[list[tuple[list[int], int]], int, int]:
    nodes = sorted((node.tokens(), node.lock_ref) for node in tree.nodes())
    return nodes, tree.evictable_size, tree.protected_size


@pytest.mark.parametrize("where", ["below", "same", "sibling"])
def test_move_lock_ref_equals_inc_then_dec(where: str) -> None:
    """Moving a lock leaves every node's count and the tree's sizes as ``inc_lock_ref(new)``
    then ``dec_lock_ref(old)`` would: down the path (a splice's pin moving to its leaf), onto
    the node itself, or onto a node off the path."""
    twins = make_tree(), make_tree()
    for tree in twins:
        slots = tree.device_pool.alloc(7)
        assert slots is not None
        tree.insert([1, 2, 3, 4, 5], slots[:5])
        tree.insert([1, 2, 3, 9, 9], torch.cat([slots[:3], slots[5:]]))
        tree.device_pool.free(slots[:3])  # the second insert's duplicates
    new_tokens = {"below": [1, 2, 3, 4, 5], "same": [1, 2, 3], "sibling": [1, 2, 3, 9, 9]}[where]
    moved, reference = twins
    for tree in twins:
        tree.inc_lock_ref(tree.match_prefix([1, 2, 3, 4]).last_node)
    moved.move_lock_ref(
        moved.match_prefix([1, 2, 3, 4]).last_node, moved.match_prefix(new_tokens).last_node
    )
    new = reference.match_prefix(new_tokens).last_node
    reference.inc_lock_ref(new)
    reference.dec_lock_ref(reference.match_prefix([1, 2, 3, 4]).last_node)
    assert _locks(moved) == _locks(reference)
    moved.sanity_check()
    unlocked = moved.match_prefix([1, 2, 3, 9, 9] if where != "sibling" else [1, 2, 3, 4])
    before = _locks(moved)
    with pytest.raises(TreeError, match="not locked"):
        moved.move_lock_ref(unlocked.last_node, moved.root)
    assert _locks(moved) == before


def test_namespaces_never_share_nodes() -> None:
    tree = make_tree()
    a, b = tree.device_pool.alloc(3), tree.device_pool.alloc(3)
    assert a is not None and b is not None
    assert tree.insert([1, 2, 3], a, cache_salt="x") == 0
    assert tree.insert([1, 2, 3], b, cache_salt="y") == 0
    assert torch.equal(tree.match_prefix([1, 2, 3], cache_salt="x").device_indices, a)
    assert torch.equal(tree.match_prefix([1, 2, 3], cache_salt="y").device_indices, b)
    assert tree.match_prefix([1, 2, 3]).length == 0
    assert page_hashes([1, 2, 3], 1, (None, "x")) != page_hashes([1, 2, 3], 1, (None, "y"))


def test_an_empty_prefix_matches_the_root() -> None:
    """A root anchor's re-match asks for no tokens (issue 54: vLLM's adapter once raised)."""
    tree = make_tree(4)
    tree.insert(list(range(8)), torch.arange(8))
    match = tree.match_prefix([])
    assert match.length == 0 and match.device_indices.numel() == 0


def test_partial_pages_are_ignored() -> None:
    tree = make_tree(page_size=4)
    slots = tree.device_pool.alloc(8)
    assert slots is not None
    assert tree.insert(list(range(10)), slots) == 0  # 8 tokens stored, the tail page dropped
    assert tree.match_prefix(list(range(10))).length == 8
    assert tree.match_prefix([0, 1, 2, 3, 4, 5, 9, 9]).length == 4


def test_evict_takes_least_recently_used_leaf_first() -> None:
    tree = make_tree()
    for first in (1, 2, 3):
        slots = tree.device_pool.alloc(2)
        assert slots is not None
        tree.insert([first, 0], slots)
    tree.match_prefix([1, 0])  # 1 is now the most recent
    assert tree.evict(2) == 2
    assert tree.match_prefix([2, 0]).length == 0
    assert tree.match_prefix([1, 0]).length == 2 and tree.match_prefix([3, 0]).length == 2


PAGE = 2
tokens_st = st.lists(st.integers(0, 3), min_size=0, max_size=12).map(
    lambda t: t[: len(t) - len(t) % PAGE]
)
namespace_st = st.sampled_from([None, "a"])


class TreeAgainstReference(RuleBasedStateMachine):
    """Reference: a dict from (namespace, whole sequence) to the slots first inserted for it."""

    @initialize()
    def setup(self) -> None:
        self.tree = make_tree(page_size=PAGE, slots=512)
        self.reference: dict[tuple[str | None, tuple[int, ...]], list[int]] = {}
        self.locks: list[tuple[object, tuple[str | None, tuple[int, ...]]]] = []

    def _reference_prefix(self, salt: str | None, tokens: tuple[int, ...]) -> int:
        best = 0
        for (ns, seq), _slots in self.reference.items():
            if ns != salt:
                continue
            common = 0
            while common < min(len(seq), len(tokens)) and seq[common] == tokens[common]:
                common += 1
            best = max(best, common - common % PAGE)
        return best

    def _reference_slots(self, salt: str | None, tokens: tuple[int, ...], n: int) -> list[int]:
        out: list[int] = []
        for position in range(n):
            page_end = (position // PAGE + 1) * PAGE  # the tree shares whole pages only
            for (ns, seq), slots in self.reference.items():
                if ns == salt and seq[:page_end] == tokens[:page_end]:
                    out.append(slots[position])
                    break
        return out

    @rule(tokens=tokens_st, salt=namespace_st)
    def insert(self, tokens: list[int], salt: str | None) -> None:
        key = tuple(tokens)
        present = self._reference_prefix(salt, key)
        slots = self.tree.device_pool.alloc(len(key))
        if slots is None:
            return
        got = self.tree.insert(key, slots, cache_salt=salt)
        assert got == present
        kept = self._reference_slots(salt, key, present) + slots[present:].tolist()
        self.tree.device_pool.free(slots[:present])  # the caller's duplicates
        if key:
            self.reference[(salt, key)] = kept

    @rule(tokens=tokens_st, salt=namespace_st)
    def match(self, tokens: list[int], salt: str | None) -> None:
        key = tuple(tokens)
        result = self.tree.match_prefix(key, cache_salt=salt)
        expected = self._reference_prefix(salt, key)
        assert result.length == expected
        assert result.device_indices.tolist() == self._reference_slots(salt, key, expected)

    @rule(tokens=tokens_st, salt=namespace_st)
    def lock(self, tokens: list[int], salt: str | None) -> None:
        result = self.tree.match_prefix(tuple(tokens), cache_salt=salt)
        if result.length:
            self.tree.inc_lock_ref(result.last_node)
            self.locks.append((result.last_node, (salt, tuple(tokens[: result.length]))))

    @precondition(lambda self: bool(self.locks))
    @rule(index=st.integers(0, 100))
    def unlock(self, index: int) -> None:
        node, _ = self.locks.pop(index % len(self.locks))
        self.tree.dec_lock_ref(node)  # type: ignore[arg-type]

    @precondition(lambda self: bool(self.locks))
    @rule(index=st.integers(0, 100), tokens=tokens_st, salt=namespace_st)
    def move_lock(self, index: int, tokens: list[int], salt: str | None) -> None:
        result = self.tree.match_prefix(tuple(tokens), cache_salt=salt)
        if result.length:
            node, _ = self.locks.pop(index % len(self.locks))
            self.tree.move_lock_ref(node, result.last_node)  # type: ignore[arg-type]
            self.locks.append((result.last_node, (salt, tuple(tokens[: result.length]))))

    @rule(amount=st.integers(0, 12))
    def evict(self, amount: int) -> None:
        self.tree.evict(amount)
        # the reference forgets what the tree evicted; locked prefixes must still be there
        for salt, seq in list(self.reference):
            length = self.tree.match_prefix(seq, cache_salt=salt).length
            if length < len(seq):
                kept = self.reference.pop((salt, seq))[:length]
                if length:
                    self.reference.setdefault((salt, seq[:length]), kept)
        for _node, (salt, seq) in self.locks:
            assert self.tree.match_prefix(seq, cache_salt=salt).length == len(seq)

    @invariant()
    def structure_and_conservation(self) -> None:
        self.tree.sanity_check()
        pool = self.tree.device_pool
        assert pool.available() + self.tree.total_tokens() == pool.capacity

    @invariant()
    def hashes_consistent(self) -> None:
        for node in self.tree.nodes():
            self.tree.node_hashes(node)
        self.tree.sanity_check()


TestTreeAgainstReference = TreeAgainstReference.TestCase
