"""SGLang's device KV pool and its allocator, as the pipeline's device pool and copy engine.

SGLang keeps a full-attention model's device KV as one key and one value tensor per layer
(``MHATokenToKVPool.k_buffer[layer]``: ``[slots, kv_heads, head_dim]``) and hands slots out
through its own allocator. stagefate's pools keep ``[layers, 2, slots, kv_heads, head_dim]``
in one tensor, so neither can be a view of the other; the two bridges here move KV between
them slot by slot instead:

* :class:`EngineSlots` is SGLang's allocator as a :class:`~stagefate.runtime.pools.SlotPool`:
  a splice's slots come from SGLang's allocator and go back to it (SGLang's tree frees them
  when it evicts), so the spec's ``device_short`` reads what SGLang really has free;
* :class:`EngineLoads` copies the bounce into SGLang's per-layer buffers (``h2d``) and gathers
  SGLang's KV into stagefate's page layout for the write-through (``pages_of``). The load runs
  on the caller's stream, where SGLang's forward runs after it: on a CPU it is done when it
  returns; on CUDA the handle is the event recorded after it, and a forward queued later on
  the same stream cannot read the slots before the copy wrote them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...runtime.copy import FINISHED, CopyEngine, CopyHandle, record_done
from ...runtime.pools import Indices, KVLayout, PoolError, SlotPool, as_array


def layout_of(kv_pool: Any) -> KVLayout:
    """The per-token KV shape of SGLang's device pool (one key and one value per layer)."""
    return KVLayout(
        layers=int(kv_pool.layer_num),
        kv_heads=int(kv_pool.head_num),
        head_dim=int(kv_pool.head_dim),
        dtype=kv_pool.store_dtype,
    )


class EngineSlots(SlotPool):
    """SGLang's KV allocator as the pipeline's device pool (it holds no KV of its own)."""

    def __init__(self, allocator: Any) -> None:
        kv_pool = allocator.get_kvcache()
        super().__init__("sglang_device_pool", layout_of(kv_pool), 0, torch.device(kv_pool.device))
        self.allocator = allocator
        self.kv_pool = kv_pool
        self.capacity = int(allocator.size)

    def available(self) -> int:
        return int(self.allocator.available_size())

    def alloc_array(self, n: int) -> Any:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"{self.name}.alloc: n must be a non-negative int, got {n!r}")
        if n == 0:
            return as_array(torch.zeros(0, dtype=torch.int64))
        slots = self.allocator.alloc(n)
        return None if slots is None else as_array(slots.to(torch.int64).cpu())

    def free(self, indices: Indices) -> None:
        slots = torch.as_tensor(as_array(indices), dtype=torch.int64)
        if slots.numel():
            self.allocator.free(slots.to(self.kv_pool.device))

    def free_many(self, parts: Sequence[torch.Tensor]) -> None:
        for part in parts:
            self.free(part)

    def owned(self) -> int:
        return 0  # SGLang's allocator keeps its own books (its idle check reads them)

    def planes(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(keys, values)`` of each layer: SGLang's own tensors."""
        pool = self.kv_pool
        return [(pool.k_buffer[layer], pool.v_buffer[layer]) for layer in range(pool.layer_num)]


class EngineLoads(CopyEngine):
    """Copies between stagefate's bounce buffer and SGLang's per-layer device KV."""

    def h2d(
        self,
        src_pool: SlotPool,
        src_indices: Indices,
        dst_pool: SlotPool,
        dst_indices: Indices,
    ) -> CopyHandle:
        if not isinstance(dst_pool, EngineSlots):
            raise PoolError(f"EngineLoads copies into SGLang's KV, not into {dst_pool.name}")
        sources = torch.as_tensor(as_array(src_indices), dtype=torch.int64)
        targets = torch.as_tensor(as_array(dst_indices), dtype=torch.int64)
        if sources.numel() != targets.numel():
            raise ValueError(
                f"h2d: {sources.numel()} source slots but {targets.numel()} destinations"
            )
        if not sources.numel():
            return FINISHED
        device = dst_pool.kv_pool.device
        rows = src_pool.kv[:, :, sources].to(device, non_blocking=True)
        targets = targets.to(device)
        for layer, (keys, values) in enumerate(dst_pool.planes()):
            keys.index_copy_(0, targets, rows[layer, 0].to(keys.dtype))
            values.index_copy_(0, targets, rows[layer, 1].to(values.dtype))
        if torch.device(device).type == "cuda":
            return record_done(torch.cuda.current_stream(device))
        return FINISHED

    @staticmethod
    def pages_of(pool: SlotPool, indices: torch.Tensor, page_size: int) -> list[torch.Tensor]:
        if not isinstance(pool, EngineSlots):
            return CopyEngine.pages_of(pool, indices, page_size)
        slots = indices.to(torch.int64).to(pool.kv_pool.device)
        host = torch.stack(
            [torch.stack((keys[slots], values[slots])) for keys, values in pool.planes()]
        ).to("cpu", dtype=pool.layout.dtype)
        return [
            host[:, :, start : start + page_size].contiguous()
            for start in range(0, indices.numel() - page_size + 1, page_size)
        ]
