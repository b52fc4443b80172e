"""Building SGLang's ``UnifiedRadixCache`` on a CPU, as its scheduler builds it (FULL component).

One place for what the tree adapter and the tree benchmark share: the server args SGLang reads
globally, minimal pools of its own (the tree only reads their shapes), an allocator of the
caller's class, and the check that SGLang did not fall back to another tree core.
"""

from __future__ import annotations

from typing import Any

import torch


class CoreFallback(RuntimeError):
    """SGLang built another tree core than the one asked for (it falls back silently)."""


def tiny_kv_pool(size: int, page_size: int) -> Any:
    """SGLang's device KV pool with one layer, one head, one dim (float16, CPU)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(
        size=size,
        page_size=page_size,
        dtype=torch.float16,
        head_num=1,
        head_dim=1,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )


def build_unified_cache(core: str, page_size: int, slots: int, allocator_class: type) -> Any:
    """``(cache, allocator)``: SGLang's unified cache over ``slots`` KV slots (``core`` python
    or rust), or its legacy ``RadixCache`` (``core="radix"``)."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
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
    params = CacheInitParams(**pools, tree_components=(ComponentType.FULL,), tree_core_backend=core)
    cache = UnifiedRadixCache(params=params)
    if cache._tree_core_backend != core:
        raise CoreFallback(
            f"SGLang picked the {cache._tree_core_backend} tree core, not {core}: the Rust core "
            "needs Linux and torch 2.11 to 2.14"
        )
    return cache, allocator
