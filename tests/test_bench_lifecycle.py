"""``stagefate bench lifecycle``'s opcode counts: a figure that does not move with the load."""

from __future__ import annotations

import sys

import torch

from stagefate.bench.lifecycle import (
    PHASES,
    PREFIX,
    SPAN,
    StagefatePrefetcher,
    _tokens,
    opcodes_per_phase,
    opcodes_runtime_only,
)


def test_opcode_counts_are_deterministic_and_cover_every_step() -> None:
    tracer = sys.gettrace()
    first = opcodes_per_phase(StagefatePrefetcher(), prefetches=3)
    assert sys.gettrace() is tracer  # whatever traced before traces again
    second = opcodes_per_phase(StagefatePrefetcher(), prefetches=3)
    assert first == second
    assert list(first) == [name for name, _what in PHASES]
    assert all(count > 0 for count in first.values())
    # consume re-matches (as the scheduler's match does) and then splices: it must count more
    assert first["consume"] > first["match"] and first["issue"] > first["exists"]


def test_runtime_only_does_the_prefetchs_runtime_work_without_the_lifecycle() -> None:
    """The bench's runtime-only prefetch lands the same KV in the same tree shape as a real
    prefetch, frees its bounce and leaves no lock: it is the same work, less the lifecycle."""
    tokens = _tokens(7)
    real, bare = StagefatePrefetcher(), StagefatePrefetcher()
    for prefetcher in (real, bare):
        prefetcher.prepare(tokens)
        prefetcher.pipe.device_pool.kv.copy_(torch.randn_like(prefetcher.pipe.device_pool.kv))
    real.prefetch("r", tokens, [])
    marks: list[float] = []
    bare.runtime_only(tokens, marks)
    assert len(marks) == 2 and marks[0] <= marks[1]
    spliced = []
    for prefetcher in (real, bare):
        pipe = prefetcher.pipe
        match = pipe.tree.match_prefix(tokens)
        assert match.length == PREFIX + SPAN
        assert pipe.host_pool.available() == pipe.host_pool.capacity  # the bounce came back
        assert pipe.tree.protected_size == 0  # no lock left behind
        pipe.tree.sanity_check()
        spliced.append(pipe.device_pool.kv[:, :, match.device_indices[PREFIX:]])
    assert torch.equal(spliced[0], spliced[1])  # both read L3's pages, not the random KV
    assert real.pipe.stats.filled == 1 and bare.pipe.stats.filled == 0
    assert opcodes_runtime_only(bare, prefetches=2) < sum(opcodes_per_phase(real, 2).values())
