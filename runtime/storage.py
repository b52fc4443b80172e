"""L3 storage: page objects keyed by the namespace-seeded page hash chain.

The interface is the one SGLang's HiCache storage backends expose, reduced to what staged
prefetches need. Every backend is thread-safe: the threaded IO executor calls it from worker
threads while the scheduler thread writes through.

``FileStorage`` writes one file per page atomically (temporary file, then ``os.replace``) with a
header carrying the format version, shape, dtype and a SHA-256 of the payload. A missing,
truncated or corrupt object reads as a miss and is counted; it is never returned as data, so a
bad page can only shorten a read, never be spliced; a damaged one is deleted, so the next
write-through of its key stores it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from ..output_files import atomic_output
from .pages import copy_pages_into, page_shape_in
from .pools import KVLayout, numpy_view, tensor_of_view

_MAGIC = b"SFKV"
_HEADER_START = 8
"""Bytes before a page's header: the magic and the header's length."""
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
    """An L3 of pages keyed by their chained page hashes: memory, files or Mooncake Store."""

    def batch_exists(self, keys: Sequence[str]) -> int:
        """How many keys exist consecutively from the first."""
        ...

    def batch_get(self, keys: Sequence[str]) -> list[torch.Tensor | None]:
        """The pages of ``keys`` as tensors (None where a key is missing)."""
        ...

    def batch_get_into(self, keys: Sequence[str], out: np.ndarray, dtype: torch.dtype) -> int:
        """Copy the pages of ``keys``, in order and back to back on dim 2, into ``out``: the
        NumPy view (:func:`~stagefate.runtime.pools.numpy_view`) of a run of ``dtype`` KV slots,
        ``len(keys)`` pages long. Returns the pages copied: the first page that is missing, or
        not of ``dtype`` and ``out``'s page shape, ends the read (nothing after it is copied)."""
        ...

    def batch_set(self, keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
        """Store one page per key (pages are content-addressed: a key already present holds the
        same page)."""
        ...

    def delete(self, keys: Sequence[str]) -> None:
        """Remove the pages of ``keys`` (absent keys are ignored)."""
        ...


@runtime_checkable
class ReportsDamage(Protocol):
    """A store that verifies its pages can say what it found damaged (:class:`FileStorage`)."""

    damaged: int
    """Pages found damaged when read, and removed."""
    unreadable: int
    """Pages the file system would not let this process read."""

    def damage_report(self) -> str:
        """What was found wrong with pages, in words; "" when nothing was."""
        ...


@runtime_checkable
class HoldsConnections(Protocol):
    """A backend with a client to shut (Mooncake's); memory and files hold none."""

    def close(self) -> None:
        """Shut the client's connections (once)."""
        ...


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

    def written_prefix(self, keys: Sequence[str]) -> int:
        """How many of ``keys``, from the first, it holds (:class:`KnowsWrites`: it is in this
        process, so knowing costs a dict lookup a key)."""
        return self.batch_exists(keys)

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


@runtime_checkable
class KnowsWrites(Protocol):
    """A store that remembers what it was given to write (:class:`WriteBehind`): a
    write-through skips the leading pages it already stored, without gathering them again."""

    def written_prefix(self, keys: Sequence[str]) -> int:
        """How many of ``keys``, from the first, this store wrote or has queued."""
        ...


class WriteBehind:
    """A store whose writes run on a thread of their own: a write-through on the scheduler's
    thread then costs its page gather and hashing, not the store's IO (SGLang's backups run on
    a thread too).

    It reads its own writes: a page queued and not yet written exists for an existence query
    and is read from memory, so a request arriving right after another's write-through finds
    it. It remembers the last ``remembered`` keys it was given (:meth:`written_prefix`), and
    forgets one the store turns out not to hold (a read or query that stopped short of it:
    damaged and deleted, or removed by another writer), so the next write-through stores it
    again. A write that raises is counted in :attr:`write_errors`, its keys forgotten, and the
    writer goes on; :meth:`close` writes what is queued, then stops. Anything else asked of it
    is the wrapped store's (``isinstance(store, ReportsDamage)`` holds when that store's does)."""

    def __init__(self, storage: Storage, remembered: int = 1 << 16) -> None:
        self.storage = storage
        self.write_errors = 0
        self._remembered = remembered
        self._known: OrderedDict[str, None] = OrderedDict()
        self._queued: dict[str, torch.Tensor] = {}
        self._queue: queue.Queue[tuple[list[str], list[torch.Tensor]] | None] = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._write, name="stagefate-writer", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        while (batch := self._queue.get()) is not None:
            keys, tensors = batch
            failed = False
            try:
                self.storage.batch_set(keys, tensors)
            except Exception:  # a failed write leaves misses; it never stops the writes
                failed = True
            with self._lock:
                self._pending -= 1
                self.write_errors += failed
                for key, tensor in zip(keys, tensors, strict=True):
                    if self._queued.get(key) is tensor:
                        del self._queued[key]
                    if failed:
                        self._known.pop(key, None)

    def pending(self) -> int:
        """Writes queued or running."""
        with self._lock:
            return self._pending

    def written_prefix(self, keys: Sequence[str]) -> int:
        with self._lock:
            count = 0
            for key in keys:
                if key not in self._known:
                    break
                self._known.move_to_end(key)
                count += 1
            return count

    def _forget(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._known.pop(key, None)

    def batch_exists(self, keys: Sequence[str]) -> int:
        count = 0
        while count < len(keys):
            with self._lock:
                queued = count
                while queued < len(keys) and keys[queued] in self._queued:
                    queued += 1
            if queued == len(keys):
                return queued
            stored = self.storage.batch_exists(keys[queued:])
            count = queued + stored
            if not stored:
                break
        self._forget(keys[count:])
        return count

    def batch_get(self, keys: Sequence[str]) -> list[torch.Tensor | None]:
        with self._lock:
            queued = [self._queued.get(key) for key in keys]
        missing = [key for key, page in zip(keys, queued, strict=True) if page is None]
        stored = iter(self.storage.batch_get(missing)) if missing else iter(())
        return [page if page is not None else next(stored) for page in queued]

    def batch_get_into(self, keys: Sequence[str], out: np.ndarray, dtype: torch.dtype) -> int:
        with self._lock:
            any_queued = any(key in self._queued for key in keys)
        if any_queued:
            read = copy_pages_into(iter(self.batch_get(keys)), out, dtype, len(keys))
        else:
            read = self.storage.batch_get_into(keys, out, dtype)
        self._forget(keys[read:])
        return read

    def batch_set(self, keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
        _check_pairs(keys, tensors)
        if not keys:
            return
        with self._lock:
            self._pending += 1
            for key, tensor in zip(keys, tensors, strict=True):
                self._queued[key] = tensor
                self._known[key] = None
                self._known.move_to_end(key)
            while len(self._known) > self._remembered:
                self._known.popitem(last=False)
        self._queue.put((list(keys), list(tensors)))

    def delete(self, keys: Sequence[str]) -> None:
        self._forget(keys)
        self.storage.delete(keys)

    def close(self) -> None:
        """Write what is queued, stop the writer, and shut the wrapped store's client (it is
        this store's: Mooncake's holds connections)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if isinstance(self.storage, HoldsConnections):
            self.storage.close()

    def __getattr__(self, name: str) -> Any:
        """What else the wrapped store tells (a file store's damage report, its counters):
        a wrapper must not hide it from the metrics and the replay's report."""
        if name == "storage":  # not set yet (during construction): no store to ask
            raise AttributeError(name)
        return getattr(self.storage, name)


class FileStorage:
    """One file per page under ``path``; survives restarts; damaged objects heal.

    A page is verified when read (its length and SHA-256, both in its header): a damaged one
    (truncated by a crash of another writer, a flipped bit, another format) is a miss, is
    deleted, and counted in :attr:`damaged`; the next write-through of its key stores it again
    (:attr:`rewritten`), so the store heals instead of failing every later read of it. Pages
    are written with ``file_mode`` and folders made with ``dir_mode`` (group-readable and a
    group-writable, setgid folder by default), so the instances of a group that share the
    store read, write and heal each other's pages; a page this process may not read is a miss
    counted in :attr:`unreadable` (wrong permissions, not damage: it is never deleted).
    """

    FILE_MODE = 0o640
    DIR_MODE = 0o2770

    def __init__(
        self,
        path: str | os.PathLike[str],
        file_mode: int = FILE_MODE,
        dir_mode: int = DIR_MODE,
    ) -> None:
        for name, mode in (("file_mode", file_mode), ("dir_mode", dir_mode)):
            if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
                raise ValueError(f"FileStorage: {name}={mode!r} is not a mode such as 0o640")
        if not file_mode & 0o400:
            raise ValueError(
                f"FileStorage: file_mode={file_mode:#o} does not let its owner read a page; "
                "give at least 0o400"
            )
        self.root = Path(path)
        self.file_mode, self.dir_mode = file_mode, dir_mode
        self._mkdir(self.root, parents=True)
        self._lock = threading.Lock()
        self.damaged = 0
        """Pages found damaged when read, deleted (each is a miss)."""
        self.rewritten = 0
        """Of those, pages a later write-through stored again."""
        self.unreadable = 0
        """Reads refused by the file system (permissions): misses, left in place."""
        self.misses = 0
        self._healing: set[str] = set()

    def _mkdir(self, folder: Path, parents: bool = False) -> None:
        if folder.is_dir():
            return
        folder.mkdir(parents=parents, exist_ok=True)
        # mkdir's mode passes through the umask; a folder another user of the store made at
        # the same moment is theirs to set
        with contextlib.suppress(PermissionError):
            folder.chmod(self.dir_mode)

    def _path(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"FileStorage: key {key!r} is not a plain file name")
        return self.root / key[:2] / key

    def batch_exists(self, keys: Sequence[str]) -> int:
        count = 0
        for key in keys:
            try:
                if self._path(key).stat().st_size <= _HEADER_START:
                    break  # an empty or cut file holds no page (a read would delete it)
            except OSError:
                break
            count += 1
        return count

    def batch_get(self, keys: Sequence[str]) -> list[torch.Tensor | None]:
        return [self._read(key) for key in keys]

    def batch_get_into(self, keys: Sequence[str], out: np.ndarray, dtype: torch.dtype) -> int:
        return copy_pages_into(map(self._read, keys), out, dtype, len(keys))

    def _read(self, key: str) -> torch.Tensor | None:
        path = self._path(key)
        try:
            blob = path.read_bytes()
        except PermissionError:
            with self._lock:
                self.unreadable += 1
            return None
        except OSError:
            with self._lock:
                self.misses += 1
            return None
        tensor = _decode(blob)
        if tensor is None:
            path.unlink(missing_ok=True)  # a write-through of the key then stores it anew
            with self._lock:
                self.damaged += 1
                self._healing.add(key)
        return tensor

    def batch_set(self, keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
        _check_pairs(keys, tensors)
        for key, tensor in zip(keys, tensors, strict=True):
            path = self._path(key)
            if path.exists():
                continue  # content-addressed: an existing page already holds these bytes
            self._mkdir(path.parent)
            # no output lock: a page is content-addressed, so two writers write the same bytes
            with atomic_output(path, binary=True, lock=False, mode=self.file_mode) as handle:
                handle.write(_encode(tensor))
            with self._lock:
                if key in self._healing:
                    self._healing.discard(key)
                    self.rewritten += 1

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)

    def damage_report(self) -> str:
        """What this store found wrong with its pages, in words ("" when nothing was):
        ``3 pages damaged, removed, 2 rewritten; 1 page unreadable (permissions: …)``."""
        parts = []
        if self.damaged:
            again = (
                "rewritten" if self.rewritten == self.damaged else f"{self.rewritten:,} rewritten"
            )
            parts.append(f"{_pages(self.damaged)} damaged, removed, {again}")
        if self.unreadable:
            parts.append(
                f"{_pages(self.unreadable)} unreadable (permissions: see FileStorage's modes)"
            )
        return "; ".join(parts)


def _pages(count: int) -> str:
    return f"{count:,} page{'' if count == 1 else 's'}"


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
    if len(blob) < _HEADER_START or blob[:4] != _MAGIC:
        return None
    (header_len,) = struct.unpack("<I", blob[4:_HEADER_START])
    try:
        header = json.loads(blob[_HEADER_START : _HEADER_START + header_len])
        dtype = _DTYPES[header["dtype"]]
        shape = [int(dim) for dim in header["shape"]]
        if header["version"] != _FORMAT_VERSION:
            return None
    except (ValueError, KeyError, TypeError):
        return None
    payload = blob[_HEADER_START + header_len :]
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
        path, _, mode = path.partition("?mode=")
        if not path:
            raise ValueError(f"storage {url!r}: give a folder, e.g. file:/var/cache/stagefate")
        if not mode:
            return FileStorage(path)
        try:
            file_mode = int(mode, 8)
        except ValueError:
            raise ValueError(
                f"storage {url!r}: mode {mode!r} is not octal; write the page files' mode as "
                "file:PATH?mode=0640"
            ) from None
        return FileStorage(path, file_mode=file_mode)
    if url.startswith("mooncake://"):
        from .mooncake import MooncakeConfig, MooncakeStorage

        return MooncakeStorage(MooncakeConfig.from_url(url), layout, page_size)
    raise ValueError(f"storage {url!r}: expected 'memory', 'file:PATH' or 'mooncake://HOST:PORT'")
