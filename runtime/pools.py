"""Slot pools: device KV (L1), host bounce buffer, and the sliding-window (aux) pool.

Every pool stores KV as ``[layers, 2, slots, kv_heads, head_dim]``. Slots are handed out as int64
index tensors on the CPU, or as int64 NumPy arrays (``alloc_array``) for index sets no tensor op
needs; ``free`` takes either. Ownership is tracked per slot, so a double free (or freeing a slot
that was never handed out) raises and names the slots, instead of corrupting the free list.
A CPU pool also shows its KV to NumPy (``kv_array``): small slice copies cost less there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import torch

_SMALL_FREE = 256
Indices = torch.Tensor | np.ndarray
"""Slot indices: an int64 tensor, or an int64 NumPy array (what :meth:`SlotPool.alloc_array`
hands out)."""
_NO_SLOTS = torch.zeros(0, dtype=torch.bool)
_NO_INDICES = torch.zeros(0, dtype=torch.int64)
_INT64 = np.dtype(np.int64)


@dataclass(frozen=True)
class KVLayout:
    """Per-token KV shape shared by every pool and every L3 page."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float16

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVLayout.{name} must be a positive int, got {value!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"KVLayout.dtype must be a torch.dtype, got {self.dtype!r}")

    def shape(self, slots: int) -> tuple[int, int, int, int, int]:
        return (self.layers, 2, slots, self.kv_heads, self.head_dim)

    @property
    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return self.layers * 2 * self.kv_heads * self.head_dim * itemsize


def resolve_device(device: str) -> torch.device:
    """``auto`` is ``cuda`` when a GPU is visible, else ``cpu``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


_NUMPY_DTYPES = frozenset(
    {torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16}
)


def numpy_view(kv: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU KV tensor, for byte-exact copies: its own dtype where NumPy has
    one, else its bytes (bfloat16, float8: the last dim counts bytes). Two tensors of one
    dtype always get views of one kind."""
    if kv.dtype in _NUMPY_DTYPES:
        return kv.numpy()
    return kv.view(torch.uint8).numpy()


def tensor_of_view(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`numpy_view`: a ``dtype`` tensor on the memory of ``array`` (C
    contiguous, as a byte view must be to widen back)."""
    return torch.from_numpy(array).view(dtype)


_RUN_SLOTS = 1 << 16
_RUN_BYTES = np.arange(_RUN_SLOTS, dtype=np.int64).tobytes()
"""The bytes of ``0, 1, …, 65535`` as int64: what a run of slots looks like."""


def is_run(indices: np.ndarray) -> bool:
    """``indices`` (int64) ascend by one from a non-negative start, as pools hand out slots.

    One ``memcmp`` against :data:`_RUN_BYTES` (shifted to start at 0 when the slots lie past
    it): a tenth of the cost of comparing Python lists, on the per-prefetch path.
    """
    count = len(indices)
    if not count:
        return False
    first = int(indices[0])
    if first >= 0 and first + count <= _RUN_SLOTS:
        return indices.tobytes() == _RUN_BYTES[first * 8 : (first + count) * 8]
    if first < 0:
        return False
    if count <= _RUN_SLOTS:
        return (indices - first).tobytes() == _RUN_BYTES[: count * 8]
    return bool((np.diff(indices) == 1).all())


def as_array(indices: Indices) -> np.ndarray:
    """Slot indices as a flat int64 NumPy array on the CPU (no copy when they already are)."""
    if isinstance(indices, np.ndarray):
        if indices.ndim == 1 and indices.dtype == _INT64:
            return indices  # what alloc_array hands out: no reshape or astype call
        return indices.reshape(-1).astype(np.int64, copy=False)
    if indices.device.type != "cpu" or indices.dtype != torch.int64:
        indices = indices.to(device="cpu", dtype=torch.int64)
    return indices.reshape(-1).numpy()


def _join(parts: Sequence[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """The parts as one flat int64 CPU tensor (written into ``out`` when given)."""
    if not parts:
        return _NO_INDICES
    return torch.cat([part.reshape(-1).to("cpu", torch.int64) for part in parts], out=out)


class PoolError(RuntimeError):
    """A slot was freed twice or freed without being allocated."""


class SlotPool:
    """A fixed number of KV slots with an O(n) vectorised alloc/free per call."""

    def __init__(
        self,
        name: str,
        layout: KVLayout,
        slots: int,
        device: torch.device,
        pin_memory: bool = False,
        kv: torch.Tensor | None = None,
    ) -> None:
        if not isinstance(slots, int) or slots < 0:
            raise ValueError(f"{name}: slots must be a non-negative int, got {slots!r}")
        self.name = name
        self.layout = layout
        self.capacity = slots
        self.device = device
        if kv is not None and (tuple(kv.shape) != layout.shape(slots) or kv.dtype != layout.dtype):
            raise ValueError(
                f"{name}: the KV given is {tuple(kv.shape)} {kv.dtype}, the layout needs "
                f"{layout.shape(slots)} {layout.dtype}"
            )
        if kv is not None:
            self.kv = kv  # handed in (a shared mapping): it stays where it is, pinning would copy
        else:
            self.kv = torch.zeros(layout.shape(slots), dtype=layout.dtype, device=device)
            if pin_memory and device.type == "cpu" and torch.cuda.is_available():
                self.kv = self.kv.pin_memory()
        self.kv_array = numpy_view(self.kv) if self.kv.device.type == "cpu" else None
        """The same KV memory seen by NumPy (CPU pools): slice copies cost less than torch's."""
        self._free = torch.arange(slots, dtype=torch.int64)
        self._free_array = self._free.numpy()  # the same memory: NumPy's small ops cost less
        self._top = slots
        # One ownership byte per slot, seen as a bytearray (per-slot checks), a NumPy array
        # (small scatters) and a bool tensor (vectorised checks for large frees).
        self._owned_bytes = bytearray(slots)
        self._owned_array = np.frombuffer(self._owned_bytes, dtype=np.bool_)
        self._owned = torch.frombuffer(self._owned_bytes, dtype=torch.bool) if slots else _NO_SLOTS

    def available(self) -> int:
        return self._top

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` slot indices, or ``None`` (nothing taken) when fewer than ``n`` are free."""
        indices = self.alloc_array(n)
        return None if indices is None else torch.from_numpy(indices)

    def alloc_array(self, n: int) -> np.ndarray | None:
        """:meth:`alloc` as an int64 NumPy array: for index sets no tensor op needs (a bounce's
        slots are only sliced, copied from and freed), without a tensor's per-op cost."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"{self.name}.alloc: n must be a non-negative int, got {n!r}")
        if n > self._top:
            return None
        indices: np.ndarray = self._free_array[self._top - n : self._top].copy()
        self._top -= n
        self._owned_array[indices] = True
        return indices

    def free(self, indices: Indices) -> None:
        """Return slots; raise :class:`PoolError` (nothing freed) on a double or foreign free."""
        array = as_array(indices)
        count = len(array)
        if count == 0:
            return
        if count > _SMALL_FREE:
            if count > self._top_room():
                self._reject_double_free(array.tolist())  # more than can be owned: some twice
            self._free_array[self._top : self._top + count] = array
            self._release_staged(count)
            return
        # below _SMALL_FREE, Python checks beat torch's and NumPy's per-call overhead
        if is_run(array):  # one run, as pools hand slots out: checked on the bytes
            first = int(array[0])
            if first + count > self.capacity:
                self._reject_out_of_range(array.tolist())
            if self._owned_bytes.find(0, first, first + count) != -1:
                self._reject_double_free(array.tolist())
            self._owned_array[first : first + count] = False
        else:
            slots = array.tolist()
            if min(slots) < 0 or max(slots) >= self.capacity:
                self._reject_out_of_range(slots)
            if len(set(slots)) != count or not all(map(self._owned_bytes.__getitem__, slots)):
                self._reject_double_free(slots)
            self._owned_array[array] = False
        self._free_array[self._top : self._top + count] = array
        self._top += count

    def free_many(self, parts: Sequence[torch.Tensor]) -> None:
        """:meth:`free` of many index tensors at once (a bulk eviction), with the same checks.

        The parts are joined by one C-level call straight above the free list's top (memory
        this pool already touched, no new buffer), so freeing k leaves costs one join and one
        vectorised check, not k.
        """
        count = sum(map(torch.Tensor.numel, parts))
        if count <= _SMALL_FREE or count > self._top_room():
            # small: per-slot checks; too many to be owned: the repeats are named
            self.free(parts[0] if len(parts) == 1 else _join(parts))
            return
        staged = self._free[self._top : self._top + count]
        try:  # tree values: 1-D int64 CPU tensors
            torch.cat(list(parts), out=staged)
        except (RuntimeError, TypeError):  # parts of other ranks, dtypes or devices
            _join(parts, out=staged)
        self._release_staged(count)

    def _top_room(self) -> int:
        return self.capacity - self._top

    def _release_staged(self, count: int) -> None:
        """Check the ``count`` indices staged above the free list's top and commit them; on a
        bad index nothing changes (the staged copy is above the top: unused space)."""
        indices = self._free[self._top : self._top + count]
        low, high = (int(bound) for bound in torch.aminmax(indices))  # one pass
        if low < 0 or high >= self.capacity:
            self._reject_out_of_range(indices.tolist())
        if not bool(self._owned[indices].all()):
            self._reject_double_free(indices.tolist())
        # A slot repeated within the call is cleared once: fewer slots end up freed than asked.
        # A sequential count of the ownership bytes (no sort, no scratch memory) tells: over the
        # indices' span, before and after, when that span is under half the pool (a bulk
        # eviction frees old leaves, often allocated together), else once over the whole pool.
        whole = 2 * (high + 1 - low) > self.capacity
        span = self._owned_array if whole else self._owned_array[low : high + 1]
        owned_before = self.capacity - self._top if whole else int(np.count_nonzero(span))
        self._owned[indices] = False
        if int(np.count_nonzero(span)) != owned_before - count:
            self._owned[indices] = True
            self._reject_double_free(indices.tolist())
        self._top += count

    def _reject_out_of_range(self, slots: list[int]) -> NoReturn:
        bad = [slot for slot in slots if not 0 <= slot < self.capacity]
        raise PoolError(
            f"{self.name}: slots out of range [0, {self.capacity}): {bad[:16]}; "
            "free only indices this pool handed out"
        )

    def _reject_double_free(self, slots: list[int]) -> NoReturn:
        counts = Counter(slots)
        bad = sorted(slot for slot, n in counts.items() if n > 1 or not self._owned_bytes[slot])
        raise PoolError(
            f"{self.name}: double free of slots {bad[:16]}"
            f"{' …' if len(bad) > 16 else ''} (they are not allocated, or repeated in the "
            f"call); each slot must be freed exactly once by its owner"
        )

    def owned(self) -> int:
        return self.capacity - self._top


class DevicePool(SlotPool):
    """The GPU KV pool (L1); on ``cuda`` when available, else ``cpu``."""

    def __init__(self, layout: KVLayout, slots: int, device: str | torch.device = "auto") -> None:
        resolved = resolve_device(device) if isinstance(device, str) else device
        super().__init__("device_pool", layout, slots, resolved)


class HostPool(SlotPool):
    """The host bounce buffer: staging only, pinned when a GPU is present."""

    def __init__(
        self,
        layout: KVLayout,
        slots: int,
        name: str = "host_pool",
        kv: torch.Tensor | None = None,
    ) -> None:
        super().__init__(name, layout, slots, torch.device("cpu"), pin_memory=True, kv=kv)


class AuxPool(SlotPool):
    """The device pool for the sliding-window (SWA) KV of spliced tails."""

    def __init__(self, layout: KVLayout, slots: int, device: str | torch.device = "auto") -> None:
        resolved = resolve_device(device) if isinstance(device, str) else device
        super().__init__("aux_pool", layout, slots, resolved)
