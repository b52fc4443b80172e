"""L3 storage: page objects keyed by the namespace-seeded page hash chain.

The interface is the one SGLang's HiCache storage backends expose, reduced to what staged
prefetches need. Every backend is thread-safe: the threaded IO executor calls it from worker
threads while the scheduler thread writes through.

``FileStorage`` writes one file per page atomically (temporary file, then ``os.replace``) with a
header carrying the format version, shape, dtype and a SHA-256 of the payload. A missing,
truncated or corrupt object reads as a miss and is counted; it is never returned as data, so a
bad page can only shorten a read, never be spliced.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from .pages import copy_pages_into, page_shape_in
from .pools import KVLayout, numpy_view, tensor_of_view

_MAGIC = b"SFKV"
_FORMAT_VERSION = 1
_DTYPES = {
    str(dtype): dtype
    for dtype in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
    )
}


@runtime_checkable
class Storage(Protocol):
    def batch_exists(self, keys: Sequence[str]) -> int:
        """How many keys exist consecutively from the first."""
        ...

    def batch_get(self, keys: Sequence[str]) -> list[torch.Tensor | None]: ...

    def batch_get_into(self, keys: Sequence[str], out: np.ndarray, dtype: torch.dtype) -> int:
        """Copy the pages of ``keys``, in order and back to back on dim 2, into ``out``: the
        NumPy view (:func:`~stagefate.runtime.pools.numpy_view`) of a run of ``dtype`` KV slots,
        ``len(keys)`` pages long. Returns the pages copied: the first page that is missing, or
        not of ``dtype`` and ``out``'s page shape, ends the read (nothing after it is copied)."""
        ...

    def batch_set(self, keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> None: ...

    def delete(self, keys: Sequence[str]) -> None: ...


def _check_pairs(keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    if len(keys) != len(tensors):
        raise ValueError(
            f"batch_set: {len(keys)} keys but {len(tensors)} tensors; pass one per key"
        )
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"batch_set takes tensors, got {type(tensor).__name__}")


_Page = tuple[np.ndarray, tuple[torch.dtype, tuple[int, ...]]]
"""A stored page: its KV as a C-contiguous NumPy array (:func:`numpy_view`'s kind: bytes for
bfloat16), and ``(dtype, shape)``, one value to compare with the slots a read fills. A plain
tuple: a NamedTuple's constructor is a Python call per page written."""


class MemoryStorage:
    """An in-process dict of CPU pages (the default L3); may be shared by pipelines.

    Pages are kept as NumPy arrays: a read into a run of bounce slots is then one
    ``np.concatenate`` into the bounce's NumPy view; :meth:`batch_get` wraps them in tensors.
    """

    def __init__(self) -> None:
        self._pages: dict[str, _Page] = {}
        self._lock = threading.Lock()
        self.reads = 0
        self.writes = 0

    def batch_exists(self, keys: Sequence[str]) -> int:
        with self._lock:
            count = 0
            for key in keys:
                if key not in self._pages:
                    break
                count += 1
            return count

    def batch_get(self, keys: Sequence[str]) -> list[torch.Tensor | None]:
        with self._lock:
            self.reads += len(keys)
            pages = [self._pages.get(key) for key in keys]
        return [None if page is None else tensor_of_view(page[0], page[1][0]) for page in pages]

    def batch_get_into(self, keys: Sequence[str], out: np.ndarray, dtype: torch.dtype) -> int:
        if not keys:
            return 0
        page_tokens, page_shape = page_shape_in(out, len(keys))
        fits = (dtype, page_shape)
        arrays = []
        with self._lock:
            self.reads += len(keys)
            for key in keys:
                page = self._pages.get(key)
                if page is None or page[1] != fits:
                    break
                arrays.append(page[0])
        if len(arrays) < len(keys):
            out = out[:, :, : len(arrays) * page_tokens]
        if arrays:  # one C call for the whole run (the pages are never written once stored)
            np.concatenate(arrays, axis=2, out=out)
        return len(arrays)

    def batch_set(self, keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
        _check_pairs(keys, tensors)
        pages: list[_Page] = []
        for tensor in tensors:
            array = numpy_view(tensor.detach().cpu().contiguous()).copy()  # the store's own
            pages.append((array, (tensor.dtype, array.shape)))
        with self._lock:
            self.writes += len(keys)
            for key, page in zip(keys, pages, strict=True):
                self._pages.setdefault(key, page)  # content-addressed: first write wins

    def delete(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._pages.pop(key, None)

    def __len__(self) -> int:
        return len(self._pages)

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Every object by key (the pages are never written after they are stored)."""
        with self._lock:
            return {
                key: tensor_of_view(array, kind[0]) for key, (array, kind) in self._pages.items()
            }


class FileStorage:
    """One file per page under ``path``; survives restarts; corrupt objects read as misses."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = Path(path)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.corrupt_reads = 0
        self.misses = 0

    def _path(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"FileStorage: key {key!r} is not a plain file name")
        return self.root / key[:2] / key

    def batch_exists(self, keys: Sequence[str]) -> int:
        count = 0
        for key in keys:
            if not self._path(key).exists():
                break
            count += 1
        return count

    def batch_get(self, keys: Sequence[str]) -> list[torch.Tensor | None]:
        return [self._read(key) for key in keys]

    def batch_get_into(self, keys: Sequence[str], out: np.ndarray, dtype: torch.dtype) -> int:
        return copy_pages_into(map(self._read, keys), out, dtype, len(keys))

    def _read(self, key: str) -> torch.Tensor | None:
        try:
            blob = self._path(key).read_bytes()
        except OSError:
            with self._lock:
                self.misses += 1
            return None
        tensor = _decode(blob)
        if tensor is None:
            with self._lock:
                self.corrupt_reads += 1
        return tensor

    def batch_set(self, keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
        _check_pairs(keys, tensors)
        for key, tensor in zip(keys, tensors, strict=True):
            path = self._path(key)
            if path.exists():
                continue  # content-addressed: an existing page already holds these bytes
            path.parent.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(_encode(tensor))
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)


def _encode(tensor: torch.Tensor) -> bytes:
    tensor = tensor.detach().to("cpu").contiguous()
    if str(tensor.dtype) not in _DTYPES:
        raise TypeError(
            f"FileStorage cannot store dtype {tensor.dtype}; use one of {list(_DTYPES)}"
        )
    payload = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    header = json.dumps(
        {
            "version": _FORMAT_VERSION,
            "dtype": str(tensor.dtype),
            "shape": list(tensor.shape),
            "sha256": hashlib.sha256(payload).hexdigest(),
        },
        sort_keys=True,
    ).encode()
    return _MAGIC + struct.pack("<I", len(header)) + header + payload


def _decode(blob: bytes) -> torch.Tensor | None:
    """The tensor in ``blob``, or None when anything about it is off."""
    if len(blob) < 8 or blob[:4] != _MAGIC:
        return None
    (header_len,) = struct.unpack("<I", blob[4:8])
    try:
        header = json.loads(blob[8 : 8 + header_len])
        dtype = _DTYPES[header["dtype"]]
        shape = [int(dim) for dim in header["shape"]]
        if header["version"] != _FORMAT_VERSION:
            return None
    except (ValueError, KeyError, TypeError):
        return None
    payload = blob[8 + header_len :]
    expected = torch.empty(shape, dtype=dtype).numel() * torch.empty((), dtype=dtype).element_size()
    if len(payload) != expected or hashlib.sha256(payload).hexdigest() != header["sha256"]:
        return None
    if not payload:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype).reshape(shape)


def open_storage(url: str, layout: KVLayout, page_size: int) -> Storage:
    """The L3 a URL names: ``memory``, ``file:PATH`` or ``mooncake://HOST:PORT``."""
    if url == "memory":
        return MemoryStorage()
    if url.startswith("file:"):
        path = url.removeprefix("file:").removeprefix("//")
        if not path:
            raise ValueError(f"storage {url!r}: give a folder, e.g. file:/var/cache/stagefate")
        return FileStorage(path)
    if url.startswith("mooncake://"):
        from .mooncake import MooncakeConfig, MooncakeStorage

        return MooncakeStorage(MooncakeConfig.from_url(url), layout, page_size)
    raise ValueError(f"storage {url!r}: expected 'memory', 'file:PATH' or 'mooncake://HOST:PORT'")
