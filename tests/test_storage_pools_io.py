"""Pools (double free), L3 backends (corruption, restart, concurrency) and the IO executors."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stagefate.runtime import (
    CopyEngine,
    DevicePool,
    FileStorage,
    HostPool,
    IOOp,
    IOResult,
    KVLayout,
    ManualIO,
    MemoryStorage,
    PoolError,
    ThreadedIO,
)
from stagefate.runtime.copy import copy_slots
from stagefate.runtime.pools import is_run
from stagefate.runtime.storage import open_storage

LAYOUT = KVLayout(layers=2, kv_heads=1, head_dim=4)


def page(value: float) -> torch.Tensor:
    return torch.full(LAYOUT.shape(4), value, dtype=LAYOUT.dtype)


def test_pool_double_free_raises_names_slots_and_frees_nothing(device: str) -> None:
    pool = DevicePool(LAYOUT, 8, device)
    assert pool.kv.device.type == device
    slots = pool.alloc(3)
    assert slots is not None and pool.available() == 5
    pool.free(slots[:1])
    with pytest.raises(PoolError, match=r"double free of slots \[" + str(int(slots[0])) + r"\]"):
        pool.free(slots)
    assert pool.available() == 6  # the failed call freed nothing
    pool.free(slots[1:])
    assert pool.available() == 8 and pool.alloc(9) is None and pool.available() == 8
    host = HostPool(LAYOUT, 4)
    assert host.kv.shape == (2, 2, 4, 1, 4) and host.kv.device.type == "cpu"


@pytest.mark.parametrize("size", [1, 3, 300], ids=["one", "few", "vectorised"])
def test_pool_double_and_foreign_free_raise_on_both_paths(size: int, device: str) -> None:
    """Small frees are checked per slot in Python, large ones vectorised: same verdicts."""
    pool = DevicePool(LAYOUT, 512, device)
    slots = pool.alloc(size)
    assert slots is not None
    with pytest.raises(PoolError, match="double free"):
        pool.free(torch.cat([slots, slots[:1]]))  # repeated within the call
    with pytest.raises(PoolError, match="out of range"):
        pool.free(torch.tensor([512] * size))
    with pytest.raises(PoolError, match="double free"):
        pool.free(torch.cat([slots[1:], torch.tensor([0])]))  # slot 0 was never handed out
    assert pool.available() == 512 - size  # the failed calls freed nothing
    pool.free(slots)
    with pytest.raises(PoolError, match="double free"):
        pool.free(slots)
    assert pool.available() == 512


@pytest.mark.parametrize("size", [1, 3, 300], ids=["one", "few", "vectorised"])
def test_pool_frees_numpy_arrays_with_the_verdicts_of_tensors(size: int) -> None:
    """``alloc_array`` hands out NumPy slots; freeing them (one run, scattered or vectorised)
    gives the same verdicts and frees nothing on a bad call."""
    pool = DevicePool(LAYOUT, 512, "cpu")
    slots = pool.alloc_array(size)
    assert slots is not None and slots.dtype == np.int64
    assert slots.tolist() == list(range(512 - size, 512))  # a fresh pool hands out one run
    for bad, verdict in (
        (np.concatenate([slots, slots[:1]]), "double free"),  # repeated within the call
        (np.arange(512 - size + 1, 512 + 1), "out of range"),  # a run past the end
        (np.arange(512 - size - 1, 512 - 1), "double free"),  # a run over a free slot
    ):
        with pytest.raises(PoolError, match=verdict):
            pool.free(bad)
        assert pool.available() == 512 - size
    pool.free(slots[::-1].copy())  # the same slots out of order
    assert pool.available() == 512
    with pytest.raises(PoolError, match="double free"):
        pool.free(slots)
    assert pool.alloc_array(513) is None and pool.available() == 512


@pytest.mark.parametrize("capacity", [1200, 8192], ids=["count the pool", "count the span"])
def test_a_large_free_finds_a_repeated_slot_whatever_it_counts(capacity: int) -> None:
    """Repeats within one large free are found by counting ownership bytes: over the whole pool,
    or over the freed slots' span when that is under half the pool."""
    pool = DevicePool(LAYOUT, capacity, "cpu")
    slots = pool.alloc(1000)
    assert slots is not None
    for parts in ([slots[:-1], slots[:1]], [slots[1:], slots[-1:]]):  # 1000 slots, one twice
        with pytest.raises(PoolError, match="double free"):
            pool.free_many(parts)
        assert pool.available() == capacity - 1000 and int(pool._owned.sum()) == 1000
    pool.free_many([slots[500:], slots[:500]])
    assert pool.available() == capacity and not bool(pool._owned.any())


def test_is_run_is_exactly_ascending_by_one_from_a_non_negative_start() -> None:
    assert (
        is_run(np.arange(5, 69))
        and is_run(np.array([0]))
        and is_run(np.arange(1 << 17, (1 << 17) + 3))
    )
    assert is_run(np.arange(3, 3 + (1 << 18))) and not is_run(np.arange(1 << 18)[::-1].copy())
    for not_a_run in (
        [],
        [1, 3],
        [3, 2, 1],
        [0, 1, 1],
        [-2, -1, 0],
        [2**40, 2**40 + 2],
        [2**40 + 1, 2**40],
    ):
        assert not is_run(np.array(not_a_run, dtype=np.int64)), not_a_run


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_pools_see_their_kv_through_numpy(dtype: torch.dtype) -> None:
    """A CPU pool's ``kv_array`` is the same memory (bfloat16 seen as bytes), so a NumPy slice
    copy between two pools of one layout is a byte-exact KV copy."""
    layout = KVLayout(layers=2, kv_heads=1, head_dim=4, dtype=dtype)
    host, device = HostPool(layout, 8), DevicePool(layout, 8, "cpu")
    assert host.kv_array is not None and device.kv_array is not None
    host.kv.copy_(torch.randn(layout.shape(8)).to(dtype))
    device.kv_array[:, :, 2:6] = host.kv_array[:, :, 0:4]
    assert torch.equal(device.kv[:, :, 2:6], host.kv[:, :, 0:4])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("targets", ["run", "scattered"])
def test_read_into_host_lands_pages_in_the_bounce_slots_asked(
    targets: str, dtype: torch.dtype
) -> None:
    """Pages read from L3 land in the bounce slots given (a NumPy array, as the pipeline keeps
    them), in order, and a miss ends the read: nothing after it is copied (one run of slots:
    the storage copies into the bounce; scattered slots: gathered, then copied)."""
    layout = KVLayout(layers=2, kv_heads=1, head_dim=4, dtype=dtype)
    host, storage, engine = HostPool(layout, 16), MemoryStorage(), CopyEngine(torch.device("cpu"))
    pages = [torch.full(layout.shape(4), float(n + 1), dtype=dtype) for n in range(3)]
    storage.batch_set(["a", "b", "c"], pages)
    slots = (
        np.arange(16)
        if targets == "run"
        else np.array([9, 3, 14, 0, 5, 6, 7, 8, 1, 2, 4, 15, 10, 11, 12, 13])
    )
    assert engine.read_into_host(storage, ["a", "b", "missing", "c"], host, slots, 4) == 8
    for n, slot in enumerate(slots.tolist()):
        expected = float(n // 4 + 1) if n < 8 else 0.0
        assert bool((host.kv[:, :, slot] == expected).all()), (n, slot)


@pytest.mark.parametrize("targets", ["run", "scattered"])
def test_read_into_host_ends_at_a_page_of_another_dtype_and_needs_a_slot_per_token(
    targets: str,
) -> None:
    """A page stored in another dtype is not this pool's KV: the read ends there, on both
    paths (no silent conversion). Too few bounce slots is a caller's error, raised before
    anything is read."""
    host, storage, engine = HostPool(LAYOUT, 16), MemoryStorage(), CopyEngine(torch.device("cpu"))
    storage.batch_set(["a", "wide", "b"], [page(1), page(2).to(torch.float32), page(3)])
    slots = np.arange(8) if targets == "run" else np.array([5, 1, 7, 3, 0, 2, 4, 6])
    assert engine.read_into_host(storage, ["a", "wide", "b"][:2], host, slots, 4) == 4
    assert bool((host.kv[:, :, slots[:4]] == 1.0).all())
    assert bool((host.kv[:, :, slots[4:]] == 0.0).all())
    with pytest.raises(ValueError, match="need 12 bounce slots, got 8"):
        engine.read_into_host(storage, ["a", "b", "a"], host, slots, 4)
    if targets == "run":
        with pytest.raises(ValueError, match="lie past host_pool's 16 slots"):
            engine.read_into_host(storage, ["a", "b"], host, np.arange(12, 20), 4)
    assert storage.reads == 2  # the refused reads asked the storage for nothing


@pytest.mark.parametrize("backend", ["memory", "file"])
def test_batch_get_into_copies_consecutive_pages_and_stops_at_the_first_bad_one(
    backend: str, tmp_path: Path
) -> None:
    """``batch_get_into`` fills the run of slots page after page; a missing page, a page of
    another dtype or of another page shape ends it, and nothing after it is copied."""
    storage = MemoryStorage() if backend == "memory" else FileStorage(tmp_path)
    wide = torch.full(LAYOUT.shape(8), 4.0, dtype=LAYOUT.dtype)
    storage.batch_set(
        ["a", "b", "single", "wide", "c"], [page(1), page(2), page(3).float(), wide, page(5)]
    )
    kv = torch.zeros(LAYOUT.shape(16), dtype=LAYOUT.dtype)
    for keys, copied in (
        (["a", "b", "missing", "c"], 2),
        (["a", "single", "c", "c"], 1),
        (["wide", "c", "c", "c"], 0),
        (["c", "a", "b", "c"], 4),
    ):
        kv.zero_()
        assert storage.batch_get_into(keys, kv.numpy(), LAYOUT.dtype) == copied, keys
        for n, key in enumerate(keys):
            value = {"a": 1.0, "b": 2.0, "c": 5.0}.get(key, 0.0) if n < copied else 0.0
            assert bool((kv[:, :, 4 * n : 4 * n + 4] == value).all()), (keys, n)
    assert storage.batch_get_into([], kv.numpy()[:, :, :0], LAYOUT.dtype) == 0


@pytest.mark.parametrize("scale", [1, 10], ids=["small (runs found in Python)", "large (torch)"])
@pytest.mark.parametrize("order", ["runs", "scattered", "mixed"])
def test_copy_slots_equals_advanced_indexing(order: str, scale: int) -> None:
    torch.manual_seed(0)
    slots = 96 * scale
    src = torch.randn(LAYOUT.shape(slots))
    dst = torch.zeros(LAYOUT.shape(slots))
    if order == "runs":
        half = 32 * scale
        src_idx, dst_idx = (
            torch.arange(10, 10 + 2 * half),
            torch.cat([torch.arange(0, half), torch.arange(50 * scale, 50 * scale + half)]),
        )
    elif order == "scattered":
        src_idx, dst_idx = torch.randperm(slots)[: 64 * scale], torch.randperm(slots)[: 64 * scale]
    else:
        head = 40 * scale
        src_idx, dst_idx = (
            torch.cat([torch.arange(head), torch.randperm(head) + 50 * scale]),
            torch.randperm(slots)[: 2 * head],
        )
    expected = dst.clone()
    expected[:, :, dst_idx] = src[:, :, src_idx]
    copy_slots(src, src_idx, dst, dst_idx)
    assert torch.equal(dst, expected)


@pytest.mark.parametrize("kind", ["tensor", "numpy"])
@pytest.mark.parametrize("order", ["runs", "scattered"])
def test_h2d_copies_exactly_the_slots_asked(order: str, kind: str, device: str) -> None:
    """The host → device path on each device (on CUDA: pinned bounce, side stream, event)."""
    torch.manual_seed(0)
    host, pool = HostPool(LAYOUT, 96), DevicePool(LAYOUT, 96, device)
    engine = CopyEngine(pool.device)
    host.kv.copy_(torch.randn(LAYOUT.shape(96)).to(LAYOUT.dtype))
    if order == "runs":
        src, dst = torch.arange(8, 72), torch.cat([torch.arange(0, 32), torch.arange(50, 82)])
    else:
        src, dst = torch.randperm(96)[:64], torch.randperm(96)[:64]
    expected = torch.zeros(LAYOUT.shape(96), dtype=LAYOUT.dtype)
    expected[:, :, dst] = host.kv[:, :, src]
    if kind == "numpy":  # as the pipeline passes bounce (and device) slots
        handle = engine.h2d(host, src.numpy(), pool, dst.numpy())
    else:
        handle = engine.h2d(host, src, pool, dst)
    handle.wait()
    assert handle.done()
    assert torch.equal(pool.kv.cpu(), expected)
    assert (engine.stream is not None) == (device == "cuda")


def test_memory_storage_counts_consecutive_hits_and_keeps_first_write() -> None:
    storage = MemoryStorage()
    storage.batch_set(["a", "b"], [page(1), page(2)])
    storage.batch_set(["a"], [page(9)])
    assert storage.batch_exists(["a", "b", "c"]) == 2 and storage.batch_exists(["c", "a"]) == 0
    got = storage.batch_get(["a", "c"])
    assert got[1] is None and got[0] is not None and float(got[0].flatten()[0]) == 1.0
    storage.delete(["a"])
    assert storage.batch_exists(["a"]) == 0
    with pytest.raises(ValueError, match="one per key"):
        storage.batch_set(["x"], [])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_memory_storage_keeps_its_own_copy_of_any_page(dtype: torch.dtype) -> None:
    """A page given as a strided view (bfloat16 too: NumPy sees its bytes) is stored as the
    store's own copy: a later write to the caller's tensor changes nothing stored, and
    ``batch_get`` and ``snapshot`` hand back its values and dtype."""
    storage = MemoryStorage()
    source = torch.randn(LAYOUT.shape(8)).to(dtype)
    strided = source[:, :, ::2]
    expected = strided.clone()
    storage.batch_set(["p"], [strided])
    source.zero_()
    got = storage.batch_get(["p"])[0]
    assert got is not None and got.dtype == dtype and torch.equal(got, expected)
    assert torch.equal(storage.snapshot()["p"], expected)


def test_file_storage_round_trip_and_restart(tmp_path: Path) -> None:
    FileStorage(tmp_path).batch_set(["k1", "k2"], [page(1), page(2)])
    again = FileStorage(tmp_path)
    assert again.batch_exists(["k1", "k2", "k3"]) == 2
    got = again.batch_get(["k2"])[0]
    assert got is not None and torch.equal(got, page(2))


@pytest.mark.parametrize("damage", ["flip", "truncate", "shape", "garbage"])
def test_file_storage_damaged_object_is_a_counted_miss(tmp_path: Path, damage: str) -> None:
    storage = FileStorage(tmp_path)
    storage.batch_set(["key"], [page(5)])
    path = tmp_path / "ke" / "key"
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[-1] ^= 0xFF
    elif damage == "truncate":
        blob = blob[: len(blob) - 3]
    elif damage == "shape":
        blob = bytearray(bytes(blob).replace(b"[2, 2, 4, 1, 4]", b"[2, 2, 4, 1, 2]"))
    else:
        blob = bytearray(b"not a page at all")
    path.write_bytes(bytes(blob))
    assert storage.batch_get(["key"]) == [None]
    assert storage.damaged == 1 and not path.exists()  # deleted: it heals on the next write
    assert storage.batch_exists(["key"]) == 0
    storage.batch_set(["key"], [page(5)])
    got = storage.batch_get(["key"])[0]
    assert got is not None and torch.equal(got, page(5))
    assert storage.rewritten == 1
    assert storage.damage_report() == "1 page damaged, removed, rewritten"


def test_file_storage_counts_an_empty_page_file_as_absent(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    storage.batch_set(["k1", "k2"], [page(1), page(2)])
    (tmp_path / "k2" / "k2").write_bytes(b"")  # a writer killed before its first byte
    assert storage.batch_exists(["k1", "k2"]) == 1


def test_file_storage_writes_pages_a_group_can_share(tmp_path: Path) -> None:
    shared = tmp_path / "l3"
    FileStorage(shared).batch_set(["key"], [page(1)])
    assert (shared / "ke" / "key").stat().st_mode & 0o777 == FileStorage.FILE_MODE
    assert (shared / "ke").stat().st_mode & 0o7777 == FileStorage.DIR_MODE
    private = open_storage(f"file:{tmp_path / 'own'}?mode=0600", LAYOUT, 4)
    private.batch_set(["key"], [page(1)])
    assert (tmp_path / "own" / "ke" / "key").stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="not octal"):
        open_storage(f"file:{tmp_path}?mode=rw", LAYOUT, 4)
    with pytest.raises(ValueError, match="does not let its owner read"):
        FileStorage(tmp_path, file_mode=0o200)


def test_a_page_it_may_not_read_is_a_miss_left_in_place_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = FileStorage(tmp_path)
    storage.batch_set(["key"], [page(1)])

    def refused(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refused)  # another user's 0600 page, as root cannot
    assert storage.batch_get(["key"]) == [None]
    monkeypatch.undo()
    assert storage.unreadable == 1 and storage.damaged == 0
    assert (tmp_path / "ke" / "key").exists()
    assert "1 page unreadable (permissions" in storage.damage_report()


def test_file_storage_concurrent_put_and_get(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    errors: list[BaseException] = []

    def writer(offset: int) -> None:
        try:
            for i in range(30):
                storage.batch_set([f"p{offset}-{i}"], [page(float(i))])
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            for i in range(30):
                for tensor in storage.batch_get([f"p0-{i}", f"p1-{i}"]):
                    assert tensor is None or float(tensor.flatten()[0]) == float(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (0, 1)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and storage.damaged == 0
    assert storage.batch_exists([f"p0-{i}" for i in range(30)]) == 30


def _op(op_id: int, kind: str, log: list[int]) -> IOOp:
    def run(limit: int | None) -> IOResult:
        log.append(op_id)
        return IOResult(tokens=10 if limit is None else limit)

    return IOOp(op_id, kind, run)  # type: ignore[arg-type]


def test_manual_io_completes_in_the_order_asked() -> None:
    io, log = ManualIO(), []
    for op_id in (1, 2, 3):
        io.submit(_op(op_id, "read", log))
    assert io.pending() == 3 and io.queued() == [1, 2, 3] and log == []
    io.complete(2)
    io.complete_short(3, 4)
    io.fail(1, "disk on fire")
    done = io.drain()
    assert [(c.op_id, c.tokens, c.error) for c in done] == [
        (2, 10, None),
        (3, 4, None),
        (1, 0, "disk on fire"),
    ]
    assert log == [2, 3] and io.pending() == 0 and io.drain() == []
    with pytest.raises(KeyError, match="no queued IO operation 7"):
        io.complete(7)


def test_threaded_io_posts_every_completion() -> None:
    io, log = ThreadedIO(workers=2), []
    for op_id in range(1, 9):
        io.submit(_op(op_id, "read" if op_id % 2 else "load", log))
    done: list[int] = []
    for _ in range(1000):
        done += [c.op_id for c in io.drain()]
        if len(done) == 8:
            break
        threading.Event().wait(0.005)
    io.close()
    assert sorted(done) == list(range(1, 9)) and io.pending() == 0


class _FailedCopy:
    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def error(self) -> str | None:
        return "the engine's worker reported the copy failed"


def test_a_copy_whose_handle_failed_completes_with_its_error() -> None:
    """An H2D copy ends with its handle's verdict: the completion carries the error, so the
    spec's ack takes its ``copy_failed`` branch; a copy that succeeded carries none."""
    for io in (ThreadedIO(workers=1), ManualIO()):
        io.submit(IOOp(1, "load", lambda _limit: IOResult(handle=_FailedCopy())))
        io.submit(IOOp(2, "load", lambda _limit: IOResult()))
        if isinstance(io, ManualIO):
            io.complete_all()
        done = {c.op_id: c.error for c in io.drain()}
        io.close()
        assert done == {1: "the engine's worker reported the copy failed", 2: None}


def test_threaded_io_wait_returns_with_the_first_completion_and_drain_hands_it_out() -> None:
    """``wait`` blocks until an operation completes (the GIL released meanwhile), and the
    completion it took is the next drain's; with nothing in flight it returns at once."""
    io, log, go = ThreadedIO(workers=1), [], threading.Event()
    assert io.wait(10.0) is False  # nothing in flight: no wait
    blocked = _op(1, "read", log)
    io.submit(IOOp(1, "read", lambda limit: (go.wait(5.0), blocked.run(limit))[1]))
    assert io.wait(0.01) is False and io.pending() == 1  # still running: timed out
    go.set()
    assert io.wait(5.0) is True and io.wait(0.0) is True  # taken, not yet drained
    assert [c.op_id for c in io.drain()] == [1] and io.pending() == 0 and io.drain() == []
    io.close()
    assert log == [1]


@pytest.mark.parametrize("size", [3, 300], ids=["few", "vectorised"])
def test_free_many_has_the_verdicts_of_free_and_frees_nothing_on_a_bad_part(size: int) -> None:
    """A bulk eviction frees many nodes' slots in one call: a slot twice across parts, out of
    range, or never handed out raises and leaves the pool as it was."""
    pool = DevicePool(LAYOUT, 1024, "cpu")
    slots = pool.alloc(2 * size)
    assert slots is not None
    first, second = slots[:size], slots[size:]
    for parts, verdict in (
        ([first, second[:1], second[:1]], "double free"),  # repeated across parts
        ([first, torch.tensor([1024])], "out of range"),
        ([first, torch.tensor([0])], "double free"),  # slot 0 was never handed out
    ):
        with pytest.raises(PoolError, match=verdict):
            pool.free_many(parts)
        assert pool.available() == 1024 - 2 * size  # nothing was freed
    pool.free_many([first, second])
    assert pool.available() == 1024
    again = pool.alloc(1024)
    assert again is not None and sorted(again.tolist()) == list(range(1024))
    # parts of any shape and integer dtype, as free takes them (the join's slow path)
    pool.free_many([again[:size].reshape(-1, 1), again[size:].to(torch.int32)])
    assert pool.available() == 1024


class _Gated(MemoryStorage):
    """A store whose writes wait until the test opens the gate (or raise, when told)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.fail = False

    def batch_set(self, keys: Any, tensors: Any) -> None:
        self.gate.wait(timeout=10)
        if self.fail:
            raise OSError("disk full")
        super().batch_set(keys, tensors)


def _page(value: float) -> torch.Tensor:
    return torch.full(LAYOUT.shape(2), value, dtype=LAYOUT.dtype)


def test_a_store_written_behind_reads_its_own_queued_writes() -> None:
    from stagefate.runtime.storage import WriteBehind

    inner = _Gated()
    store = WriteBehind(inner)
    store.batch_set(["a", "b"], [_page(1), _page(2)])
    assert store.pending() == 1 and inner.batch_exists(["a"]) == 0  # not written yet
    assert store.batch_exists(["a", "b", "c"]) == 2 and store.written_prefix(["a", "b", "c"]) == 2
    out = np.zeros(LAYOUT.shape(4), dtype=np.float16)
    assert store.batch_get_into(["a", "b"], out, LAYOUT.dtype) == 2
    assert out[:, :, :2].max() == 1 and out[:, :, 2:].min() == 2
    inner.gate.set()
    store.close()
    assert store.pending() == 0 and inner.batch_exists(["a", "b"]) == 2


def test_a_store_written_behind_forgets_what_it_turns_out_not_to_hold() -> None:
    """A page deleted behind its back (damaged, or another writer's) is forgotten once a query
    stops short of it, and a failed write forgets its keys: the next write-through stores them
    again."""
    from stagefate.runtime.storage import WriteBehind

    inner = _Gated()
    inner.gate.set()
    store = WriteBehind(inner)
    store.batch_set(["a", "b"], [_page(1), _page(2)])
    store.close()
    inner.delete(["b"])
    assert store.written_prefix(["a", "b"]) == 2  # it does not know yet
    assert store.batch_exists(["a", "b"]) == 1
    assert store.written_prefix(["a", "b"]) == 1
    failing = _Gated()
    failing.fail = True
    failing.gate.set()
    store = WriteBehind(failing)
    store.batch_set(["c"], [_page(3)])
    store.close()
    assert store.write_errors == 1 and store.written_prefix(["c"]) == 0


def test_write_through_gathers_only_the_pages_its_store_does_not_hold() -> None:
    from stagefate.runtime.storage import WriteBehind
    from stagefate.statemachine.config import PipelineConfig
    from stagefate.statemachine.pipeline import BufferPipeline

    gathered: list[int] = []

    class Counting(CopyEngine):
        def pages_of(self, pool: Any, indices: torch.Tensor, page_size: int) -> Any:  # type: ignore[override]
            gathered.append(indices.numel())
            return CopyEngine.pages_of(pool, indices, page_size)

    inner = MemoryStorage()
    store = WriteBehind(inner)
    pipe = BufferPipeline(PipelineConfig(page_size=2), storage=store)
    pipe.copy = Counting(pipe.copy.device)
    pipe.write_through(list(range(8)), torch.arange(8))
    pipe.write_through(list(range(12)), torch.arange(12))  # the first 8 tokens known
    store.close()
    assert gathered == [8, 4] and len(inner) == 6


def test_a_store_written_behind_tells_what_its_store_tells(tmp_path: Path) -> None:
    """The wrapper hides nothing the metrics and reports read (a file store's damage), and
    shuts the client of a store that holds one."""
    from stagefate.runtime.storage import HoldsConnections, ReportsDamage, WriteBehind

    files = WriteBehind(FileStorage(tmp_path))
    assert isinstance(files, ReportsDamage) and files.damage_report() == ""
    files.close()
    memory = WriteBehind(MemoryStorage())
    assert not isinstance(memory, ReportsDamage)
    memory.close()

    class Client(MemoryStorage):
        closed = False

        def close(self) -> None:
            self.closed = True

    client = Client()
    store = WriteBehind(client)
    assert isinstance(client, HoldsConnections)
    store.close()
    assert client.closed


def test_an_existence_query_is_answered_while_every_read_thread_is_busy() -> None:
    """Queries run on a thread of their own: a read of a slow L3 (one its request stopped
    waiting for still runs to its end) never holds up an answer L3 has at once."""
    io, go = ThreadedIO(workers=1), threading.Event()
    io.submit(IOOp(1, "read", lambda _limit: (go.wait(5.0), IOResult(tokens=4))[1]))
    io.submit(IOOp(2, "exists", lambda _limit: IOResult(tokens=8)))
    assert io.wait(5.0) is True
    assert [(c.op_id, c.tokens) for c in io.drain()] == [(2, 8)]  # the read still runs
    assert set(io.reads_running()) == {1}
    go.set()
    io.close()
    assert [(c.op_id, c.tokens) for c in io.drain()] == [(1, 4)] and io.pending() == 0
