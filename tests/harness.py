"""A producer/consumer pair over one L3, and the whole-state assertions scenario tests use."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, Phase, settings

from stagefate import BufferPipeline, MemoryStorage, PipelineConfig, TransitionEvent


def _devices() -> list[str]:
    """``cpu`` always, ``cuda`` when torch sees a GPU; ``STAGEFATE_TEST_DEVICES=cuda`` (as
    scripts/gpu-check sets it) keeps only the listed ones."""
    found = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    wanted = os.environ.get("STAGEFATE_TEST_DEVICES")
    if wanted is None:
        return found
    chosen = [name for name in wanted.split(",") if name in found]
    if not chosen:
        raise RuntimeError(f"STAGEFATE_TEST_DEVICES={wanted!r}, but this machine has {found}")
    return chosen


DEVICES = _devices()
_current_device = ["cpu"]


@contextlib.contextmanager
def on_device(name: str) -> Iterator[None]:
    """Pipelines that :func:`config` builds inside the block put their device pools on ``name``."""
    previous = _current_device[0]
    _current_device[0] = name
    try:
        yield
    finally:
        _current_device[0] = previous


def current_device() -> str:
    return _current_device[0]


def config(page_size: int = 1, window: int | None = None, **overrides: object) -> PipelineConfig:
    base: dict[str, object] = dict(
        page_size=page_size,
        layers=2,
        kv_heads=1,
        head_dim=4,
        dtype=torch.float16,
        device_tokens=64 * page_size,
        host_tokens=64 * page_size,
        sliding_window=window,
        device=current_device(),
        io="manual",
        prefetch_threshold=1,
        anchor_lock_cap_fraction=0.5,
        max_context_len=32 * page_size,
        retry_interval=8,
        retry_max_attempts=8,
        check_oracle=True,
    )
    base.update(overrides)
    return PipelineConfig(**base)  # type: ignore[arg-type]


def seq_of(pages: int, page_size: int, start: int = 1) -> list[int]:
    return list(range(start, start + pages * page_size))


@dataclass
class Pair:
    producer: BufferPipeline
    consumer: BufferPipeline
    storage: MemoryStorage
    outcomes: list[tuple[str, str, str, str | None]]

    def publish(self, tokens: Sequence[int], mark: float, aux: bool = True) -> None:
        """The producer computes ``tokens`` with KV marked ``mark`` and writes them through."""
        pipe = self.producer
        slots = pipe.device_pool.alloc(len(tokens))
        assert slots is not None
        pipe.device_pool.kv[:, :, slots] = mark
        present = pipe.tree.insert(tokens, slots)
        pipe.device_pool.free(slots[:present])
        aux_slots = None
        window = pipe.config.sliding_window
        if aux and window is not None and pipe.aux_pool is not None:
            aux_slots = pipe.aux_pool.alloc(min(window, len(tokens)))
            assert aux_slots is not None
            pipe.aux_pool.kv[:, :, aux_slots] = mark + 0.5
        full = pipe.tree.match_prefix(tokens).device_indices
        pipe.write_through(tokens, full, aux_indices=aux_slots)
        if aux_slots is not None and pipe.aux_pool is not None:
            pipe.aux_pool.free(aux_slots)

    def sibling_insert(self, tokens: Sequence[int], mark: float) -> torch.Tensor:
        """Another request on the consumer publishes ``tokens`` into the consumer's tree."""
        pipe = self.consumer
        present = pipe.tree.match_prefix(tokens).length
        slots = pipe.device_pool.alloc(len(tokens) - present)
        assert slots is not None
        pipe.device_pool.kv[:, :, slots] = mark
        prefix = pipe.tree.match_prefix(tokens).device_indices
        pipe.tree.insert(tokens, torch.cat([prefix, slots]))
        return slots

    def settle(self, rounds: int = 4) -> None:
        settle(self.consumer, rounds)


def settle(pipe: BufferPipeline, rounds: int = 4) -> None:
    """Storage and copies complete, then the scheduler polls, ``rounds`` times."""
    for _ in range(rounds):
        pipe.io.complete_all()  # type: ignore[attr-defined]
        pipe.poll()


def fuzz_settings(examples: int, steps: int) -> settings:
    """A short, derandomized fuzz run that stops at the first failure (no shrinking)."""
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def make_pair(cfg: PipelineConfig) -> Pair:
    storage = MemoryStorage()
    pair = Pair(
        BufferPipeline(cfg, storage=storage), BufferPipeline(cfg, storage=storage), storage, []
    )

    def record(event: TransitionEvent) -> None:
        o = event.outcome
        pair.outcomes.append((event.request_id, o.source, o.target, o.reason))

    pair.consumer.instruments.append(record)
    return pair


def assert_quiescent(pipe: BufferPipeline) -> None:
    """Nothing live, nothing pinned, every host slot back, the device pool conserved."""
    assert pipe.is_idle(), f"live records: {list(pipe.records)}"
    assert pipe.host_pool.available() == pipe.host_pool.capacity
    if pipe.host_aux_pool is not None:
        assert pipe.host_aux_pool.available() == pipe.host_aux_pool.capacity
    assert pipe.pinned_tokens == 0 and pipe.tree.protected_size == 0
    pipe.tree.sanity_check()
    assert pipe.device_pool.available() + pipe.tree.total_tokens() == pipe.device_pool.capacity
    if pipe.aux_pool is not None:
        assert pipe.aux_pool.available() + pipe.tree.aux_slots().numel() == pipe.aux_pool.capacity
    stats = pipe.stats
    ended = sum(getattr(stats, reason) for reason in pipe.spec.reasons)
    assert stats.issued + stats.declined_too_short == ended
    # every read settled: spliced from (and filled) or wasted, to the token
    assert pipe.reads_in_flight() == (0, 0)
    assert stats.l3_reads == stats.filled + stats.l3_reads_wasted
    assert stats.l3_read_tokens == stats.spliced_tokens + stats.l3_read_tokens_wasted
    wasted = pipe.wasted_by_reason().values()
    assert sum(reads for reads, _ in wasted) == stats.l3_reads_wasted
    assert sum(tokens for _, tokens in wasted) == stats.l3_read_tokens_wasted


def kv_marks(pipe: BufferPipeline, slots: torch.Tensor) -> list[float]:
    return [float(v) for v in pipe.device_pool.kv[0, 0, slots, 0, 0].cpu()]


def staged_with_threaded_io(tokens: int) -> tuple[BufferPipeline, list[int]]:
    """A consumer with threaded IO whose request ``r`` staged ``tokens`` tokens (marked 9) that
    a producer wrote through; the IO threads do the work, this thread only polls."""
    storage = MemoryStorage()
    cfg = config(io="threaded")
    producer, consumer = BufferPipeline(cfg, storage=storage), BufferPipeline(cfg, storage=storage)
    seq = seq_of(tokens, 1)
    slots = producer.device_pool.alloc(len(seq))
    assert slots is not None
    producer.device_pool.kv[:, :, slots] = 9
    producer.write_through(seq, slots)
    consumer.prefetch_from_storage("r", seq, 0)
    deadline = time.monotonic() + 10
    while consumer.state("r") != "staged" and time.monotonic() < deadline:
        consumer.poll()
        time.sleep(0.001)
    assert consumer.state("r") == "staged"
    return consumer, seq
