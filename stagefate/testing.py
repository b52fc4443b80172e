"""Helpers for an engine developer's own integration tests, as ``trio.testing`` ships trio's.

Everything here drives stagefate through its public API and a :class:`~stagefate.ManualIO`, so
a test decides exactly when each storage read, existence query and H2D copy completes:

* :func:`manual_io` and :func:`step_io`: the pipeline's ManualIO, and one operation of it
  completed fully, short or failed (then a scheduling pass);
* :func:`settle`: every queued operation completes and the scheduler polls, a few rounds;
* :class:`Pair` / :func:`make_pair`: a producer and a consumer pipeline over one L3, with KV
  whose every slot carries a mark, so a test reads back which producer's bytes were spliced;
* :func:`assert_quiescent`: nothing live, no pin, no hold, every slot back, the books closed;
* :func:`run_ranks_over_gloo`: a function run as N tensor-parallel ranks, one process each,
  joined by torch.distributed over gloo on 127.0.0.1;
* :func:`tree_snapshot`: a tree's whole shape, slots, locks and LRU order, to compare two runs;
* the fuzz world (:data:`SEQUENCES` sharing heads, :data:`NAMESPACES`, :func:`mark` and
  :func:`write_marked` for KV that names its token and namespace) and
  :func:`~stagefate.fuzz.machine.configured`, to run stagefate's stateful fuzzer over your own
  tree or storage.

docs/integration.md has an example test that uses only these and the public API.
"""

from __future__ import annotations

import multiprocessing
import socket
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypeVar

import torch

from .fuzz.machine import PipelineFuzzer, configured
from .fuzz.world import NAMESPACES, SEQUENCES, mark, write_marked
from .runtime import ManualIO, MemoryStorage
from .runtime.prefix_tree import PrefixTree
from .statemachine.config import PipelineConfig
from .statemachine.pipeline import BufferPipeline
from .statemachine.record import TransitionEvent

__all__ = [
    "NAMESPACES",
    "SEQUENCES",
    "Pair",
    "PipelineFuzzer",
    "assert_quiescent",
    "configured",
    "kv_marks",
    "make_pair",
    "manual_io",
    "mark",
    "run_ranks_over_gloo",
    "settle",
    "step_io",
    "tree_snapshot",
    "write_marked",
]


def manual_io(pipe: BufferPipeline) -> ManualIO:
    """The pipeline's :class:`ManualIO` (build it with ``PipelineConfig(io="manual")``)."""
    if not isinstance(pipe.io, ManualIO):
        raise TypeError(
            f"the pipeline runs {type(pipe.io).__name__}; stepping it needs "
            f"PipelineConfig(io='manual')"
        )
    return pipe.io


def step_io(
    pipe: BufferPipeline,
    kind: Literal["exists", "read", "load"] | None = None,
    mode: Literal["full", "short", "fail"] = "full",
    tokens: int = 0,
    poll: bool = True,
) -> int:
    """Complete the oldest queued operation (of ``kind``, if given): fully, ``short`` with
    ``tokens`` tokens, or ``fail``; then run one scheduling pass unless ``poll`` is False.
    Returns its operation id."""
    io = manual_io(pipe)
    queued = io.queued(kind)
    if not queued:
        raise LookupError(f"no {kind or ''} operation is queued; issue or commit a prefetch first")
    op_id = queued[0]
    if mode == "fail":
        io.fail(op_id)
    elif mode == "short":
        io.complete_short(op_id, tokens)
    else:
        io.complete(op_id)
    if poll:
        pipe.poll()
    return op_id


def settle(pipe: BufferPipeline, rounds: int = 4) -> None:
    """Storage and copies complete, then the scheduler polls, ``rounds`` times."""
    io = manual_io(pipe)
    for _ in range(rounds):
        io.complete_all()
        pipe.poll()


@dataclass
class Pair:
    """A producer and a consumer pipeline over one L3 (:func:`make_pair`)."""

    producer: BufferPipeline
    consumer: BufferPipeline
    storage: MemoryStorage
    outcomes: list[tuple[str, str, str, str | None]] = field(default_factory=list)
    """``(request, source, target, reason)`` of every consumer transition, in order."""

    def publish(self, tokens: Sequence[int], mark: float, aux: bool = True) -> None:
        """The producer computes ``tokens`` with KV marked ``mark`` and writes them through."""
        pipe = self.producer
        slots = pipe.device_pool.alloc(len(tokens))
        assert slots is not None, "the producer's device pool is full"
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
        assert slots is not None, "the consumer's device pool is full"
        pipe.device_pool.kv[:, :, slots] = mark
        prefix = pipe.tree.match_prefix(tokens).device_indices
        pipe.tree.insert(tokens, torch.cat([prefix, slots]))
        return slots

    def settle(self, rounds: int = 4) -> None:
        settle(self.consumer, rounds)


def make_pair(config: PipelineConfig) -> Pair:
    """Two pipelines with ``config`` over one :class:`MemoryStorage`."""
    storage = MemoryStorage()
    pair = Pair(
        BufferPipeline(config, storage=storage), BufferPipeline(config, storage=storage), storage
    )

    def record(event: TransitionEvent) -> None:
        o = event.outcome
        pair.outcomes.append((event.request_id, o.source, o.target, o.reason))

    pair.consumer.instruments.append(record)
    return pair


def kv_marks(pipe: BufferPipeline, slots: torch.Tensor) -> list[float]:
    """The mark of each device slot (the first value of its KV)."""
    return [float(v) for v in pipe.device_pool.kv[0, 0, slots, 0, 0].cpu()]


def assert_quiescent(pipe: BufferPipeline) -> None:
    """Nothing live, nothing pinned, every host slot back, the device pool conserved, every
    read settled and the books closed (to the token)."""
    assert pipe.is_idle(), f"live records: {list(pipe.records)}"
    assert pipe.host_pool.available() == pipe.host_pool.capacity, "a bounce slot was not freed"
    if pipe.host_aux_pool is not None:
        assert pipe.host_aux_pool.available() == pipe.host_aux_pool.capacity
    assert pipe.pinned_tokens == 0 and pipe.tree.protected_size == 0, "a pin outlived its record"
    pipe.tree.sanity_check()
    assert pipe.device_pool.available() + pipe.tree.total_tokens() == pipe.device_pool.capacity
    if pipe.aux_pool is not None:
        assert pipe.aux_pool.available() + pipe.tree.aux_slots().numel() == pipe.aux_pool.capacity
    stats = pipe.stats
    ended = sum(getattr(stats, reason) for reason in pipe.spec.reasons)
    assert stats.issued + stats.declined_too_short == ended, "a record did not end exactly once"
    assert pipe.reads_in_flight() == (0, 0)
    assert stats.l3_reads == stats.filled + stats.l3_reads_wasted
    assert stats.l3_read_tokens == stats.spliced_tokens + stats.l3_read_tokens_wasted
    wasted = pipe.wasted_by_reason().values()
    assert sum(reads for reads, _ in wasted) == stats.l3_reads_wasted
    assert sum(tokens for _, tokens in wasted) == stats.l3_read_tokens_wasted


NodeSnapshot = tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...], int, int]
"""``(tokens, namespace (None as ""), device slots, lock_ref, last access)`` of one node."""


def tree_snapshot(tree: PrefixTree) -> list[NodeSnapshot]:
    """Every node's tokens, namespace, slots, lock count and LRU stamp (0 for a tree that keeps
    none), sorted: two runs that leave equal snapshots leave trees that match, lock and evict
    alike."""
    return sorted(
        (
            tuple(node.tokens()),
            tuple("" if part is None else str(part) for part in node.namespace),
            tuple(node.value.tolist()),
            int(node.lock_ref),
            int(getattr(node, "last_access", 0)),
        )
        for node in tree.nodes()
    )


T = TypeVar("T")


def run_ranks_over_gloo(
    body: Callable[[int, int], T], size: int, timeout: float = 120.0
) -> list[T]:
    """``body(rank, size)`` in ``size`` spawned processes joined by ``torch.distributed`` (gloo
    on 127.0.0.1, so a :class:`~stagefate.TorchGroup` can be built there); the results in rank
    order. ``body`` must be importable by name (it is pickled into the processes); a rank that
    raises, or a run past ``timeout`` seconds, raises here with the rank's traceback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    ranks = [
        context.Process(target=_gloo_rank, args=(body, rank, size, port, timeout, out))
        for rank in range(size)
    ]
    for process in ranks:
        process.start()
    try:
        reports = [out.get(timeout=timeout) for _ in ranks]
    finally:
        for process in ranks:
            process.join(10)
            if process.is_alive():
                process.kill()
    failed = [(rank, error) for rank, _result, error in reports if error is not None]
    if failed:
        rank, error = min(failed)
        raise RuntimeError(f"rank {rank} of {size} failed:\n{error}")
    return [result for _rank, result, _error in sorted(reports, key=lambda r: r[0])]


def _gloo_rank(
    body: Callable[[int, int], Any], rank: int, size: int, port: int, timeout: float, out: Any
) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=timeout),
    )
    try:
        out.put((rank, body(rank, size), None))
    except BaseException:
        out.put((rank, None, traceback.format_exc()))
    finally:
        dist.destroy_process_group()
