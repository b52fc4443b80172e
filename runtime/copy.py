"""Moving KV between L3, the host bounce buffer and the device pool.

* L3 → host (``read_into_host``): runs on the IO side; it only writes bounce slots.
* host → device (``h2d``): a gather from the bounce and a scatter into device slots. Slots come
  in runs (pools hand out consecutive slots, and a load's slots are usually allocated together):
  where source and destination both advance by one, a run is one strided slice copy, at the
  speed of a plain ``copy_``; scattered slots fall back to a per-plane index_select/index_copy_
  (an advanced-index assignment on dim 2 of the 5-D KV is several times slower). On CUDA it
  runs on a dedicated stream that first waits for the work already queued on the caller's
  stream (a freshly allocated slot may still be read by an earlier kernel), copies each run
  plane by plane straight out of the pinned bounce (a contiguous pinned source is what makes a
  non-blocking copy truly asynchronous), gathers scattered slots into a pinned staging tensor
  first, and records one event per load; completion is queried (``CopyHandle.done``), never
  busy-waited. On the CPU the copy is synchronous and its handle is done at once: the same
  behaviour, without the overlap; slots in runs are copied as NumPy slices of the pools' KV
  (``SlotPool.kv_array``), which costs less than torch's per-op dispatch at these sizes.
* device → host → L3 (``pages_of``): the producer side of ``write_through``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from .pools import Indices, SlotPool, as_array, is_run, numpy_view
from .storage import Storage


class CopyHandle(Protocol):
    """One queued copy (a load into the device, or a read into the host): poll it, wait for it,
    and once done ask whether it failed."""

    def done(self) -> bool:
        """Whether the copy has finished (successfully or not); never blocks."""
        ...

    def wait(self) -> None:
        """Block until the copy has finished."""
        ...

    def error(self) -> str | None:
        """Once done: why the copy failed, or None if it succeeded."""
        ...


class _Finished:
    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def error(self) -> str | None:
        return None


class _CudaEvent:
    def __init__(self, event: torch.cuda.Event) -> None:
        self._event = event

    def done(self) -> bool:
        return bool(self._event.query())  # type: ignore[no-untyped-call]

    def wait(self) -> None:
        self._event.synchronize()

    def error(self) -> str | None:
        return None  # a failed CUDA copy raises at the query or the synchronize


FINISHED: CopyHandle = _Finished()


def side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """A stream of its own for copies on a CUDA ``device``; None on the CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def record_done(stream: torch.cuda.Stream) -> CopyHandle:
    """A handle that is done once the work queued on ``stream`` so far has run."""
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(stream)
    return _CudaEvent(event)


class CopyEngine:
    """The copies between L3, the host bounce and the device pool (this module's docstring says
    how each runs); a load on CUDA runs on a stream of its own, polled through its
    :class:`CopyHandle`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = side_stream(device)
        """The H2D stream (None on the CPU): loads never run on the caller's stream."""

    def read_into_host(
        self,
        storage: Storage,
        keys: Sequence[str],
        host_pool: SlotPool,
        host_indices: Indices,
        page_size: int,
    ) -> int:
        """Read pages in order into the bounce; stop at the first missing or malformed page.

        Returns the tokens read (whole pages only). Pages after a miss are not read: a staged
        span must be a contiguous prefix of what was asked. A page of another dtype or page
        shape than the pool's is not this pool's KV: it ends the read like a miss.
        """
        tokens = len(keys) * page_size
        targets = as_array(host_indices[:tokens])
        if len(targets) < tokens:
            raise ValueError(
                f"read_into_host: {len(keys)} pages need {tokens} bounce slots, got "
                f"{len(targets)}; allocate a slot per token read"
            )
        kv_array, dtype = host_pool.kv_array, host_pool.layout.dtype
        if kv_array is not None and is_run(targets):
            # one run, as the pool hands slots out: the storage copies straight into the bounce
            first = int(targets[0])
            if first + tokens > kv_array.shape[2]:
                raise ValueError(
                    f"read_into_host: bounce slots {first}..{first + tokens - 1} lie past "
                    f"{host_pool.name}'s {kv_array.shape[2]} slots; read into slots it handed out"
                )
            out = kv_array[:, :, first : first + tokens]
            return storage.batch_get_into(keys, out, dtype) * page_size
        # scattered slots: the storage fills a staging block, then each token goes to its slot
        block = torch.empty(host_pool.layout.shape(tokens), dtype=dtype)
        read = storage.batch_get_into(keys, numpy_view(block), dtype) * page_size
        if read:
            copy_slots(block, torch.arange(read), host_pool.kv, torch.as_tensor(targets[:read]))
        return read

    def h2d(
        self,
        src_pool: SlotPool,
        src_indices: Indices,
        dst_pool: SlotPool,
        dst_indices: Indices,
    ) -> CopyHandle:
        """Queue ``dst[dst_indices] = src[src_indices]``; returns a handle to query."""
        count = len(src_indices)
        if count != len(dst_indices):
            raise ValueError(f"h2d: {count} source slots but {len(dst_indices)} destinations")
        if count == 0:
            return FINISHED
        if self.stream is None:
            runs = _runs(src_indices, dst_indices)
            src, dst = src_pool.kv_array, dst_pool.kv_array
            if (
                len(runs) * _MIN_RUN <= count
                and src is not None
                and dst is not None
                and src.dtype == dst.dtype  # one KV dtype: the same kind of view
            ):
                for s, d, length in runs:
                    dst[:, :, d : d + length] = src[:, :, s : s + length]
                return FINISHED
            sources, targets = torch.as_tensor(src_indices), torch.as_tensor(dst_indices)
            copy_slots(src_pool.kv, sources, dst_pool.kv, targets)
            return FINISHED
        stream = self.stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            sources, targets = torch.as_tensor(src_indices), torch.as_tensor(dst_indices)
            _upload(src_pool.kv, sources, dst_pool.kv, targets)
            return record_done(stream)

    @staticmethod
    def pages_of(pool: SlotPool, indices: torch.Tensor, page_size: int) -> list[torch.Tensor]:
        """The KV of ``indices`` as host page tensors ``[layers, 2, page_size, heads, dim]``."""
        host = pool.kv[:, :, indices.to(pool.device)].to("cpu")
        return [
            host[:, :, start : start + page_size].contiguous()
            for start in range(0, indices.numel() - page_size + 1, page_size)
        ]


def _upload(
    host_kv: torch.Tensor, src: torch.Tensor, device_kv: torch.Tensor, dst: torch.Tensor
) -> None:
    """Queue ``device_kv[:, :, dst] = host_kv[:, :, src]`` on the current (side) stream."""
    pinned = host_kv.is_pinned()
    runs = _runs(src, dst)
    planes = host_kv.shape[0] * host_kv.shape[1]
    device_planes = device_kv.view(planes, device_kv.shape[2], -1)
    if pinned and len(runs) * _MIN_RUN <= src.numel():
        host_planes = host_kv.view(planes, host_kv.shape[2], -1)
        for s, d, length in runs:  # each (plane, run) is one contiguous pinned block
            for plane in range(planes):
                device_planes[plane, d : d + length].copy_(
                    host_planes[plane, s : s + length], non_blocking=True
                )
        return
    staging, targets = host_kv[:, :, src], dst
    if pinned:  # the caching host allocator keeps each pinned block until its copy ran
        staging = staging.pin_memory()
        if targets.device.type == "cpu":
            # A pageable upload synchronizes the side stream: the caller would wait for every
            # copy queued before this one (seen on an H200, 2026-12-04).
            targets = targets.pin_memory()
    upload = staging.to(device_kv.device, non_blocking=pinned).view(planes, src.numel(), -1)
    targets = targets.to(device_kv.device, non_blocking=pinned)
    for plane in range(planes):
        device_planes[plane].index_copy_(0, targets, upload[plane])


_MIN_RUN = 16
"""Average run length (tokens) above which slice copies beat a gather/scatter."""
_LIST_SCAN = 512
"""Up to this many slots, runs are found in Python: cheaper than a dozen small torch ops."""


def copy_slots(
    src_kv: torch.Tensor, src_indices: torch.Tensor, dst_kv: torch.Tensor, dst_indices: torch.Tensor
) -> None:
    """``dst_kv[:, :, dst_indices] = src_kv[:, :, src_indices]`` for same-device KV tensors."""
    count = src_indices.numel()
    if src_indices.device != src_kv.device or dst_indices.device != dst_kv.device:
        src_indices, dst_indices = src_indices.to(src_kv.device), dst_indices.to(dst_kv.device)
    runs = _runs(src_indices, dst_indices)
    if len(runs) * _MIN_RUN <= count:
        for s, d, length in runs:
            dst_kv.narrow(2, d, length).copy_(src_kv.narrow(2, s, length))
        return
    planes = src_kv.shape[0] * src_kv.shape[1]
    src_planes = src_kv.view(planes, src_kv.shape[2], -1)
    dst_planes = dst_kv.view(planes, dst_kv.shape[2], -1)
    for plane in range(planes):
        dst_planes[plane].index_copy_(
            0, dst_indices, src_planes[plane].index_select(0, src_indices)
        )


def _runs(src: Indices, dst: Indices) -> list[tuple[int, int, int]]:
    """``(src_start, dst_start, length)`` of the maximal runs where both advance by one."""
    count = src.shape[0]
    if count == 0:
        return []
    if isinstance(src, np.ndarray) and isinstance(dst, np.ndarray) and is_run(src) and is_run(dst):
        return [(int(src[0]), int(dst[0]), count)]  # the usual case: one run each side
    if count <= _LIST_SCAN:
        src_list, dst_list = src.tolist(), dst.tolist()
        first_src, first_dst = src_list[0], dst_list[0]
        # the usual case, one run each side (pools hand out consecutive slots), in two compares
        if src_list == list(range(first_src, first_src + count)) and dst_list == list(
            range(first_dst, first_dst + count)
        ):
            return [(first_src, first_dst, count)]
        starts = [0] + [
            i
            for i in range(1, count)
            if src_list[i] != src_list[i - 1] + 1 or dst_list[i] != dst_list[i - 1] + 1
        ]
        firsts = [(src_list[i], dst_list[i]) for i in starts]
    else:
        src_t, dst_t = torch.as_tensor(src), torch.as_tensor(dst)
        breaks = ((src_t[1:] - src_t[:-1]) != 1) | ((dst_t[1:] - dst_t[:-1]) != 1)
        starts = [0, *(breaks.nonzero().flatten() + 1).tolist()]
        firsts = list(zip(src_t[starts].tolist(), dst_t[starts].tolist(), strict=True))
    ends = [*starts[1:], count]
    return [(s, d, end - start) for (s, d), start, end in zip(firsts, starts, ends, strict=True)]
