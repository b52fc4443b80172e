"""``stagefate bench replay``: the replay's wall time and outcome for live, live without dedup,
blind and (where ``make sglang`` installed it) SGLang's own pipeline, in one run, on the embedded
slice or (``--trace``) another trace (a section of its own).

Targets (docs/design.md §8.1, issue "Replay on a continuous-batching engine"): ``make demo``
(live and blind on the embedded slice) under 30 s on 2 cores; the full synthetic trace with both
policies under 2 minutes.
"""

from __future__ import annotations

from pathlib import Path

from ..registry import policies_for_all, policy_factories
from ..sim.replay import ReplayOptions
from ..sim.report import metric_rows, replay_policies
from ..sim.trace import load_trace
from .report import Section, table


def run(trace_path: str | None = None) -> Section:
    trace = load_trace(trace_path)
    options = ReplayOptions()
    policies, _left_out = policies_for_all()
    replays = replay_policies(trace, policy_factories(policies), options)
    plain = replay_policies(
        trace, policy_factories(["live"]), options.model_copy(update={"dedup_inflight": False})
    )
    results = {
        "live": replays["live"].metrics,
        "live, no dedup": plain["live"].metrics,
        **{name: replays[name].metrics for name in policies if name != "live"},
    }
    body = table(["metric", *results], metric_rows(results))
    live, blind = results["live"], results["blind"]
    both = live.wall_seconds + blind.wall_seconds
    sglang = results.get("sglang")
    costs = options.costs
    body += (
        f"\n\nTrace: {trace_path or 'the embedded slice'} ({len(trace):,} requests), default "
        f"options: {costs.model} on {costs.gpu} ({costs.device_kv_tokens():,} device KV "
        f"tokens), speed {options.speed:g}, page {options.page_size}, "
        f"{options.host_tokens // 1024} Ki host tokens, prefetch policy "
        f"{options.engine.prefetch_policy}, seed {options.seed}. Live and blind together took "
        f"{both:.1f} s of wall time. Live wasted {live.l3_reads_wasted} of {live.l3_reads:,} L3 "
        f"reads, blind {blind.l3_reads_wasted} of {blind.l3_reads:,}; hit rate "
        f"{live.hit_rate:.3f} against {blind.hit_rate:.3f}. "
    )
    if sglang is not None:
        body += (
            f"SGLang 0.5.23's own pipeline (`--policy sglang`) took {sglang.wall_seconds:.1f} s "
            f"and wasted {sglang.l3_reads_wasted} of {sglang.l3_reads:,}, hit rate "
            f"{sglang.hit_rate:.3f}. "
        )
    body += "docs/replay.md explains where each wasted read comes from."
    if trace_path is None:
        return Section("replay", "Trace replay: the embedded slice", body)
    stem = Path(trace_path).stem
    return Section(f"replay-{stem}", f"Trace replay: {stem}", body)
