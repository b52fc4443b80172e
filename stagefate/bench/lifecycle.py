"""``stagefate bench lifecycle``: bookkeeping per prefetch (issue → ack) and the IO-commit cost.

ManualIO and a tiny KV layout, so the figure is the lifecycle's own bookkeeping (dispatch,
guards, tree, pools, hashing), not data movement. Beside the times, each step's count of
interpreted Python opcodes (:func:`opcodes_per_phase`): it does not move with the machine's load,
so two versions of the code compare on it even where their times are within the noise.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from ..runtime import FileStorage, MemoryStorage, TokenKey
from ..runtime.hashing import chain_digests, storage_key
from ..runtime.storage import Storage
from ..runtime.tokens import TOKEN_BYTES
from ..statemachine.config import PipelineConfig
from ..statemachine.pipeline import BufferPipeline
from .report import Section, table

PHASES = (
    ("issue", "encode the request's tokens; prefetch_from_storage: hash, match, pin, query"),
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

SCHEDULER_PHASES = ("issue", "commit", "stage", "plan", "consume", "ack")
"""The pipeline's calls a scheduler makes on its own thread; ``exists``, ``read`` and ``h2d``
run on IO workers and the copy stream in a server, ``match`` is the scheduler's own call."""


SPAN = 64
PREFIX = 256
PAGE = 16


class StagefatePrefetcher:
    """One prefetch after another through stagefate's pipeline (ManualIO, tiny KV)."""

    name = "stagefate"

    def __init__(self, device: str = "cpu", storage: Storage | None = None) -> None:
        cfg = PipelineConfig(
            page_size=PAGE,
            layers=1,
            kv_heads=1,
            head_dim=1,
            device_tokens=8192,
            host_tokens=4096,
            device=device,
            io="manual",
            max_context_len=1024,
        )
        self.pipe = BufferPipeline(cfg, storage=storage or MemoryStorage())

    def prepare(self, tokens: list[int]) -> None:
        """Untimed: L3 holds ``tokens``; the device holds their first ``PREFIX``.

        As in an engine, the prefix is in the tree before its write-through, which leaves the
        pages' keys on the tree's nodes (``remember_page_keys``).
        """
        pipe = self.pipe
        slots = pipe.device_pool.alloc(len(tokens))
        assert slots is not None
        pipe.tree.insert(tokens[:PREFIX], slots[:PREFIX])
        pipe.write_through(tokens, slots)
        pipe.device_pool.free(slots[PREFIX:])

    def prefetch(self, request: str, tokens: list[int], marks: list[float]) -> None:
        """Issue → ack in the scheduler's order, a clock reading after each step (PHASES)."""
        pipe, io, clock = self.pipe, self.pipe.io, time.perf_counter
        marks.append(clock())
        key = TokenKey.of(tokens)  # encoded once per request: an engine keeps its request's key
        pipe.prefetch_from_storage(request, key, PREFIX)
        marks.append(clock())
        io.complete_all()  # type: ignore[attr-defined]
        marks.append(clock())
        pipe.poll()
        marks.append(clock())
        io.complete_all()  # type: ignore[attr-defined]
        marks.append(clock())
        pipe.poll()
        marks.append(clock())
        pipe.plan_staged_splice(request, PREFIX)
        marks.append(clock())
        prefix_indices = pipe.tree.match_prefix(key).device_indices
        marks.append(clock())
        pipe.init_load_back(request, prefix_indices)
        marks.append(clock())
        io.complete_all()  # type: ignore[attr-defined]
        marks.append(clock())
        pipe.poll()
        marks.append(clock())
        assert pipe.state(request) is None

    def runtime_only(self, tokens: list[int], marks: list[float]) -> None:
        """The same prefetch's runtime calls (tree, pools, L3, copies), in the scheduler's order
        and straight-line: no record, states, guards, re-validation, in-flight dedup, counters
        or IO executor. Issue → ack less this is what the lifecycle itself costs."""
        pipe, tree, clock = self.pipe, self.pipe.tree, time.perf_counter
        storage, host, device = pipe.storage, pipe.host_pool, pipe.device_pool
        marks.append(clock())
        key = TokenKey.of(tokens)
        anchor = tree.match_prefix(key.prefix(PREFIX)).last_node
        tree.inc_lock_ref(anchor)
        seed = tree.cached_page_key(anchor)
        assert seed is not None  # prepare's write-through left it
        span = key.data[PREFIX * TOKEN_BYTES :]
        keys = list(map(storage_key, chain_digests(span, PAGE * TOKEN_BYTES, seed)))
        bounce = host.alloc_array(storage.batch_exists(keys) * PAGE)
        assert bounce is not None
        read = pipe.copy.read_into_host(storage, keys, host, bounce, PAGE)
        slots = device.alloc_array(read)
        assert slots is not None
        pipe.copy.h2d(host, bounce, device, slots).wait()
        match = tree.match_prefix(key)  # the scheduler's
        leaf = tree.insert_leaf(match.last_node, key, match.length, torch.from_numpy(slots))
        tree.move_lock_ref(anchor, leaf)
        tree.dec_lock_ref(leaf)
        host.free(bounce)
        marks.append(clock())

    def clean(self) -> None:
        self.pipe.tree.evict(self.pipe.device_pool.capacity)  # everything unlocked


def _tokens(n: int) -> list[int]:
    return [n * 100_000 + i for i in range(PREFIX + SPAN)]


def opcodes_per_phase(prefetcher: StagefatePrefetcher, prefetches: int = 50) -> dict[str, float]:
    """Python opcodes interpreted in each step of a prefetch, on average (``sys.settrace`` with
    per-opcode events): deterministic for given code, blind to time spent inside C calls."""
    counts = _opcodes_between_marks(prefetcher, prefetcher.prefetch, prefetches)
    return {name: counts[step] / prefetches for step, (name, _what) in enumerate(PHASES, 1)}


def opcodes_runtime_only(prefetcher: StagefatePrefetcher, prefetches: int = 50) -> float:
    """:func:`opcodes_per_phase` of :meth:`StagefatePrefetcher.runtime_only`, as one step."""
    counts = _opcodes_between_marks(
        prefetcher,
        lambda _request, tokens, marks: prefetcher.runtime_only(tokens, marks),
        prefetches,
    )
    return counts[1] / prefetches


def _opcodes_between_marks(
    prefetcher: StagefatePrefetcher,
    run: Callable[[str, list[int], list[float]], None],
    prefetches: int,
) -> Counter[int]:
    """Opcodes interpreted by ``run`` over ``prefetches`` calls, by the clock readings it took
    before them (step ``k`` is between reading ``k`` and ``k + 1``)."""
    counts: Counter[int] = Counter()
    marks: list[float] = []

    def count(_frame: FrameType, event: str, _arg: object) -> Any:
        if event == "opcode":
            counts[len(marks)] += 1  # the clock readings so far tell the step
        return count

    def start(frame: FrameType, _event: str, _arg: object) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return count

    previous = sys.gettrace()  # a coverage tool's tracer, say: put back after each prefetch
    for n in range(prefetches):
        tokens = _tokens(1_000_000 + n)
        prefetcher.prepare(tokens)
        marks.clear()
        sys.settrace(start)
        try:
            run(f"opcodes{n}", tokens, marks)
        finally:
            sys.settrace(previous)
        prefetcher.clean()
    return counts


def run(device: str = "cpu", prefetches: int = 400) -> Section:
    prefetcher = StagefatePrefetcher(device)
    pipe = prefetcher.pipe
    per_prefetch, on_scheduler, commit_guards, first_match, runtime = [], [], [], [], []
    phases: dict[str, list[float]] = {name: [] for name, _what in PHASES}
    clock = time.perf_counter
    for n in range(prefetches):
        base = _tokens(n)
        prefetcher.prepare(base)
        marks: list[float] = []
        prefetcher.prefetch(f"r{n}", base, marks)
        steps = dict(zip((name for name, _what in PHASES), itertools.pairwise(marks), strict=True))
        for name, (start, end) in steps.items():
            phases[name].append(end - start)
        per_prefetch.append(marks[-1] - marks[0])
        on_scheduler.append(sum(steps[name][1] - steps[name][0] for name in SCHEDULER_PHASES))
        # the commit's re-validation (its guards, decided without effects) vs one first match
        pipe.prefetch_from_storage("probe", base + [7] * 16, PREFIX + SPAN)
        record = pipe.live_records["probe"]
        start = clock()
        pipe.tree.match_prefix(base[:PREFIX])
        first_match.append(clock() - start)
        start = clock()
        pipe.machine.decide(record, "commit")
        commit_guards.append(clock() - start)
        pipe.release_aborted_request("probe")
        pipe.poll()
        prefetcher.clean()
        prefetcher.prepare(base)  # alternated: the same prefetch without the lifecycle
        marks = []
        prefetcher.runtime_only(base, marks)
        runtime.append(marks[-1] - marks[0])
        prefetcher.clean()
    median_us = statistics.median(per_prefetch) * 1e6
    runtime_us = statistics.median(runtime) * 1e6
    ratio = statistics.median(commit_guards) / statistics.median(first_match)
    opcodes = opcodes_per_phase(prefetcher)
    runtime_opcodes = opcodes_runtime_only(prefetcher)
    body = table(
        ["measure", "median", "opcodes"],
        [
            ["issue → ack, one prefetch (µs)", f"{median_us:.1f}", f"{sum(opcodes.values()):,.0f}"],
            [
                f"… of it in the pipeline's calls on the scheduler thread: "
                f"{', '.join(SCHEDULER_PHASES)} (µs)",
                f"{statistics.median(on_scheduler) * 1e6:.1f}",
                f"{sum(opcodes[name] for name in SCHEDULER_PHASES):,.0f}",
            ],
            *[
                [
                    f"… {name}: {what} (µs)",
                    f"{statistics.median(phases[name]) * 1e6:.1f}",
                    f"{opcodes[name]:,.0f}",
                ]
                for name, what in PHASES
            ],
            [
                "the same prefetch's runtime calls alone, no lifecycle (µs)",
                f"{runtime_us:.1f}",
                f"{runtime_opcodes:,.0f}",
            ],
            [
                "… issue → ack less that: the lifecycle's own cost (µs)",
                f"{median_us - runtime_us:.1f}",
                f"{sum(opcodes.values()) - runtime_opcodes:,.0f}",
            ],
            ["IO-commit re-validation (µs)", f"{statistics.median(commit_guards) * 1e6:.1f}", "—"],
            [
                "first match of the same prefix (µs)",
                f"{statistics.median(first_match) * 1e6:.1f}",
                "—",
            ],
            ["re-validation / first match", f"{ratio:.2f}×", "—"],
        ],
    )
    body += (
        f"\n\n{prefetches} prefetches of a {SPAN}-token span after a {PREFIX}-token prefix, "
        f"page_size {PAGE}, ManualIO, KV of 1 layer × 1 head × 1 dim. Opcodes: the Python "
        f"opcodes each step interprets, averaged over 50 more prefetches run under "
        f"`sys.settrace` (the scheduler's own lines in the bench included; time inside C calls "
        f"not seen). The runtime calls alone: the tree, pools, L3 and copy calls of one "
        f"prefetch, straight-line, with no record, states, guards, re-validation, dedup, "
        f"counters or IO executor (`StagefatePrefetcher.runtime_only`), alternated with the "
        f"prefetches above. The re-validation is the "
        f"commit row's guards (anchor re-match, device coverage, host capacity). The scheduler "
        f"encodes the request's tokens once (issue) and matches with that key. Target: ≤ 50 µs "
        f"issue → ack per prefetch (**{'met' if median_us <= 50 else 'NOT met'}**)."
    )
    if pipe.device_pool.device.type == "cuda":
        body += " On CUDA each ack waits for its H2D event (ManualIO completes a load by waiting)."
        return Section("lifecycle-cuda", "Lifecycle bookkeeping per prefetch on the GPU", body)
    return Section("lifecycle", "Lifecycle bookkeeping per prefetch", body)


def run_side_by_side(peer: str | None, prefetches: int = 300) -> Section:
    """Issue → ack per prefetch through stagefate's pipeline and SGLang's, alternated one
    prefetch each on the same workload (a 64-token span after a 256-token device prefix, page
    16, each side's L3 a directory of page files): one row per release ``peer`` names
    (``sglang``, ``sglang==V``, comma-separated), each alternated in that release's process."""
    from ..registry import peer_targets
    from ..targets.sglang.worker import call_in

    if peer is None:
        raise ValueError("--peer: name sglang or sglang==V (comma-separated)")
    rows = []
    for target in peer_targets(peer):
        ours, theirs = call_in(target, alternate_medians, prefetches)
        rows.append([target.version, f"{ours:.1f}", f"{theirs:.1f}", f"{theirs / ours:.2f}×"])
    body = table(
        [
            "SGLang release",
            "stagefate, median µs",
            "SGLang (python tree core), median µs",
            "SGLang / stagefate",
        ],
        rows,
    )
    met = all(float(row[1]) <= float(row[2]) for row in rows)
    worst = max(float(row[1]) for row in rows)
    body += (
        f"\n\n{prefetches} prefetches each, alternated one by one in one process per release "
        f"(the release's own environment; stagefate's side runs there too): a {SPAN}-token "
        f"span after a {PREFIX}-token device prefix, page {PAGE}, one layer × one head × one dim "
        "of KV, IO run inline (stagefate: ManualIO; SGLang: its storage threads' bodies on the "
        "caller's thread, `stagefate/targets/sglang/pipeline_driver.py`). Both sides run the "
        "scheduler's calls in the scheduler's order, issue to ack, and read L3 from page files "
        "in a temporary directory (stagefate's `FileStorage`, SGLang's `file` backend). Goals: "
        f"stagefate at most SGLang's ({'met' if met else 'NOT met'}) and at most "
        f"50 µs ({'met' if worst <= 50 else 'NOT met'})."
    )
    return Section("lifecycle-side-by-side", "Lifecycle bookkeeping side by side with SGLang", body)


def alternate_medians(prefetches: int) -> tuple[float, float]:
    """``(stagefate, SGLang)`` median µs issue → ack, alternated in this process with the
    SGLang release it imports."""
    from ..targets.sglang.bench import SGLangPrefetcher

    with tempfile.TemporaryDirectory(prefix="stagefate-l3-") as directory:
        return _alternate(
            (StagefatePrefetcher(storage=FileStorage(directory)), SGLangPrefetcher(PAGE, PREFIX)),
            prefetches,
        )


def _alternate(sides: tuple[StagefatePrefetcher, Any], prefetches: int) -> tuple[float, float]:
    timings: dict[str, list[float]] = {side.name: [] for side in sides}
    try:
        for n in range(prefetches):
            tokens = _tokens(n)
            for side in sides:
                side.prepare(tokens)
                marks: list[float] = []
                side.prefetch(f"r{n}", tokens, marks)
                timings[side.name].append(marks[-1] - marks[0])
                side.clean()
    finally:
        sides[1].close()
    ours, theirs = (statistics.median(timings[side.name]) * 1e6 for side in sides)
    return ours, theirs
