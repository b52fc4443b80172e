"""``stagefate bench storage``: put/get throughput of the L3 backends, in the same run.

Memory, file (a temporary folder) and Mooncake Store (a master started on loopback, one client,
TCP); pages of 64 KiB and 1 MiB, 64 pages a batch, fresh keys for every put (a put of an
existing key is a no-op in Mooncake). Mooncake is skipped, with the reason, when its extra or
libibverbs1 is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterator

import torch

from ..runtime import FileStorage, KVLayout, MemoryStorage, Storage
from ..runtime.pools import numpy_view
from .report import Section, table

_LAYOUT = KVLayout(layers=8, kv_heads=8, head_dim=128)  # 32 KiB a token
_PAGES = 64
_REPEATS = 3


@contextlib.contextmanager
def _backends(page_tokens: int) -> Iterator[dict[str, Storage | str]]:
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
        backends: dict[str, Storage | str] = {
            "memory": MemoryStorage(),
            "file": FileStorage(folder),
        }
        try:
            from ..runtime.mooncake import LocalMaster, MooncakeStorage

            master = stack.enter_context(LocalMaster())
            config = dataclasses.replace(master.config, global_segment_size=1024 * 2**20)
            store = MooncakeStorage(config, _LAYOUT, page_tokens, staging_pages=_PAGES)
            stack.callback(store.close)
            backends["mooncake (tcp, loopback)"] = store
        except Exception as error:  # report why, keep the other backends
            backends["mooncake (tcp, loopback)"] = f"not run: {error}"
        yield backends


def _best(call: Callable[[int], None]) -> float:
    times = []
    for repeat in range(_REPEATS):
        started = time.perf_counter()
        call(repeat)
        times.append(time.perf_counter() - started)
    return min(times)


def _time_put_get(
    store: Storage, pages: list[torch.Tensor], tag: str
) -> tuple[float, float, float]:
    """Best seconds for a batch put, get (page tensors) and get into a run of bounce slots."""

    def keys(repeat: int) -> list[str]:
        return [f"bench-{tag}-{repeat}-{i}" for i in range(_PAGES)]

    page_tokens = pages[0].shape[2]
    bounce = numpy_view(torch.empty(_LAYOUT.shape(_PAGES * page_tokens), dtype=_LAYOUT.dtype))

    def put(repeat: int) -> None:
        store.batch_set(keys(repeat), pages)

    def get(repeat: int) -> None:
        store.batch_get(keys(repeat))

    def get_into(repeat: int) -> None:
        assert store.batch_get_into(keys(repeat), bounce, _LAYOUT.dtype) == _PAGES

    return _best(put), _best(get), _best(get_into)


def run() -> Section:
    rows: list[list[object]] = []
    for page_tokens in (2, 32):
        nbytes = page_tokens * _LAYOUT.bytes_per_token
        pages = [torch.rand(_LAYOUT.shape(page_tokens)).to(_LAYOUT.dtype) for _ in range(_PAGES)]
        with _backends(page_tokens) as backends:
            for name, store in backends.items():
                if isinstance(store, str):
                    rows.append([f"{nbytes // 1024} KiB", name, store, "", ""])
                    continue

                seconds = _time_put_get(store, pages, tag=str(page_tokens))
                total = nbytes * _PAGES
                rows.append(
                    [
                        f"{nbytes // 1024} KiB",
                        name,
                        *(f"{total / best / 1e6:,.0f}" for best in seconds),
                        f"{_PAGES} pages",
                    ]
                )
    body = table(["page", "backend", "put MB/s", "get MB/s", "get into bounce MB/s", "batch"], rows)
    body += (
        f"\n\nBest of {_REPEATS} batches each, on one machine. Memory copies on put and "
        "hands out tensors on its own pages on get, so its get figure is a dictionary lookup, "
        "not a transfer; its get into the bounce (`batch_get_into`, what a read into a run of "
        "bounce slots does) is one copy of the batch. File writes one object per page (header, "
        "checksum, atomic rename) and verifies it on read; Mooncake copies through its "
        "registered staging buffer and moves the bytes over TCP on loopback."
    )
    return Section("storage", "L3 storage: put/get throughput by backend", body)
