"""The side-by-side radix-tree workload of docs/design.md §9.1, for any tree.

Two 33,280-token documents, each with a 256-token branch every 512 tokens (a 32k prefix then
walks about 64 nodes), plus filler families (a 512-token shared prefix and 9 branches of 64 to
512 tokens) until the tree has about ``target_nodes`` nodes. The same keys, in the same order,
go into every tree measured; :func:`measure` times the operations through a small
:class:`TreeDriver` so stagefate's tree and SGLang's are timed on equal terms (keys encoded once,
outside the timed call, as each tree's own scheduler would hold them).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Protocol

from .report import median_seconds

DOC_TOKENS = 33_280
BRANCH_EVERY = 512
BRANCH_TOKENS = 256
FAMILY_PREFIX = 512
FAMILY_BRANCHES = 9
_DOC_BASE = (1_000_000, 2_000_000)
_BRANCH_BASE = 10_000_000
_FILLER_BASE = 100_000_000


def _aligned(length: int, page: int) -> int:
    return max(page, length - length % page)


def build_keys(page: int, target_nodes: int) -> tuple[list[list[int]], list[int]]:
    """The keys to insert, in order, and document A (the one the operations walk)."""
    keys: list[list[int]] = []
    docs = [list(range(base, base + DOC_TOKENS)) for base in _DOC_BASE]
    branch_id = _BRANCH_BASE
    for doc in docs:
        keys.append(doc)
        for end in range(BRANCH_EVERY, DOC_TOKENS, BRANCH_EVERY):
            keys.append(doc[:end] + list(range(branch_id, branch_id + BRANCH_TOKENS)))
            branch_id += BRANCH_TOKENS
    nodes = 2 * (2 * (DOC_TOKENS // BRANCH_EVERY))  # about: a split and a branch per boundary
    lengths = [_aligned(64 + (512 - 64) * i // (FAMILY_BRANCHES - 1), page) for i in range(9)]
    family = 0
    while nodes < target_nodes:
        start = _FILLER_BASE + family * 10_000
        prefix = list(range(start, start + FAMILY_PREFIX))
        for index, length in enumerate(lengths):
            tail_start = start + FAMILY_PREFIX + index * 1_000
            keys.append(prefix + list(range(tail_start, tail_start + length)))
        nodes += 1 + FAMILY_BRANCHES
        family += 1
    return keys, docs[0]


class TreeDriver(Protocol):
    """What :func:`measure` needs of a tree; keys are prepared once by :meth:`key`."""

    name: str

    def key(self, tokens: list[int]) -> object: ...

    def prepare_insert(self, key: object, length: int) -> Callable[[], object]:
        """Everything an insert needs but the insert (slots, values); the call does the insert."""
        ...

    def match(self, key: object) -> object: ...

    def node(self, key: object) -> object:
        """The node a match of ``key`` ends at (what a scheduler locks)."""
        ...

    def lock(self, node: object) -> object:
        """Lock ``node``'s path; returns what :meth:`unlock` takes."""
        ...

    def unlock(self, handle: object) -> None: ...

    def evict(self, tokens: int) -> int: ...

    def total_tokens(self) -> int: ...


def _median_us(call: Callable[[], object], repeats: int) -> float:
    return median_seconds(call, repeats) * 1e6


def measure(driver: TreeDriver, page: int, target_nodes: int, repeats: int) -> dict[str, float]:
    """Build the workload in ``driver`` and time each operation (µs; bulk eviction in ms)."""
    keys, doc = build_keys(page, target_nodes)
    for tokens in keys:
        driver.prepare_insert(driver.key(tokens), len(tokens))()
    prefix_1k, prefix_32k = driver.key(doc[:1024]), driver.key(doc[: 32 * 1024])
    figures = {
        "match 1k": _median_us(lambda: driver.match(prefix_1k), repeats),
        "match 32k": _median_us(lambda: driver.match(prefix_32k), repeats),
    }
    fresh = iter(range(900_000_000, 2_000_000_000, BRANCH_TOKENS))
    inserts = [
        driver.key(doc[: 32 * 1024] + list(range(start, start + BRANCH_TOKENS)))
        for start in (next(fresh) for _ in range(repeats))
    ]
    samples = []
    for key in inserts:
        insert = driver.prepare_insert(key, 32 * 1024 + BRANCH_TOKENS)
        start = time.perf_counter()
        insert()
        samples.append(time.perf_counter() - start)
    figures["insert 32k + 256"] = statistics.median(samples) * 1e6

    node = driver.node(prefix_32k)

    def lock_unlock() -> None:
        driver.unlock(driver.lock(node))

    figures["inc + dec, 32k path"] = _median_us(lock_unlock, repeats)
    figures["evict(num_tokens=1)"] = _median_us(lambda: driver.evict(1), repeats)
    tenth = driver.total_tokens() // 10
    start = time.perf_counter()
    driver.evict(tenth)
    figures["evict 10 % in one call (ms)"] = (time.perf_counter() - start) * 1e3
    return figures
