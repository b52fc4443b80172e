"""L3 on a real Mooncake Store, started on loopback: semantics, failures, two processes, replay.

Needs the ``mooncake`` extra and the system library libibverbs1; ``.ci/run`` installs both.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch
from hypothesis.stateful import run_state_machine_as_test

try:
    import mooncake.store  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the platform
    pytest.skip(
        f"mooncake.store does not import ({error}); install it with "
        "`apt-get install libibverbs1 && pip install '.[mooncake]'`",
        allow_module_level=True,
    )

from stagefate import BufferPipeline
from stagefate.cli import main
from stagefate.fuzz.fuzzer import configured
from stagefate.runtime import KVLayout
from stagefate.runtime.mooncake import (
    LocalMaster,
    MooncakeConfig,
    MooncakeStorage,
    MooncakeUnavailable,
    free_port,
)

from .harness import assert_quiescent, config, fuzz_settings, settle

LAYOUT = KVLayout(layers=2, kv_heads=1, head_dim=4)
PAGE = 4


@pytest.fixture(scope="module")
def master() -> Iterator[LocalMaster]:
    with LocalMaster() as running:
        yield running


def storage_on(cfg: MooncakeConfig, segment_mib: int = 32) -> MooncakeStorage:
    return MooncakeStorage(small(cfg, segment_mib), LAYOUT, PAGE, staging_pages=8)


def small(cfg: MooncakeConfig, segment_mib: int) -> MooncakeConfig:
    """The same master, a small segment and buffer (every client mounts one)."""
    return dataclasses.replace(
        cfg, global_segment_size=segment_mib * 2**20, local_buffer_size=16 * 2**20
    )


def url(cfg: MooncakeConfig) -> str:
    return f"mooncake://{cfg.master}?metrics_port={cfg.metrics_port}"


def page(value: float) -> torch.Tensor:
    return torch.full(LAYOUT.shape(PAGE), value, dtype=LAYOUT.dtype)


def test_round_trip_keeps_the_first_write_and_counts_consecutive_hits(master: LocalMaster) -> None:
    store = storage_on(master.config)
    try:
        keys = [f"rt-{i}" for i in range(12)]  # more than one staging batch
        store.batch_set(keys, [page(i) for i in range(12)])
        store.batch_set(keys[:1], [page(99)])  # an existing key keeps its value
        got = store.batch_get([*keys, "rt-missing"])
        assert [float(t[0, 0, 0, 0, 0]) for t in got[:12] if t is not None] == list(range(12))
        assert got[12] is None and store.misses == 1
        into = torch.zeros(LAYOUT.shape(3 * PAGE), dtype=LAYOUT.dtype)  # a run of bounce slots
        read = [keys[4], keys[5], "rt-missing"]
        assert store.batch_get_into(read, into.numpy(), LAYOUT.dtype) == 2
        assert torch.equal(into[:, :, : 2 * PAGE], torch.cat([page(4), page(5)], dim=2))
        assert not into[:, :, 2 * PAGE :].any()
        assert store.batch_exists(keys) == 12
        assert store.batch_exists(["rt-missing", *keys]) == 0
    finally:
        store.close()


def test_delete_under_a_read_lease_is_forced(master: LocalMaster) -> None:
    store = storage_on(master.config)
    try:
        store.batch_set(["lease-a"], [page(1)])
        assert store.batch_get(["lease-a"])[0] is not None  # takes a lease for 200 ms
        store.delete(["lease-a", "lease-never-written"])
        assert store.batch_exists(["lease-a"]) == 0
    finally:
        store.close()


@pytest.mark.slow
def test_a_full_store_skips_and_counts_the_writes() -> None:
    big = KVLayout(layers=16, kv_heads=8, head_dim=64)  # 1 MiB pages of 32 tokens
    with LocalMaster() as own:
        store = MooncakeStorage(small(own.config, 16), big, 32, staging_pages=4)
        try:
            pages = [torch.zeros(big.shape(32), dtype=big.dtype) for _ in range(24)]
            store.batch_set([f"full-{i}" for i in range(24)], pages)
            assert store.full_skips > 0 and store.errors == 0
            present = sum(store.batch_exists([f"full-{i}"]) for i in range(24))
            assert 0 < present < 24  # (the master may also evict older pages to make room)
        finally:
            store.close()


@pytest.mark.slow
def test_a_master_restart_turns_reads_into_misses() -> None:
    with LocalMaster() as own:
        store = storage_on(own.config)
        try:
            store.batch_set(["restart-a"], [page(3)])
            own.restart()
            assert store.batch_exists(["restart-a"]) == 0
            assert store.batch_get(["restart-a"]) == [None]
            # Writes work again once the client has re-mounted its segment (a heartbeat later);
            # until then the store accepts puts that it does not keep.
            deadline = time.monotonic() + 20
            while store.batch_exists(["restart-b"]) == 0 and time.monotonic() < deadline:
                store.batch_set(["restart-b"], [page(4)])
                time.sleep(0.5)
            assert store.batch_exists(["restart-b"]) == 1
        finally:
            store.close()


def test_a_master_that_is_not_up_fails_fast_naming_it() -> None:
    absent = MooncakeConfig(master=f"127.0.0.1:{free_port()}", metrics_port=free_port())
    started = time.monotonic()
    with pytest.raises(MooncakeUnavailable, match=absent.master):
        MooncakeStorage(absent, LAYOUT, PAGE)
    assert time.monotonic() - started < 10


PRODUCER = """
import sys, torch
from stagefate import BufferPipeline, PipelineConfig
cfg = PipelineConfig(page_size=4, layers=2, kv_heads=1, head_dim=4, device_tokens=64,
                     host_tokens=64, device="cpu", io="manual", storage=sys.argv[1])
pipe = BufferPipeline(cfg)
tokens = list(range(1, 21))
slots = pipe.device_pool.alloc(len(tokens))
marks = torch.arange(1, 21, dtype=torch.float16)
pipe.device_pool.kv[:, :, slots] = marks[None, None, :, None, None]
pipe.tree.insert(tokens, slots)
print(pipe.write_through(tokens, slots), flush=True)
sys.stdin.read()  # the written pages live in this process's segment: stay until told
pipe.storage.close()
"""


def _producer(master: LocalMaster) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, url(master.config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "5"  # pages written
    return process


def _consumer(master: LocalMaster) -> BufferPipeline:
    cfg = config(PAGE, device_tokens=64, host_tokens=64, storage=url(master.config))
    return BufferPipeline(cfg)


@pytest.mark.slow
def test_two_processes_share_pages_through_the_store(master: LocalMaster) -> None:
    producer = _producer(master)
    consumer = _consumer(master)
    try:
        tokens = list(range(1, 21))
        consumer.prefetch_from_storage("r", tokens, 0)
        settle(consumer)
        assert consumer.state("r") == "staged"
        kv_tokens, _ = consumer.plan_staged_splice("r", 0)
        tail = consumer.init_load_back("r", torch.empty(0, dtype=torch.int64))
        settle(consumer)
        assert kv_tokens == 20 and tail.numel() == 20
        values = consumer.device_pool.kv[:, :, tail]
        expected = torch.arange(1, 21, dtype=torch.float16)[None, None, :, None, None]
        assert torch.equal(values, expected.expand_as(values))  # bytes equal, every layer
        assert_quiescent(consumer)
    finally:
        producer.communicate("")
        consumer.storage.close()  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_dead_data_holder_ends_the_read_with_nothing_leaked(master: LocalMaster) -> None:
    producer = _producer(master)
    consumer = _consumer(master)
    try:
        tokens = list(range(1, 21))
        consumer.prefetch_from_storage("r", tokens, 0)
        consumer.io.complete_all()  # type: ignore[attr-defined]
        consumer.poll()  # the existence answer: the pages are there, the read is committed
        assert consumer.state("r") == "reading"
        producer.communicate("")  # the holder of the pages goes away
        settle(consumer)
        assert consumer.state("r") is None and consumer.stats.discarded == 1
        assert consumer.storage.misses > 0  # type: ignore[attr-defined]
        assert_quiescent(consumer)
    finally:
        consumer.storage.close()  # type: ignore[attr-defined]


def test_replay_runs_against_the_store(master: LocalMaster) -> None:
    argv = ["replay", "--limit", "15", "--policy", "live", "--storage", url(master.config)]
    assert main(argv) == 0


@pytest.mark.slow
def test_the_fuzzer_runs_against_the_store(master: LocalMaster) -> None:
    on_the_store = configured(
        storage_factory=lambda cfg: MooncakeStorage(
            small(master.config, 16),
            KVLayout(cfg.layers, cfg.kv_heads, cfg.head_dim, cfg.dtype),
            cfg.page_size,
            staging_pages=8,
        )
    )
    run_state_machine_as_test(
        on_the_store,
        settings=fuzz_settings(examples=8, steps=40),
    )
