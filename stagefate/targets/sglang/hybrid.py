"""A hybrid model's device pools: SGLang's SWA component beside full attention, on a CPU.

A hybrid model (Gemma 3, GPT-OSS, Llama 4) keeps two KV pools: full attention's, which a prefix
hit reuses whole, and a smaller one for its sliding-window layers, of which a prefix hit needs
only the last ``window`` tokens. SGLang builds them as an ``SWAKVPool`` (one pool per kind of
layer) under an ``SWATokenToKVPoolAllocator``, which hands out full-attention slots and keeps a
``full_to_swa_index_mapping`` from each to its SWA peer; the radix cache gets an SWA component
beside FULL (``tree_components``) and, in buffer mode, an SWA host staging pool beside the
bounce buffer. The fuzz world builds exactly that, with one layer of each kind, so that every
buffer-mode path of SGLang's that a hybrid takes (SWA tail pages, tombstones, the SWA window a
load attaches) runs under the same moves and invariants as full attention: each SWA slot has
one owner, and the window a load brings holds its tokens' marks.

The allocator refuses ``alloc`` on pages larger than one token: a paged hybrid allocates as the
scheduler's prefill does, through ``alloc_extend`` (fresh pages here: the world's inserts and
decode growth have no partial page to extend).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SlidingWindow:
    """The SWA half of a hybrid model."""

    window: int
    """The layers' sliding window (tokens): what a prefix hit must hold of the SWA pool."""
    swa_tokens: int
    """The SWA device pool (tokens), smaller than full attention's as in SGLang's sizing."""


def device_allocator(size: int, page_size: int, hybrid: SlidingWindow | None) -> Any:
    """The allocator of ``size`` full-attention slots over a KV pool of one layer of each kind
    (``get_kvcache()``), as SGLang's model runner builds them (a paged allocator; a hybrid's
    has SWA beside)."""
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator

    if hybrid is None:
        from .cache import tiny_kv_pool

        kv = tiny_kv_pool(size, page_size)
        return PagedTokenToKVPoolAllocator(size, page_size, torch.float16, "cpu", kv, False)
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    kv = SWAKVPool(
        size=size,
        size_swa=hybrid.swa_tokens,
        page_size=page_size,
        dtype=torch.float16,
        head_num=1,
        head_dim=1,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device="cpu",
    )
    return SWATokenToKVPoolAllocator(
        size, hybrid.swa_tokens, page_size, torch.float16, "cpu", kv, False
    )


def is_hybrid(allocator: Any) -> bool:
    return hasattr(allocator, "swa_attn_allocator")


def full_allocator(allocator: Any) -> Any:
    """The allocator of full attention's slots: a hybrid's own, or ``allocator`` itself."""
    return allocator.full_attn_allocator if is_hybrid(allocator) else allocator


def allocate(allocator: Any, tokens: int) -> torch.Tensor | None:
    """``tokens`` fresh device slots (whole pages), or None when the pool is short. A hybrid's
    come through ``alloc_extend`` with an SWA peer each."""
    if not is_hybrid(allocator):
        slots: torch.Tensor | None = allocator.alloc(tokens)
        return slots
    none = torch.zeros(1, dtype=torch.int64)
    length = torch.tensor([tokens], dtype=torch.int64)
    no_page = torch.tensor([-1], dtype=torch.int64)
    extended: torch.Tensor | None = allocator.alloc_extend(
        none, none, length, length, no_page, tokens
    )
    return extended


def kv_buffers(allocator: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(full attention's K of the one layer, the SWA layer's K or None)``."""
    kv = allocator.get_kvcache()
    if not is_hybrid(allocator):
        return kv.k_buffer[0], None
    return kv.full_kv_pool.k_buffer[0], kv.swa_kv_pool.k_buffer[0]


def swa_peers(allocator: Any, slots: torch.Tensor) -> torch.Tensor:
    """The SWA slots the allocator maps full-attention ``slots`` to (0: none)."""
    peers: torch.Tensor = allocator.full_to_swa_index_mapping[slots.to(torch.int64)]
    return peers


def write(allocator: Any, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Write ``values`` (one per token) into ``slots`` of every layer: full attention's, and
    the SWA peers' where the model is hybrid."""
    full, swa = kv_buffers(allocator)
    full[slots] = values.reshape(-1, 1, 1)
    if swa is not None:
        swa[swa_peers(allocator, slots)] = values.reshape(-1, 1, 1)
