"""Building SGLang's ``UnifiedRadixCache`` on a CPU, as its scheduler builds it (FULL component).

One place for what the tree adapter, the stepped pipeline and the tree benchmark share: the
server args SGLang reads globally, minimal pools of its own (the tree only reads their shapes),
an allocator of the caller's class (:func:`pool_bridge_class` when stagefate's pool owns the
slots), and the check that SGLang did not fall back to another tree core.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ...integrations.sglang.tree import SGLangTreeError
from ...runtime.pools import SlotPool


class CoreFallback(RuntimeError):
    """SGLang built another tree core than the one asked for (it falls back silently)."""


def tiny_kv_pool(
    size: int,
    page_size: int,
    layers: int = 1,
    heads: int = 1,
    head_dim: int = 1,
    dtype: torch.dtype = torch.float16,
) -> Any:
    """SGLang's device KV pool on the CPU, one layer, one head and one dim unless asked."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(
        size=size,
        page_size=page_size,
        dtype=dtype,
        head_num=heads,
        head_dim=head_dim,
        layer_num=layers,
        device="cpu",
        enable_memory_saver=False,
    )


def pool_bridge_class() -> type:
    """SGLang's allocator over a stagefate :class:`~stagefate.runtime.pools.SlotPool`.

    ``bind(pool)``: frees go to ``pool`` (a double free or a foreign slot raises there) and
    ``alloc`` refuses: the tree adapter's tree never allocates, the pipeline does.
    ``bind(pool, allocates=True)``: ``alloc`` draws from ``pool`` too, for an SGLang pipeline
    that shares the pool with the replay's engine.
    """
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

    class PoolBridge(TokenToKVPoolAllocator):  # type: ignore[misc]
        def bind(self, pool: SlotPool, allocates: bool = False) -> None:
            self.stagefate_pool = pool
            self.allocates = allocates

        def free(self, free_index: torch.Tensor) -> None:
            if free_index.numel() == 0:
                return
            self.stagefate_pool.free(free_index.to(torch.int64).cpu())

        def alloc(self, need_size: int) -> torch.Tensor | None:
            if not self.allocates:
                raise SGLangTreeError("the adapted tree must not allocate: the pipeline owns slots")
            return self.stagefate_pool.alloc(need_size)

        def available_size(self) -> int:
            return self.stagefate_pool.available()

    return PoolBridge


def build_unified_cache(core: str, page_size: int, slots: int, allocator_class: type) -> Any:
    """``(cache, allocator)``: SGLang's unified cache over ``slots`` KV slots (``core`` python
    or rust), or its legacy ``RadixCache`` (``core="radix"``)."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    if core not in ("python", "rust", "radix"):
        raise ValueError(f"unknown SGLang tree core {core!r}; choose python, rust or radix")
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page_size))
    size = max(slots, page_size)
    kv = tiny_kv_pool(size, page_size)
    allocator = allocator_class(
        size=size, dtype=torch.float16, device="cpu", kvcache=kv, need_sort=False
    )
    pools: dict[str, Any] = dict(
        req_to_token_pool=ReqToTokenPool(
            size=4, max_context_len=8, device="cpu", enable_memory_saver=False
        ),
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        disable=False,
    )
    if core == "radix":
        from sglang.srt.mem_cache.radix_cache import RadixCache

        return RadixCache(params=CacheInitParams(**pools)), allocator
    cache, _ = unified_cache(core, **pools)
    return cache, allocator


def unified_cache(core: str, swa_window: int | None = None, **params: Any) -> tuple[Any, Any]:
    """``(cache, its CacheInitParams)``: a ``UnifiedRadixCache`` of the FULL component on the
    tree core ``core``, and the SWA component beside it with a ``swa_window`` (a hybrid
    model's, over :mod:`.hybrid`'s pools). 0.5.20 and later take the core as a
    ``CacheInitParams`` field; 0.5.19 reads ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` while it
    builds."""
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params["tree_components"] = (ComponentType.FULL,)
    if swa_window is not None:
        params["tree_components"] += (ComponentType.SWA,)
        params["sliding_window_size"] = swa_window
    if "tree_core_backend" in {field.name for field in dataclasses.fields(CacheInitParams)}:
        init = CacheInitParams(**params, tree_core_backend=core)
        cache = UnifiedRadixCache(params=init)
    else:
        init = CacheInitParams(**params)
        with envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND.override(core):
            cache = UnifiedRadixCache(params=init)
    if cache._tree_core_backend != core:
        raise CoreFallback(
            f"SGLang picked the {cache._tree_core_backend} tree core, not {core}: the Rust core "
            "needs Linux and torch 2.11 to 2.14"
        )
    return cache, init
