"""Every slot of SGLang's device pool and host bounce buffer has exactly one owner, at every step.

The books at quiescence (free plus cached equals the pool) say nothing of the steps between: a
slot freed while a read still writes into it, freed twice, or held by nobody until a later
abort happens to give it back all pass them. This module states ownership as SGLang's own
objects show it, after every step:

* **device slots**: each is either free in the allocator (its free and release pages), held by
  the tree (``all_values_flatten``) or by the running batch's decode (the scheduler's, which
  the caller passes), never two of these, never twice, and together the whole pool; a copy in
  flight uses only slots the tree holds (the ``device_indices`` a load back writes, or a
  write-through's device-to-host copy reads until SGLang confirms it, ``finish_backup_ack``).
* **host slots** (the bounce buffer): each is either free in the host pool (its free and release
  slots) or held by an operation or book of SGLang's, never both; free never twice; together the
  whole pool. The holders are found by walking (:mod:`.object_walk`): every tensor SGLang keeps
  under the name ``host_indices`` (its name for a bounce allocation in every release from 0.5.19
  to 0.5.23, in operations, prefetch records, staged holds and loads back) and every page queued
  for release (``host_mem_release_queue``). The same allocation reached through two books (an
  operation and its prefetch record share one tensor) is one owner. The owners whose slots are
  read directly (the tree, the allocator, the pools) are not walked: a check after every step
  must not cost the campaign half its speed.
* **a hybrid model's SWA pools** (:mod:`.hybrid`) are checked the same way, each on its own:
  SWA device slots are free in the SWA allocator, or held by the tree's SWA component, by a
  decode (its full slots' SWA peers) or by a load back until its copy completes
  (``aux_device_releases``); SWA host slots are free in the SWA host pool or held by a
  transfer of that pool. A transfer (``PoolTransfer``) names its pool, so its slots are
  counted there, as are the slots queued for release by pool (``extra_host_mem_release_queues``);
  every other ``host_indices`` is the bounce buffer's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .hybrid import full_allocator, is_hybrid, swa_peers
from .object_walk import walk

FULL = "kv"
"""SGLang's name (``PoolName.KV``) for full attention's pools; a transfer names its own."""
SWA = "swa"
"""SGLang's name (``PoolName.SWA``) for a hybrid's sliding-window pools."""
_HOST_HOLDERS = (".host_indices", ".host_mem_release_queue[…]")
"""Path endings under which SGLang keeps host slots in use."""
_DEVICE_COPIES = (".device_indices",)
"""Path endings under which a copy in flight names the device slots it writes (a load back) or
reads (a write-through's device-to-host copy)."""
_CONFIRMED_COPIES = ".ongoing_backup["
"""A write-through past its device-to-host copy (SGLang's ``finish_backup_ack``: "device
eviction may proceed"): the device slots its transfers still name are history."""
_DEVICE_RELEASES = ".aux_device_releases"
"""A load back's ``(pool, device slots)`` it frees once its copy completes (0.5.23)."""
_HOST_RELEASES = ".extra_host_mem_release_queues"
"""Host slots of the other pools (a hybrid's SWA), queued for release, by pool (0.5.23)."""


class _Holdings:
    """The slots SGLang's operations and books hold, by pool, found by walking the cache."""

    def __init__(self, cache: Any, skip: Iterable[object]) -> None:
        self.host: dict[str, list[torch.Tensor]] = {}
        self.copies: dict[str, list[torch.Tensor]] = {}
        self.releases: dict[str, list[torch.Tensor]] = {}
        pool_of: dict[int, str] = {}
        found: list[tuple[str, torch.Tensor]] = []
        for path, obj in walk({"cache": cache}, skip=skip):
            if _is_transfer(obj):
                for tensor in (obj.host_indices, obj.device_indices):  # type: ignore[attr-defined]
                    if tensor is not None:
                        pool_of[id(tensor)] = str(obj.name.value)  # type: ignore[attr-defined]
            elif path.endswith(_DEVICE_RELEASES) and isinstance(obj, list):
                for pool, slots in obj:
                    self.releases.setdefault(str(pool.value), []).append(_flat(slots))
            elif path.endswith(_HOST_RELEASES) and isinstance(obj, dict):
                for pool, queued in obj.items():
                    for slots in list(queued.queue):
                        self.host.setdefault(str(pool.value), []).append(_flat(slots))
            elif isinstance(obj, torch.Tensor):
                found.append((path, obj))
        for path, tensor in found:
            book = self.host if path.endswith(_HOST_HOLDERS) else None
            if path.endswith(_DEVICE_COPIES) and _CONFIRMED_COPIES not in path:
                book = self.copies
            if book is not None:
                book.setdefault(pool_of.get(id(tensor), FULL), []).append(_flat(tensor))

    @staticmethod
    def of(book: dict[str, list[torch.Tensor]], pool: str) -> torch.Tensor:
        slots = book.get(pool, [])
        return torch.cat(slots) if slots else torch.empty(0, dtype=torch.int64)


def slot_problems(cache: Any, allocator: Any, size: int, decoding: torch.Tensor) -> list[str]:
    """What breaks one owner per slot in the device pools (full attention's of ``size``
    tokens; ``decoding``: the full slots the running batch holds) and the host pools of
    ``cache`` (empty: none)."""
    host_pools = _host_pools(cache.cache_controller.mem_pool_host)
    read_directly = (
        cache.tree_core,
        allocator,
        cache.req_to_token_pool,
        cache.cache_controller.mem_pool_host,
        *host_pools.values(),
    )
    held = _Holdings(cache, read_directly)
    decoding = decoding.to(torch.int64)
    problems = _device_problems(
        "device",
        _free_device_slots(full_allocator(allocator)),
        torch.cat([cache.all_values_flatten().to(torch.int64), decoding]),
        held.of(held.copies, FULL),
        size,
    )
    if is_hybrid(allocator):
        tree = _swa_slots_of_the_tree(cache.tree_core, allocator)
        problems += _device_problems(
            "SWA device",
            _free_device_slots(allocator.swa_attn_allocator),
            torch.cat([tree, swa_peers(allocator, decoding), held.of(held.releases, SWA)]),
            held.of(held.copies, SWA),
            int(allocator.size_swa),
        )
    for name, host_pool in host_pools.items():
        problems += _host_problems(
            host_pool, _distinct(held.of(held.host, name)), "host" if name == FULL else "SWA host"
        )
    return problems


def _device_problems(
    pool: str, free: torch.Tensor, held: torch.Tensor, copies: torch.Tensor, size: int
) -> list[str]:
    problems = _owned_once(free, held, size, pool, "the tree or a decode")
    if copies.numel():
        stray = copies[~torch.isin(copies, held)]
        if stray.numel():
            problems.append(
                f"a copy in flight (a load back, or a write-through's device-to-host copy) "
                f"uses {stray.numel()} {pool} slots the tree does not hold "
                f"(e.g. {stray[:4].tolist()})"
            )
    return problems


def _host_pools(group: Any) -> dict[str, Any]:
    """The controller's host pools by name: every release from 0.5.19 keeps a group (full
    attention's bounce buffer, and a hybrid's SWA staging pool beside it)."""
    return {str(entry.name.value): entry.host_pool for entry in group.entries}


def _host_problems(host_pool: Any, held: torch.Tensor, pool: str) -> list[str]:
    free = torch.cat([host_pool.free_slots.to(torch.int64), *_released(host_pool)])
    return _owned_once(free, held, int(host_pool.size), pool, "an operation or book")


def _owned_once(
    free: torch.Tensor, held: torch.Tensor, size: int, pool: str, holder: str
) -> list[str]:
    owners = torch.bincount(torch.cat([free, held]))
    if int(owners.max()) <= 1 and int(owners.sum()) == size:
        return []  # every step comes here: one count, the messages only on a failure
    problems = []
    for slots, said in ((free, "free"), (held, "held")):
        twice = slots.numel() - _distinct(slots).numel()
        if twice:
            problems.append(f"{twice} {pool} slots are {said} twice")
    both = free[torch.isin(free, held)]
    if both.numel():
        problems.append(
            f"{both.numel()} {pool} slots are free and held by {holder} at once "
            f"(e.g. {both[:4].tolist()})"
        )
    owned = _distinct(torch.cat([free, held])).numel()
    if owned != size:
        problems.append(
            f"{size - owned} of the {size} {pool} slots are neither free nor held by {holder}"
            if owned < size
            else f"{owned} {pool} slots owned, more than the pool's {size}"
        )
    return problems


def _distinct(slots: torch.Tensor) -> torch.Tensor:
    distinct: torch.Tensor = torch.unique(slots)
    return distinct


def _free_device_slots(allocator: Any) -> torch.Tensor:
    pages = [allocator.free_pages]
    release = getattr(allocator, "release_pages", None)
    if release is not None:
        pages.append(release)
    page = int(allocator.page_size)
    first = torch.cat(pages).to(torch.int64) * page
    return (first[:, None] + torch.arange(page)).reshape(-1)


def _released(host_pool: Any) -> list[torch.Tensor]:
    return [slots.to(torch.int64) for slots in getattr(host_pool, "release_slots", [])]


def _is_transfer(obj: object) -> bool:
    return type(obj).__name__ == "PoolTransfer"


def _swa_slots_of_the_tree(tree_core: Any, allocator: Any) -> torch.Tensor:
    """The SWA device slots the tree holds. The Python core gives each node's SWA value; the
    Rust core (0.5.19-0.5.23) exposes no such walk, so there the full slots of the nodes whose
    SWA is resident (SGLang's own KV-canary walk) are mapped as the allocator maps them,
    ``full_to_swa_index_mapping``: an SWA value that disagreed with the mapping would go
    unseen on that core."""
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    per_node = getattr(tree_core, "_all_component_values_flatten", None)
    if per_node is not None:
        return _flat(per_node(ComponentType.SWA))
    full = tree_core.walk_for_kv_canary(False, True).slot_indices
    mapping = allocator.full_to_swa_index_mapping
    return _flat(mapping[full.to(mapping.device)])


def _flat(slots: torch.Tensor) -> torch.Tensor:
    return slots.reshape(-1).to(torch.int64)
