"""Every slot of SGLang's device pool and host bounce buffer has exactly one owner, at every step.

The books at quiescence (free plus cached equals the pool) say nothing of the steps between: a
slot freed while a read still writes into it, freed twice, or held by nobody until a later
abort happens to give it back all pass them. This module states ownership as SGLang's own
objects show it, after every step:

* **device slots**: each is either free in the allocator (its free and release pages), held by
  the tree (``all_values_flatten``) or by the running batch's decode (the scheduler's, which
  the caller passes), never two of these, never twice, and together the whole pool; a load back
  in flight writes only into slots the tree holds (its ``device_indices``).
* **host slots** (the bounce buffer): each is either free in the host pool (its free and release
  slots) or held by an operation or book of SGLang's, never both; free never twice; together the
  whole pool. The holders are found by walking (:mod:`.object_walk`): every tensor SGLang keeps
  under the name ``host_indices`` (its name for a bounce allocation in every release from 0.5.19
  to 0.5.23, in operations, prefetch records, staged holds and loads back) and every page queued
  for release (``host_mem_release_queue``). The same allocation reached through two books (an
  operation and its prefetch record share one tensor) is one owner. The owners whose slots are
  read directly (the tree, the allocator, the pools) are not walked: a check after every step
  must not cost the campaign half its speed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .object_walk import walk

_HOST_HOLDERS = (".host_indices", ".host_mem_release_queue[…]")
"""Path endings under which SGLang keeps bounce slots in use."""
_DEVICE_WRITERS = (".device_indices",)
"""Path endings under which an operation in flight names the device slots it writes."""


def slot_problems(cache: Any, allocator: Any, size: int, decoding: torch.Tensor) -> list[str]:
    """What breaks one owner per slot in the device pool (of ``size`` tokens; ``decoding``:
    the slots the running batch holds) and the host bounce buffer of ``cache`` (empty: none)."""
    read_directly = (
        cache.tree_core,
        allocator,
        cache.req_to_token_pool,
        cache.cache_controller.mem_pool_host,
        _host_pool(cache.cache_controller.mem_pool_host),
    )
    tensors = _tensors_under(cache, (*_HOST_HOLDERS, *_DEVICE_WRITERS), read_directly)
    return [
        *_device_problems(cache, allocator, size, decoding, _cat(tensors, _DEVICE_WRITERS)),
        *_host_problems(cache.cache_controller.mem_pool_host, _cat(tensors, _HOST_HOLDERS)),
    ]


def _device_problems(
    cache: Any, allocator: Any, size: int, decoding: torch.Tensor, writes: torch.Tensor
) -> list[str]:
    free = _free_device_slots(allocator)
    held = cache.all_values_flatten().to(torch.int64)
    problems = _owned_once(
        free, torch.cat([held, decoding.to(torch.int64)]), size, "device", "the tree or a decode"
    )
    if writes.numel():
        stray = writes[~torch.isin(writes, held)]
        if stray.numel():
            problems.append(
                f"a load back writes into {stray.numel()} device slots the tree does not hold "
                f"(e.g. {stray[:4].tolist()})"
            )
    return problems


def _host_pool(controllers: Any) -> Any:
    """The bounce buffer of the controller's host pool: 0.5.23 keeps a group of pools, of which
    full attention's is the anchor."""
    anchor = getattr(controllers, "anchor_entry", None)
    return controllers if anchor is None else anchor.host_pool


def _host_problems(controllers: Any, held: torch.Tensor) -> list[str]:
    host_pool = _host_pool(controllers)
    free = torch.cat([host_pool.free_slots.to(torch.int64), *_released(host_pool)])
    return _owned_once(free, _distinct(held), int(host_pool.size), "host", "an operation or book")


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


def _tensors_under(
    cache: Any, endings: tuple[str, ...], skip: Iterable[object]
) -> list[tuple[str, torch.Tensor]]:
    """Every tensor reachable from ``cache`` but through ``skip`` at a path with one of
    ``endings`` (each tensor object once), with its path."""
    return [
        (path, obj)
        for path, obj in walk({"cache": cache}, skip=skip)
        if isinstance(obj, torch.Tensor) and path.endswith(endings)
    ]


def _cat(tensors: list[tuple[str, torch.Tensor]], endings: tuple[str, ...]) -> torch.Tensor:
    """The slots of those of ``tensors`` whose path has one of ``endings``."""
    found = [
        tensor.reshape(-1).to(torch.int64) for path, tensor in tensors if path.endswith(endings)
    ]
    return torch.cat(found) if found else torch.empty(0, dtype=torch.int64)
