"""``stagefate bench lifecycle``: bookkeeping per prefetch (issue → ack) and the IO-commit cost.

ManualIO and a tiny KV layout, so the figure is the lifecycle's own bookkeeping (dispatch,
guards, tree, pools, hashing), not data movement.
"""

from __future__ import annotations

import itertools
import statistics
import time

from ..runtime import MemoryStorage
from ..statemachine.config import PipelineConfig
from ..statemachine.pipeline import BufferPipeline
from .report import Section, table

PHASES = (
    ("issue", "prefetch_from_storage: encode, hash, match, pin, queue the existence query"),
    ("exists", "the existence query runs (ManualIO)"),
    ("commit", "poll: the hit, then the IO commit (guards, bounce, launch the read)"),
    ("read", "the L3 read runs: pages into the bounce"),
    ("stage", "poll: the read is staged"),
    ("plan", "plan_staged_splice"),
    ("match", "the scheduler's match_prefix for the prefix indices"),
    ("consume", "init_load_back: re-validate, device slots, queue the H2D, insert"),
    ("h2d", "the H2D copy runs"),
    ("ack", "poll: the ack (unpin, free the bounce, settle)"),
)
"""The steps of one prefetch, timed one by one (their medians sum to about the whole)."""


def run(device: str = "cpu", prefetches: int = 400, span: int = 64, prefix: int = 256) -> Section:
    cfg = PipelineConfig(
        page_size=16,
        layers=1,
        kv_heads=1,
        head_dim=1,
        device_tokens=8192,
        host_tokens=4096,
        device=device,
        io="manual",
        max_context_len=1024,
    )
    storage = MemoryStorage()
    pipe = BufferPipeline(cfg, storage=storage)
    io = pipe.io
    per_prefetch, commit_guards, first_match = [], [], []
    phases: dict[str, list[float]] = {name: [] for name, _what in PHASES}
    clock = time.perf_counter
    for n in range(prefetches):
        base = [n * 100_000 + i for i in range(prefix + span)]
        slots = pipe.device_pool.alloc(len(base))
        assert slots is not None
        pipe.write_through(base, slots)  # L3 has the span
        pipe.tree.insert(base[:prefix], slots[:prefix])
        pipe.device_pool.free(slots[prefix:])
        request = f"r{n}"
        marks = [clock()]
        pipe.prefetch_from_storage(request, base, prefix)
        marks.append(clock())
        io.complete_all()  # type: ignore[attr-defined]
        marks.append(clock())
        pipe.poll()
        marks.append(clock())
        io.complete_all()  # type: ignore[attr-defined]
        marks.append(clock())
        pipe.poll()
        marks.append(clock())
        pipe.plan_staged_splice(request, prefix)
        marks.append(clock())
        prefix_indices = pipe.tree.match_prefix(base).device_indices
        marks.append(clock())
        pipe.init_load_back(request, prefix_indices)
        marks.append(clock())
        io.complete_all()  # type: ignore[attr-defined]
        marks.append(clock())
        pipe.poll()
        marks.append(clock())
        for (name, _what), (start, end) in zip(PHASES, itertools.pairwise(marks), strict=True):
            phases[name].append(end - start)
        per_prefetch.append(marks[-1] - marks[0])
        assert pipe.state(request) is None
        # the commit's re-validation (its guards, decided without effects) vs one first match
        pipe.prefetch_from_storage("probe", base + [7] * 16, prefix + span)
        record = pipe.records["probe"]
        start = clock()
        pipe.tree.match_prefix(base[:prefix])
        first_match.append(clock() - start)
        start = clock()
        pipe.machine.decide(record, "commit")
        commit_guards.append(clock() - start)
        pipe.release_aborted_request("probe")
        pipe.poll()
        pipe.tree.evict(pipe.device_pool.capacity)  # everything unlocked
    median_us = statistics.median(per_prefetch) * 1e6
    ratio = statistics.median(commit_guards) / statistics.median(first_match)
    body = table(
        ["measure", "median"],
        [
            ["issue → ack, one prefetch (µs)", f"{median_us:.1f}"],
            *[
                [f"… {name}: {what} (µs)", f"{statistics.median(phases[name]) * 1e6:.1f}"]
                for name, what in PHASES
            ],
            ["IO-commit re-validation (µs)", f"{statistics.median(commit_guards) * 1e6:.1f}"],
            ["first match of the same prefix (µs)", f"{statistics.median(first_match) * 1e6:.1f}"],
            ["re-validation / first match", f"{ratio:.2f}×"],
        ],
    )
    body += (
        f"\n\n{prefetches} prefetches of a {span}-token span after a {prefix}-token prefix, "
        f"page_size 16, ManualIO, KV of 1 layer × 1 head × 1 dim. The re-validation is the "
        f"commit row's guards (anchor re-match, device coverage, host capacity). Target: ≤ 50 µs "
        f"of bookkeeping per prefetch (**{'met' if median_us <= 50 else 'NOT met'}**)."
    )
    if pipe.device_pool.device.type == "cuda":
        body += " On CUDA each ack waits for its H2D event (ManualIO completes a load by waiting)."
        return Section("lifecycle-cuda", "Lifecycle bookkeeping per prefetch on the GPU", body)
    return Section("lifecycle", "Lifecycle bookkeeping per prefetch", body)
