"""``CopyPerRequestConnector``: the KV connector a user would write first, as the benchmark's
peer where none of vLLM's own or LMCache's loads anything on a CPU (docs/vllm.md, "Side by
side").

Each request looks its uncomputed blocks up by vLLM's own block hashes in an in-process store
and loads the run it finds, synchronously, before its forward; every full block a request
computes is stored after the forward. Nothing is shared, waited for or declined: N requests
that miss vLLM's cache on one prefix each load it. In-process vLLM only (the store is this
process's memory), vLLM's CPU KV layout only (a block is dimension 0 of each layer's tensor);
it counts the blocks it copies in and out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

_STORE: dict[Any, list[torch.Tensor]] = {}
"""vLLM block hash -> the block's KV, one tensor per layer (scheduler and worker share it)."""
COUNTS = {"loaded_blocks": 0, "stored_blocks": 0}


@dataclass
class _Copies(KVConnectorMetadata):
    loads: list[tuple[Any, int]] = field(default_factory=list)
    """(block hash, block id) to copy from the store before the forward."""
    saves: list[tuple[Any, int]] = field(default_factory=list)
    """(block hash, block id) to store after the forward."""


class CopyPerRequestConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.block_size = int(vllm_config.cache_config.block_size)
        self.is_scheduler = role == KVConnectorRole.SCHEDULER
        self._offered: dict[str, int] = {}
        """Request -> its local hit when it was last asked (where a load starts)."""
        self._saved: dict[str, int] = {}
        self._requests: dict[str, Any] = {}
        self._loads: list[tuple[Any, int]] = []
        self._kv: list[torch.Tensor] = []

    # ------------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        first = num_computed_tokens // self.block_size
        last = (request.num_tokens - 1) // self.block_size  # vLLM computes the last token
        found = 0
        for block_hash in request.block_hashes[first:last]:
            if block_hash not in _STORE:
                break
            found += 1
        self._requests[request.request_id] = request
        self._offered[request.request_id] = num_computed_tokens
        return found * self.block_size, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if not num_external_tokens:
            return
        first = self._offered[request.request_id] // self.block_size
        count = num_external_tokens // self.block_size
        block_ids = blocks.get_block_ids()[0][first : first + count]
        hashes = request.block_hashes[first : first + count]
        self._loads += list(zip(hashes, block_ids, strict=True))
        self._saved[request.request_id] = (first + count) * self.block_size

    def build_connector_meta(self, scheduler_output: Any) -> _Copies:
        saves = []
        for rid, scheduled in scheduler_output.num_scheduled_tokens.items():
            request = self._requests.get(rid)
            if request is None or self._kv_cache_manager is None:
                continue
            done = self._saved.get(rid, request.num_computed_tokens)
            end = request.num_computed_tokens + scheduled
            end = min(end, len(request.block_hashes) * self.block_size)
            first, last = done // self.block_size, end // self.block_size
            block_ids = self._kv_cache_manager.get_block_ids(rid)[0]
            saves += [(request.block_hashes[i], block_ids[i]) for i in range(first, last)]
            self._saved[rid] = max(done, last * self.block_size)
        meta, self._loads = _Copies(self._loads, saves), []
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        for book in (self._requests, self._saved, self._offered):
            book.pop(request.request_id, None)
        return False, None

    # ------------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._kv = list(kv_caches.values())

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, _Copies)
        for block_hash, block_id in meta.loads:
            for layer, page in zip(self._kv, _STORE[block_hash], strict=True):
                layer[block_id].copy_(page)
            COUNTS["loaded_blocks"] += 1

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, _Copies)
        for block_hash, block_id in meta.saves:
            if block_hash not in _STORE:
                _STORE[block_hash] = [layer[block_id].clone() for layer in self._kv]
                COUNTS["stored_blocks"] += 1
