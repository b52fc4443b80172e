"""SGLang's tree as the pipeline target builds it: a ``UnifiedRadixCache`` over a stagefate pool.

The adapter itself is :class:`stagefate.integrations.sglang.tree.SGLangTree` (the one SGLang's
engine uses too). Here the cache is built as SGLang's scheduler builds it (FULL component, the
page size, a request-to-token pool) over an allocator of :func:`~.cache.pool_bridge_class`:
a real ``TokenToKVPoolAllocator`` whose ``free`` returns slots to the stagefate pool the
pipeline allocates from (so a double free or a foreign slot raises there) and whose ``alloc``
refuses: the tree never allocates, the pipeline owns the device pool.
"""

from __future__ import annotations

from ...integrations.sglang.tree import SGLangTree, SGLangTreeError
from ...runtime.pools import SlotPool
from ...runtime.prefix_tree import PrefixTree, TreeFactory
from .cache import build_unified_cache, pool_bridge_class


def new_sglang_tree(core: str, page_size: int, device_pool: SlotPool) -> SGLangTree:
    """A new SGLang tree (tree core ``core``) over ``device_pool``."""
    from . import require

    require()
    cache, allocator = build_unified_cache(
        core, page_size, device_pool.capacity, pool_bridge_class()
    )
    allocator.bind(device_pool)
    return SGLangTree(cache, allocator, device_pool)


def sglang_tree_factory(core: str) -> TreeFactory:
    """A factory the pipeline takes: ``(page_size, device_pool, aux_pool) -> SGLangTree``."""

    def build(page_size: int, device_pool: SlotPool, aux_pool: SlotPool | None) -> PrefixTree:
        if aux_pool is not None:
            raise SGLangTreeError(
                "the SGLang target has no sliding-window aux pool: use sliding_window=None"
            )
        return new_sglang_tree(core, page_size, device_pool)

    return build
