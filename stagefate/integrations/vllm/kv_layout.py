"""vLLM's paged KV seen as stagefate pages, on the worker.

stagefate's host bounce and L3 pages are ``[layers, 2, tokens, kv_heads, head_dim]``. vLLM keeps
one tensor per attention layer, in one of two layouts this module serves:

* the CPU backend's ``(num_blocks, kv_heads, block_size, 2 * head_dim)``: K and V side by side
  in the last dimension (K first);
* the ``(2, num_blocks, block_size, kv_heads, head_dim)`` layout of the GPU backends that keep K
  and V apart (FlashAttention's).

Any other shape is refused when the caches are registered, naming the shape found and the two
served, so a deployment learns at startup, not at the first load.

On CUDA a load runs as the runtime's H2D copies do (``runtime/copy.py``): on a stream of its
own that first waits for the work already queued on vLLM's stream (a block just allocated may
still be read by an earlier kernel), from a pinned staging copy of the bounce slots, and ends
with an event; its handle is queried, never waited on, and vLLM is told of the load only once
it is done. Reading blocks out for L3 (``pages``) runs on vLLM's stream, after the forward that
wrote them. On the CPU both are synchronous and a load's handle is done at once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from ...runtime.copy import FINISHED, CopyHandle, record_done, side_stream
from ...runtime.pools import KVLayout, SlotPool

Kind = Literal["cpu", "split"]
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


def _layer_order(name: str) -> int:
    found = _LAYER_INDEX.search(name)
    if found is None:
        raise ValueError(f"KV cache layer {name!r} carries no layer index; cannot order layers")
    return int(found.group(1))


class PagedKV:
    """One worker's KV caches, every layer in order, as pages of ``block_size`` tokens."""

    def __init__(
        self, kv_caches: dict[str, torch.Tensor], layout: KVLayout, block_size: int
    ) -> None:
        if len(kv_caches) != layout.layers:
            raise ValueError(
                f"vLLM registered {len(kv_caches)} KV caches for a model of {layout.layers} "
                "attention layers: only models whose every layer is full attention over one "
                "KV cache group are served"
            )
        self.layers = [kv_caches[name] for name in sorted(kv_caches, key=_layer_order)]
        self.layout, self.block_size = layout, block_size
        self.kind = _kind(self.layers[0], layout, block_size)
        for tensor in self.layers:
            if tensor.shape != self.layers[0].shape or tensor.dtype != layout.dtype:
                raise ValueError("vLLM's KV caches differ in shape or dtype across layers")
        self.device = self.layers[0].device
        self.stream = side_stream(self.device)
        """Loads' stream on CUDA (None on the CPU): never vLLM's own."""

    def pages(self, block_ids: Sequence[int]) -> list[torch.Tensor]:
        """The KV of ``block_ids`` as host pages ``[layers, 2, block_size, heads, dim]``."""
        if not block_ids:
            return []
        ids = torch.tensor(block_ids, dtype=torch.int64, device=self.layers[0].device)
        heads, dim = self.layout.kv_heads, self.layout.head_dim
        if self.kind == "cpu":
            # (blocks, heads, B, 2 * dim) per layer -> (blocks, layers, 2, B, heads, dim)
            stacked = torch.stack([layer[ids] for layer in self.layers])
            split = stacked.view(len(self.layers), len(block_ids), heads, self.block_size, 2, dim)
            per_block = split.permute(1, 0, 4, 3, 2, 5)
        else:
            # (2, blocks, B, heads, dim) per layer -> (blocks, layers, 2, B, heads, dim)
            stacked = torch.stack([layer[:, ids] for layer in self.layers])
            per_block = stacked.permute(2, 0, 1, 3, 4, 5)
        return [page.contiguous().cpu() for page in per_block]

    def write_from_host(
        self, host: SlotPool, host_slots: np.ndarray, block_ids: Sequence[int]
    ) -> CopyHandle:
        """Queue ``blocks[block_ids] = host[host_slots]`` (``block_size`` bounce slots per
        block); the handle is done once the blocks hold the KV."""
        count, size = len(block_ids), self.block_size
        if len(host_slots) != count * size:
            raise ValueError(
                f"a load of {count} blocks of {size} tokens needs {count * size} bounce slots, "
                f"got {len(host_slots)}"
            )
        if not count:
            return FINISHED
        source = host.kv[:, :, torch.as_tensor(host_slots)]  # (layers, 2, n, heads, dim)
        stream = self.stream
        if stream is None:
            self._scatter(source, block_ids)
            return FINISHED
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            # pinned, so the upload is asynchronous; the caching host allocator keeps the
            # staging copy until the copy that reads it has run
            self._scatter(source.pin_memory(), block_ids)
            return record_done(stream)

    def _scatter(self, source: torch.Tensor, block_ids: Sequence[int]) -> None:
        """``blocks[block_ids] = source`` (``(layers, 2, tokens, heads, dim)``) on the current
        stream."""
        count, size, device = len(block_ids), self.block_size, self.device
        heads, dim = self.layout.kv_heads, self.layout.head_dim
        blocks = source.view(len(self.layers), 2, count, size, heads, dim)
        blocks = blocks.to(device, non_blocking=source.is_pinned())
        ids = torch.tensor(list(block_ids), dtype=torch.int64, device=device)
        for index, layer in enumerate(self.layers):
            kv = blocks[index]  # (2, blocks, B, heads, dim)
            if self.kind == "cpu":
                # -> (blocks, heads, B, 2, dim) -> (blocks, heads, B, 2 * dim)
                layer[ids] = kv.permute(1, 3, 2, 0, 4).reshape(count, heads, size, 2 * dim)
            else:
                layer[:, ids] = kv


def _kind(tensor: torch.Tensor, layout: KVLayout, block_size: int) -> Kind:
    heads, dim = layout.kv_heads, layout.head_dim
    shape = tuple(tensor.shape)
    if len(shape) == 4 and shape[1:] == (heads, block_size, 2 * dim):
        return "cpu"
    if len(shape) == 5 and shape[0] == 2 and shape[2:] == (block_size, heads, dim):
        return "split"
    raise ValueError(
        f"vLLM's KV cache is {shape}; stagefate serves (num_blocks, {heads}, {block_size}, "
        f"{2 * dim}) (the CPU backend) and (2, num_blocks, {block_size}, {heads}, {dim}) "
        "(K and V apart): pick an attention backend with one of them"
    )
