"""vLLM's prefix cache as the pipeline's :class:`~stagefate.runtime.prefix_tree.PrefixTree`.

vLLM keeps no tree: its block pool maps the chained hash of each full block (and the hashes of
everything before it) to the block holding that KV. A prefix match is therefore a walk down the
request's block hashes until one is not cached, exactly as vLLM's own ``find_longest_cache_hit``
does; a node is the path of blocks such a walk found (:class:`BlockPath`). The hashes are vLLM's,
computed with its own function, so the pipeline re-matches against the same cache vLLM's
scheduler reads, at every decision.

* A pin (``inc_lock_ref``) is ``BlockPool.touch``: one more reference on each block, which takes
  a free cached block out of the free queue, so vLLM's eviction cannot reuse it; ``dec_lock_ref``
  is ``free_blocks`` (tail first, vLLM's own eviction order for a request's blocks).
* ``insert_leaf`` adds nothing to vLLM's cache: the splice's blocks are the ones vLLM allocated
  for the request, and vLLM publishes them itself once their load is reported
  (``delay_cache_blocks``), or, for a synchronous load, when it allocates them (hidden from
  the match while the splice is planned: :meth:`VllmPrefixCache.loading_into`). The node it
  returns is the path through those blocks, so the pin the spec moves onto the spliced tail
  keeps them alive until the copy is acknowledged.
* ``evict`` frees nothing: vLLM evicts when it allocates; the pipeline's ``make_room`` then
  finds the splice fits or not in what vLLM granted.
* The LoRA adapter is the namespace's ``extra_key`` (:func:`lora_extra_key`) and vLLM's cache
  salt its ``cache_salt``: both enter the block hashes as vLLM's extra keys, on every block
  (LoRA) and on the first (salt), as vLLM puts them.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import KVCacheBlock

from ...runtime.hashing import Namespace, namespace_of
from ...runtime.tokens import TOKEN_BYTES, TokenKey, Tokens

_NO_SLOTS = torch.zeros(0, dtype=torch.int64)
_REMEMBERED = 1024
"""Hash chains kept (LRU): a few per live request."""


def lora_extra_key(name: str, path: str) -> str:
    """The namespace ``extra_key`` of a LoRA adapter (its name and path, as vLLM hashes them)."""
    return json.dumps(["lora", name, path])


def namespace_of_request(request: Any) -> Namespace:
    """The pipeline namespace of a vLLM request: its LoRA adapter and its cache salt."""
    lora = request.lora_request
    extra = None if not lora else lora_extra_key(lora.lora_name, lora.lora_path)
    return namespace_of(extra, request.cache_salt or None)


def _extra_keys(namespace: Namespace, first_block: bool) -> tuple[Any, ...] | None:
    extra_key, cache_salt = namespace
    keys: list[Any] = []
    if extra_key is not None:
        keys.append(tuple(json.loads(extra_key)))
    if first_block and cache_salt:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


@dataclass(frozen=True, eq=False)
class BlockPath:
    """A node: the blocks of a prefix from the first, with the hash each held when matched
    (``None`` for a spliced block vLLM has not published yet)."""

    blocks: tuple[KVCacheBlock, ...]
    hashes: tuple[bytes | None, ...]
    block_size: int

    @property
    def attached(self) -> bool:
        """Every published block still holds the KV it was matched for."""
        pairs = zip(self.blocks, self.hashes, strict=True)
        return all(h is None or block.block_hash == h for block, h in pairs)

    @property
    def lock_ref(self) -> int:
        return min((int(block.ref_cnt) for block in self.blocks), default=0)

    @property
    def length(self) -> int:
        return len(self.blocks) * self.block_size

    @property
    def device_indices(self) -> torch.Tensor:
        return block_slots([b.block_id for b in self.blocks], self.block_size)


def block_slots(block_ids: Sequence[int], block_size: int) -> torch.Tensor:
    """The token slots of ``block_ids``: ``block_id * block_size + offset``, in order."""
    if not block_ids:
        return _NO_SLOTS
    ids = torch.tensor(block_ids, dtype=torch.int64)
    return (ids[:, None] * block_size + torch.arange(block_size)).reshape(-1)


@dataclass(frozen=True)
class Match:
    """A match in vLLM's prefix cache as the lifecycle reads it (:class:`PrefixMatch`): the
    path of cached blocks it ends at."""

    last_node: BlockPath

    @property
    def length(self) -> int:
        return self.last_node.length

    @property
    def device_indices(self) -> torch.Tensor:
        return self.last_node.device_indices


class VllmPrefixCache:
    """The pipeline's prefix tree over vLLM's live block pool (bound once vLLM built it)."""

    def __init__(self, block_size: int, hash_function: Callable[[Any], bytes]) -> None:
        self.page_size = block_size
        self._hash = hash_function
        self._pool: BlockPool | None = None
        self._group = 0
        self._chains: OrderedDict[tuple[bytes, Namespace], tuple[bytes, ...]] = OrderedDict()
        self._pins: dict[int, int] = {}
        """Block id -> references the pipeline holds on it (every one is given back)."""
        self._not_yet_loaded: frozenset[int] = frozenset()
        """Blocks vLLM published for a synchronous load the splice is being planned into."""

    def bind(self, block_pool: BlockPool) -> None:
        self._pool = block_pool

    @property
    def pool(self) -> BlockPool:
        if self._pool is None:
            raise RuntimeError(
                "the StagefateConnector was asked to match before vLLM bound its block pool "
                "(bind_gpu_block_pool); this vLLM release is not supported"
            )
        return self._pool

    def block_hashes(self, tokens: Tokens, namespace: Namespace) -> tuple[bytes, ...]:
        """vLLM's chained hashes of every full block of ``tokens`` under ``namespace``.

        Every firing re-matches (the lock, the commit, the plan, the splice), mostly on the
        same prefixes: the chains of the last :data:`_REMEMBERED` are kept."""
        data = TokenKey.of(tokens).data
        key = (data, namespace)
        found = self._chains.get(key)
        if found is None:
            found = self._chains[key] = self._chain(data, namespace)
            if len(self._chains) > _REMEMBERED:
                self._chains.popitem(last=False)
        else:
            self._chains.move_to_end(key)
        return found

    def _chain(self, data: bytes, namespace: Namespace) -> tuple[bytes, ...]:
        size = self.page_size
        count = len(data) // (TOKEN_BYTES * size)
        if not count:  # an empty prefix (a root anchor): torch cannot view an empty buffer
            return ()
        ids = torch.frombuffer(bytearray(data[: count * size * TOKEN_BYTES]), dtype=torch.int64)
        rows = ids.reshape(count, size).tolist()
        parent: bytes | None = None
        hashes = []
        for index, row in enumerate(rows):
            parent = kv_cache_utils.hash_block_tokens(
                self._hash, parent, row, _extra_keys(namespace, index == 0)
            )
            hashes.append(parent)
        return tuple(hashes)

    # ------------------------------------------------------------------ what the pipeline reads

    @property
    def protected_size(self) -> int:
        return len(self._pins) * self.page_size

    @property
    def evictable_size(self) -> int:
        return int(self.pool.get_num_free_blocks()) * self.page_size

    def match_prefix(
        self, tokens: Tokens, extra_key: str | None = None, cache_salt: str | None = None
    ) -> Match:
        pool = self.pool
        blocks: list[KVCacheBlock] = []
        hashes: list[bytes] = []
        for block_hash in self.block_hashes(tokens, namespace_of(extra_key, cache_salt)):
            found = pool.get_cached_block(block_hash, [self._group])
            if not found or found[0].block_id in self._not_yet_loaded:
                break
            blocks.append(found[0])
            hashes.append(found[0].block_hash)
        return Match(BlockPath(tuple(blocks), tuple(hashes), self.page_size))

    @contextmanager
    def loading_into(self, block_ids: Sequence[int]) -> Iterator[None]:
        """While a synchronous load is spliced: vLLM published the blocks it allocated for the
        external tokens when it allocated them (it caches at once what it loads in the step),
        so a match would find the span on the device already and the plan decline it; within
        this block those blocks do not match, as an asynchronous load's are not published
        until their load is reported."""
        self._not_yet_loaded = frozenset(block_ids)
        try:
            yield
        finally:
            self._not_yet_loaded = frozenset()

    def insert_leaf(
        self,
        parent: BlockPath,
        tokens: Tokens,
        present: int,
        slots: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> BlockPath:
        size = self.page_size
        if present != parent.length or slots.numel() % size:
            raise ValueError(
                f"insert_leaf: the tail must start at the parent's end ({parent.length}, got "
                f"{present}) and fill whole blocks ({slots.numel()} slots)"
            )
        tail = [self.pool.blocks[int(slot) // size] for slot in slots[::size].tolist()]
        return BlockPath(parent.blocks + tuple(tail), parent.hashes + (None,) * len(tail), size)

    def inc_lock_ref(self, node: BlockPath) -> int:
        self.pool.touch(node.blocks)
        for block in node.blocks:
            self._pins[block.block_id] = self._pins.get(block.block_id, 0) + 1
        return node.lock_ref

    def dec_lock_ref(self, node: BlockPath) -> int:
        for block in node.blocks:
            left = self._pins[block.block_id] - 1
            if left:
                self._pins[block.block_id] = left
            else:
                del self._pins[block.block_id]
        self.pool.free_blocks(reversed(node.blocks))
        return node.lock_ref

    def move_lock_ref(self, old: BlockPath, new: BlockPath) -> None:
        self.inc_lock_ref(new)
        self.dec_lock_ref(old)

    def evict(self, num_tokens: int) -> int:
        return 0

    def cached_page_key(self, node: BlockPath) -> bytes | None:
        return None

    def remember_page_keys(
        self,
        tokens: Tokens,
        digests: Sequence[bytes],
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> None:
        return None

    # ------------------------------------------------------------------ writes vLLM makes itself

    def insert(
        self,
        tokens: Tokens,
        device_indices: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        raise self._written_by_vllm("insert")

    def insert_node(
        self,
        tokens: Tokens,
        device_indices: torch.Tensor,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> tuple[int, BlockPath]:
        raise self._written_by_vllm("insert_node")

    def attach_aux(self, node: BlockPath, aux_indices: torch.Tensor) -> None:
        raise self._written_by_vllm("attach_aux")

    @staticmethod
    def _written_by_vllm(call: str) -> TypeError:
        return TypeError(
            f"{call}: vLLM publishes blocks in its prefix cache itself (cache_blocks); the "
            "pipeline over vLLM only matches, pins and splices into blocks vLLM allocated"
        )

    # ------------------------------------------------------------------ inspection

    def nodes(self) -> Sequence[BlockPath]:
        """The blocks the pipeline pins now, one path each."""
        pool = self.pool
        return [
            BlockPath((pool.blocks[block_id],), (pool.blocks[block_id].block_hash,), self.page_size)
            for block_id in self._pins
        ]

    def total_tokens(self) -> int:
        return len(self.pool.cached_block_hash_to_block) * self.page_size

    def aux_slots(self) -> torch.Tensor:
        return _NO_SLOTS

    def sanity_check(self) -> None:
        """Every block the pipeline pins holds at least that many references in vLLM."""
        pool = self.pool
        for block_id, pins in self._pins.items():
            if pool.blocks[block_id].ref_cnt < pins:
                raise AssertionError(
                    f"block {block_id}: the pipeline holds {pins} pins but vLLM counts "
                    f"{pool.blocks[block_id].ref_cnt} references"
                )

    def pinned_blocks(self) -> dict[int, int]:
        """Block id -> references the pipeline holds now (empty when every pin was given back)."""
        return dict(self._pins)
