"""``stagefate bench tp``: what the tensor-parallel agreement costs a scheduling pass.

Three set-ups, each timing the same work on every rank: idle passes (nothing in flight: the
agreement alone), and whole prefetches (issue, the hit, the read, plan and splice, the ack:
three passes each, ``ManualIO`` completing everything between passes). One rank without a group
is today's path; two ranks in one process agree through ``LocalGroup`` (a thread per rank);
two processes agree through ``TorchGroup`` over gloo on 127.0.0.1.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..runtime import MemoryStorage
from ..statemachine.config import PipelineConfig
from ..statemachine.group import Group, LocalGroup, TorchGroup
from ..statemachine.pipeline import BufferPipeline
from ..testing import manual_io, run_ranks_over_gloo
from .report import Section, table

IDLE_PASSES = 2000
PREFETCHES = 200
PAGES = 8


def _config(rank: int, size: int) -> PipelineConfig:
    return PipelineConfig(
        page_size=16,
        layers=1,
        kv_heads=2,
        head_dim=8,
        device_tokens=16 * 1024,
        host_tokens=4 * 1024,
        device="cpu",
        io="manual",
        tp_size=size,
        tp_rank=rank,
    )


def _workload(pipe: BufferPipeline) -> tuple[float, float]:
    """(µs per idle pass, µs per whole prefetch) on this rank."""
    io = manual_io(pipe)
    started = time.perf_counter()
    for _ in range(IDLE_PASSES):
        pipe.poll()
    idle = (time.perf_counter() - started) / IDLE_PASSES * 1e6
    page = pipe.config.page_size
    slots = pipe.device_pool.alloc(PAGES * page)
    assert slots is not None
    prompts = [
        list(range(1 + n * PAGES * page, 1 + (n + 1) * PAGES * page)) for n in range(PREFETCHES)
    ]
    started = time.perf_counter()
    for n, tokens in enumerate(prompts):
        pipe.write_through(tokens, slots)
        pipe.prefetch_from_storage(f"r{n}", tokens, 0)
        for _ in range(2):  # the hit (and the commit), then the read
            io.complete_all()
            pipe.poll()
        pipe.plan_staged_splice(f"r{n}", 0)
        pipe.init_load_back(f"r{n}", torch.empty(0, dtype=torch.int64))
        io.complete_all()
        pipe.poll()  # the ack
        pipe.tree.evict(PAGES * page)
    prefetch = (time.perf_counter() - started) / PREFETCHES * 1e6
    assert pipe.stats.filled == PREFETCHES, "a benchmarked prefetch did not splice"
    pipe.device_pool.free(slots)
    return idle, prefetch


def _local(size: int) -> tuple[float, float]:
    groups = LocalGroup.create(size)
    storage = MemoryStorage()

    def rank(group: Group) -> Callable[[], tuple[float, float]]:
        def body() -> tuple[float, float]:
            config = _config(group.rank, size)
            return _workload(BufferPipeline(config, storage=storage, group=group))

        return body

    return _slowest(groups[0].run(*(rank(g) for g in groups)))


def _gloo_rank(rank: int, size: int) -> tuple[float, float]:
    pipe = BufferPipeline(_config(rank, size), storage=MemoryStorage(), group=TorchGroup())
    return _workload(pipe)


def _gloo(size: int) -> tuple[float, float]:
    return _slowest(run_ranks_over_gloo(_gloo_rank, size, timeout=300))


def _slowest(by_rank: list[tuple[float, float]]) -> tuple[float, float]:
    """The slowest rank's figures: a pass ends when the last rank's does."""
    return max(r[0] for r in by_rank), max(r[1] for r in by_rank)


def run() -> Section:
    one = _workload(BufferPipeline(_config(0, 1), storage=MemoryStorage()))
    local = _local(2)
    gloo = _gloo(2)
    rows = [
        ["1 (no group: the single-rank path)", "none", f"{one[0]:.1f}", f"{one[1]:.0f}"],
        [
            "2, one process",
            "`LocalGroup` (a thread per rank)",
            f"{local[0]:.1f}",
            f"{local[1]:.0f}",
        ],
        ["2, two processes", "`TorchGroup`, gloo on 127.0.0.1", f"{gloo[0]:.1f}", f"{gloo[1]:.0f}"],
    ]
    body = table(["ranks", "agreement", "µs per idle pass", "µs per prefetch"], rows)
    body += (
        f"\n\nIdle: {IDLE_PASSES} passes with nothing in flight (the agreement alone: two "
        f"all-reduces a pass under TP). Prefetch: {PREFETCHES} whole prefetches of {PAGES} pages "
        "of 16 tokens (write-through, issue, the hit, the read, plan and splice, the ack: three "
        "passes each), KV of 1 layer × 1 head (the rank's shard) × 8 dims; the slowest rank's "
        "figure. docs/tensor-parallel.md says what each pass agrees."
    )
    return Section("tp", "Tensor-parallel agreement per pass", body)
