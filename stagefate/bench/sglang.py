"""``stagefate bench sglang``: the same requests through SGLang's engine with no HiCache, with
its own buffer mode (0.5.23, and 0.5.19 where its engine serves here) and with stagefate's
lifecycle as its buffer-mode pipeline, in one run.

Three workloads of different shapes, each sent as real requests to the tiny Llama in SGLang's
engine (one engine per pipeline and workload, back to back, on the same device pool;
:mod:`stagefate.targets.sglang.engine`):

* **the embedded slice** (the first ``limit`` requests of Mooncake's synthetic trace) scaled to
  the tiny model as the vLLM benchmark scales it (:mod:`stagefate.targets.workloads`: a
  512-token block becomes 32 tokens, lengths divided by 16, prompts cut to 1,920 tokens), in
  arrival order, 16 requests arriving together;
* **multi-turn conversations** (24 conversations sharing a system prompt, 4 turns), turn k of
  every conversation arriving together;
* **a burst sharing a long prefix**: 16 requests, one 1,024-token prefix and a 64-token tail
  each, first sent once (their KV written through to L3), the device cache flushed, then sent
  together again, at a device pool of 1,536 tokens that cannot hold them all.

The device pool (4,096 tokens for the first two) makes SGLang's tree evict, so a returning
prefix has to come back from L3. Per pipeline: greedy outputs equal to no HiCache's, L3 reads,
tokens read, tokens read and never used (read minus what SGLang reports served from storage),
tokens loaded again after an earlier read of the same page (a span loaded by two requests),
SGLang's own storage-hit tokens (its ``cached_tokens_details``), TTFT p50 and p99 (streamed),
generated tokens per second, and the scheduler's time per step inside the pipeline (every call
the scheduler and its cache make on the pipeline's behalf, timed the same way for both
pipelines: :mod:`stagefate.targets.sglang.engine.probe`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..sim.trace import load_trace
from ..targets.sglang.engine.batch import Batch
from ..targets.sglang.engine.client import EngineFailed, SGLangEngine
from ..targets.sglang.engine.findings import prompt
from ..targets.sglang.engine.serving import check_command, recorded
from ..targets.sglang.engine.settings import EngineSettings, Lifecycle
from ..targets.sglang.environments import install_command, installed
from ..targets.sglang.releases import NEWEST
from ..targets.workloads import conversations, in_batches, scaled_prompt
from .report import Section, table

MAX_NEW_TOKENS = 4
PAGE = 4
POOL_TOKENS = 4096
"""SGLang's device pool for the slice and the conversations: two of the longest prompts."""
BURST_POOL_TOKENS = 1536
CONTEXT = 2048
"""SGLang's context length here (prompts are cut to 1,920 tokens): with a 4,096-token pool the
anchor-lock cap is 2,048 pinned tokens, and 0 with the burst's pool, for both pipelines."""


@dataclass(frozen=True)
class Arm:
    """One way to serve the requests."""

    name: str
    release: str
    buffer_mode: bool
    lifecycle: Lifecycle = "sglang"


ARMS = (
    Arm("no HiCache", NEWEST, buffer_mode=False),
    Arm(f"SGLang {NEWEST} buffer mode", NEWEST, buffer_mode=True),
    Arm("SGLang 0.5.19 buffer mode", "0.5.19", buffer_mode=True),
    Arm(f"stagefate (in SGLang {NEWEST})", NEWEST, buffer_mode=True, lifecycle="stagefate"),
)


@dataclass(frozen=True)
class Workload:
    title: str
    batches: list[list[list[int]]]
    pool_tokens: int = POOL_TOKENS
    warm: bool = False
    """Send every batch once first, then flush the device cache (L3 keeps what was written)."""


def workloads(limit: int) -> list[Workload]:
    slice_prompts = [scaled_prompt(request) for request in load_trace(None, limit)]
    chats = conversations(24, 4, seed=3)
    shared = prompt(31, 1024)
    burst = [shared + prompt(200 + i, 64) for i in range(16)]
    return [
        Workload(f"embedded slice, first {limit} requests, scaled", in_batches(slice_prompts, 16)),
        Workload(
            "multi-turn: 24 conversations × 4 turns",
            [[chat[turn] for chat in chats] for turn in range(4)],
        ),
        Workload(
            "burst: 16 requests sharing a 1,024-token prefix",
            [burst],
            pool_tokens=BURST_POOL_TOKENS,
            warm=True,
        ),
    ]


def _settings(arm: Arm, workload: Workload) -> EngineSettings:
    return EngineSettings(
        buffer_mode=arm.buffer_mode,
        lifecycle=arm.lifecycle,
        max_total_tokens=workload.pool_tokens,
        max_running_requests=16,
        chunked_prefill_size=1024,
        context_length=CONTEXT,
    )


def _send(engine: SGLangEngine, batches: list[list[list[int]]], tag: str) -> list[dict[str, Any]]:
    answers: list[dict[str, Any]] = []
    for number, prompts in enumerate(batches):
        rids = [f"{tag}-{number}-{i}" for i in range(len(prompts))]
        batch = Batch(prompts, max_new_tokens=MAX_NEW_TOKENS, rids=rids, stream=True)
        answers += engine.generate(batch)
    return answers


def serve(arm: Arm, workload: Workload) -> dict[str, Any]:
    """One pipeline's run of one workload: the answers, the wall time, and the difference of
    the scheduler's probe (:mod:`~stagefate.targets.sglang.engine.probe`) across the run."""
    target = installed()[arm.release]
    with SGLangEngine(target, _settings(arm, workload)) as engine:
        if workload.warm:
            _send(engine, workload.batches, "warm")
            engine.flush()
        before = engine.wait_idle()["probe"]
        start = time.perf_counter()
        answers = _send(engine, workload.batches, "run")
        wall = time.perf_counter() - start
        after = engine.wait_idle()
    return {"answers": answers, "wall": wall, "probe": probe_difference(before, after["probe"])}


def probe_difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the probe counted between two of its reports."""
    return {
        "steps": after["steps"] - before["steps"],
        "seconds": sum(after["seconds"].values()) - sum(before["seconds"].values()),
        "reads": after["reads"] - before["reads"],
        "pages": after["pages"] - before["pages"],
        "pages_again": after["pages_again"] - before["pages_again"],
    }


def _percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (p99 of 16 requests is the slowest one)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def figures(result: dict[str, Any], baseline: list[dict[str, Any]] | None) -> dict[str, float]:
    """What one pipeline's run shows (``baseline``: no HiCache's answers, in order)."""
    answers = result["answers"]
    probe = result["probe"]
    same = -1  # nothing to compare with
    if baseline is not None:
        same = sum(
            a["output_ids"] == b["output_ids"] for a, b in zip(answers, baseline, strict=True)
        )
    served = sum(int((answer.get("cached") or {}).get("storage", 0)) for answer in answers)
    read = probe["pages"] * PAGE
    ttft = [answer["ttft_s"] * 1000 for answer in answers if answer.get("ttft_s") is not None]
    return {
        "same": same,
        "reads": probe["reads"],
        "read": read,
        "never_used": max(read - served, 0),
        "again": probe["pages_again"] * PAGE,
        "served": served,
        "cached": sum(int(answer.get("cached_tokens") or 0) for answer in answers),
        "ttft50": _percentile(ttft, 0.5) if ttft else float("nan"),
        "ttft99": _percentile(ttft, 0.99) if ttft else float("nan"),
        "tokens_per_s": sum(len(answer["output_ids"]) for answer in answers) / result["wall"],
        "us_per_step": probe["seconds"] / max(probe["steps"], 1) * 1e6,
        "ms_total": probe["seconds"] * 1000,
    }


def row(name: str, runs: list[dict[str, float]], requests: int) -> list[object]:
    """A pipeline's row: each figure's median over the repeats (outputs: the fewest equal)."""

    def median(key: str) -> float:
        return statistics.median(run[key] for run in runs)

    fewest = min(run["same"] for run in runs)
    return [
        name,
        "–" if fewest < 0 else f"{fewest:.0f}/{requests}",
        f"{median('reads'):.0f}",
        f"{median('read'):.0f}",
        f"{median('never_used'):.0f}",
        f"{median('again'):.0f}",
        f"{median('served'):.0f}",
        f"{median('cached'):.0f}",
        f"{median('ttft50'):.0f}",
        f"{median('ttft99'):.0f}",
        f"{median('tokens_per_s'):.0f}",
        f"{median('us_per_step'):.0f}",
        f"{median('ms_total'):.0f}",
    ]


HEADERS = (
    "pipeline",
    "outputs = no HiCache's",
    "L3 reads",
    "tokens read",
    "read, never used",
    "loaded by two requests",
    "storage-hit tokens (SGLang's)",
    "prompt tokens not computed",
    "TTFT p50 (ms)",
    "TTFT p99 (ms)",
    "generated tok/s",
    "pipeline µs/step",
    "pipeline ms in all",
)


def why(failure: Exception) -> str:
    """The line of the engine's log that says why it stopped."""
    lines = [line.strip() for line in str(failure).splitlines() if "Error" in line]
    return (lines[-1] if lines else str(failure).splitlines()[0])[:200]


def _unavailable(arm: Arm) -> str | None:
    target = installed().get(arm.release)
    if target is None:
        return f"not installed: `{install_command(arm.release)}`"
    check = recorded(target)
    if check is None:
        return f"its engine was never checked: `{check_command(arm.release)}`"
    if not check.serves:
        return f"its engine does not serve here: {check.detail}"
    return None


def run(limit: int = 200, repeats: int = 3) -> Section:
    missing = {arm.name: _unavailable(arm) for arm in ARMS}  # looked up once, before any work
    if missing[ARMS[0].name] is not None:  # refused, naming the install command
        raise ValueError(f"bench sglang needs SGLang {NEWEST}'s engine: {missing[ARMS[0].name]}")
    arms = [arm for arm in ARMS if missing[arm.name] is None]
    parts = [
        f"SGLang's engine on the CPU (`stagefate targets`), the tiny Llama (2 layers, 2 KV heads, "
        f"head_dim 32, bf16, random weights, seed 0), page {PAGE}, context {CONTEXT}, "
        f"greedy {MAX_NEW_TOKENS} tokens a request, streamed; L3 a file folder per engine "
        "(SGLang's `file` backend, or stagefate's file store). Each pipeline runs each workload "
        f"{repeats} times, the pipelines in turn (a different one first each time); a cell is "
        "the median of its runs, and the outputs column the fewest equal in any run."
    ]
    for workload in workloads(limit):
        notes = [f"- {arm.name}: {missing[arm.name]}" for arm in ARMS if arm not in arms]
        served: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
        for turn in range(repeats):
            for arm in arms[turn % len(arms) :] + arms[: turn % len(arms)]:
                if arm.name not in served:
                    continue  # it failed an earlier run
                try:
                    served[arm.name].append(serve(arm, workload))
                except EngineFailed as failure:
                    del served[arm.name]
                    notes.append(f"- {arm.name} did not finish (run {turn + 1}): `{why(failure)}`")
        baseline = served.get(ARMS[0].name)
        requests = sum(len(batch) for batch in workload.batches)
        rows = [
            row(
                name,
                [
                    figures(run, None if baseline is None else base["answers"])
                    for run, base in zip(runs, baseline or runs, strict=True)
                ],
                requests,
            )
            for name, runs in served.items()
        ]
        pool = f"device pool {workload.pool_tokens:,} tokens"
        parts += [f"### {workload.title} ({pool})", table(HEADERS, rows), *notes]
    return Section(
        "sglang",
        "SGLang's engine: no HiCache, SGLang's buffer mode and stagefate's lifecycle",
        "\n\n".join(parts),
    )
