"""``stagefate bench replay``: the replay's wall time and outcome for live, live without dedup,
and blind, on the embedded slice or (``--trace``) another trace (a section of its own).

Targets (DESIGN §8.1, issue "Replay on a continuous-batching engine"): ``make demo`` (live and
blind on the embedded slice) under 30 s on 2 cores; the full synthetic trace with both policies
under 2 minutes.
"""

from __future__ import annotations

from pathlib import Path

from ..sim.replay import ReplayOptions
from ..sim.report import metric_rows, replay_policies
from ..sim.trace import load_trace
from .report import Section, table


def run(trace_path: str | None = None) -> Section:
    trace = load_trace(trace_path)
    options = ReplayOptions()
    replays = replay_policies(trace, ["live", "blind"], options)
    plain = replay_policies(trace, ["live"], options.model_copy(update={"dedup_inflight": False}))
    results = {
        "live": replays["live"].metrics,
        "live, no dedup": plain["live"].metrics,
        "blind": replays["blind"].metrics,
    }
    body = table(["metric", *results], metric_rows(results))
    live, blind = results["live"], results["blind"]
    both = live.wall_seconds + blind.wall_seconds
    costs = options.costs
    body += (
        f"\n\nTrace: {trace_path or 'the embedded slice'} ({len(trace):,} requests), default "
        f"options: {costs.model} on {costs.gpu} ({costs.device_kv_tokens():,} device KV "
        f"tokens), speed {options.speed:g}, page {options.page_size}, "
        f"{options.host_tokens // 1024} Ki host tokens, prefetch policy "
        f"{options.engine.prefetch_policy}, seed {options.seed}. Live and blind together took "
        f"{both:.1f} s of wall time (`stagefate replay` runs exactly these two). Live wasted "
        f"{live.l3_reads_wasted} of {live.l3_reads:,} L3 reads, blind {blind.l3_reads_wasted} of "
        f"{blind.l3_reads:,}; hit rate {live.hit_rate:.3f} against {blind.hit_rate:.3f}. "
        "docs/replay.md explains where each wasted read comes from."
    )
    if trace_path is None:
        return Section("replay", "Trace replay: the embedded slice", body)
    stem = Path(trace_path).stem
    return Section(f"replay-{stem}", f"Trace replay: {stem}", body)
