"""The engine's own KV pool, allocator and prefix cache, handed to the pipeline.

By default a :class:`~stagefate.statemachine.pipeline.BufferPipeline` builds its own device pool
and radix tree. An engine that already has them (vLLM's block pool and prefix cache, SGLang's
``RadixCache``) hands them in as an :class:`EngineCache` instead, so the lifecycle decides over
the engine's live state: every re-match reads the engine's prefix cache, every pin is a
reference the engine's eviction respects, and the splice lands in slots the engine allocated.

The pieces, each one the pipeline already uses through the same interface:

* ``tree_factory`` builds the :class:`~.prefix_tree.PrefixTree` over the engine's prefix cache
  (called with the page size and the two device pools, as for stagefate's own tree);
* ``device_pool`` is the engine's allocator as the pipeline sees it. Where the engine allocates
  the splice's slots itself before the splice is decided (vLLM allocates a request's blocks and
  then calls ``update_state_after_alloc``), it is a :class:`GrantedSlots`: the slots granted
  for the one splice being decided, nothing more;
* ``host_pool`` is the bounce buffer, when another process must see it (the engine's worker
  copies bounce → device: :class:`SharedHostPool`);
* ``copy`` moves bounce slots to device slots (a subclass of :class:`~.copy.CopyEngine` whose
  ``h2d`` hands the copy to the engine's worker and completes when the worker says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .copy import CopyEngine
from .pools import HostPool, Indices, KVLayout, PoolError, SlotPool, as_array
from .prefix_tree import TreeFactory


@dataclass(frozen=True)
class EngineCache:
    """What an engine hands :class:`BufferPipeline` in place of the pools and tree it builds."""

    tree_factory: TreeFactory
    device_pool: SlotPool
    host_pool: HostPool | None = None
    copy: CopyEngine | None = None


class GrantedSlots(SlotPool):
    """The engine's device slots for the splice being decided, granted before it is decided.

    The engine owns its KV and frees its own slots: this pool holds no KV, hands out exactly
    the slots :meth:`grant` gave (``available`` is their count, so the spec's ``device_short``
    reads what the engine really allocated), and refuses frees.
    """

    def __init__(self, layout: KVLayout, device: torch.device) -> None:
        super().__init__("engine_device_pool", layout, 0, device)
        self._granted = np.zeros(0, dtype=np.int64)

    def grant(self, slots: Indices) -> None:
        """The slots the engine allocated for the next splice (replacing any unused grant)."""
        self._granted = as_array(slots).copy()

    def revoke(self) -> None:
        """Forget an unused grant (the splice was not made)."""
        self._granted = np.zeros(0, dtype=np.int64)

    def available(self) -> int:
        return len(self._granted)

    def alloc_array(self, n: int) -> np.ndarray | None:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"{self.name}.alloc: n must be a non-negative int, got {n!r}")
        if n > len(self._granted):
            return None
        taken, self._granted = self._granted[:n], self._granted[n:]
        return taken

    def free(self, indices: Indices) -> None:
        if len(as_array(indices)):
            raise PoolError(
                f"{self.name}: the engine frees its own slots; stagefate never frees them "
                "(an eviction through the engine's prefix cache frees nothing here)"
            )

    def owned(self) -> int:
        return 0


class SharedHostPool(HostPool):
    """A host bounce buffer in a file mapping (``/dev/shm``) that another process maps too.

    The scheduler's pipeline reads L3 into it and the engine's worker, in its own process,
    copies from it into the device KV: both map the same file. The creator sizes the file;
    :meth:`attach` maps an existing one (it must have the creator's size: a mismatch is
    another engine's buffer, refused)."""

    def __init__(self, layout: KVLayout, slots: int, path: Path, create: bool = True) -> None:
        size = _numel(layout, slots)
        itemsize = torch.empty((), dtype=layout.dtype).element_size()
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as file:
                file.truncate(size * itemsize)
        elif not path.is_file() or path.stat().st_size != size * itemsize:
            raise ValueError(
                f"shared bounce buffer {path} is missing or not {size * itemsize} bytes: the "
                "scheduler side creates it; start the worker with the scheduler's settings"
            )
        kv = torch.from_file(str(path), shared=True, size=size, dtype=layout.dtype)
        self.path = path
        super().__init__(layout, slots, kv=kv.view(layout.shape(slots)))

    @classmethod
    def attach(cls, layout: KVLayout, slots: int, path: Path) -> SharedHostPool:
        return cls(layout, slots, path, create=False)

    def unlink(self) -> None:
        """Remove the file (the mapping stays valid in the processes that hold it)."""
        self.path.unlink(missing_ok=True)


def _numel(layout: KVLayout, slots: int) -> int:
    numel = 1
    for dim in layout.shape(slots):
        numel *= dim
    return numel
