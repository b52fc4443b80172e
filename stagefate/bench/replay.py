"""``stagefate bench replay``: the trace replay's wall time and the live vs blind outcome.

With ``--trace`` it replays that file (the full Mooncake synthetic trace is the reference run:
3,993 requests, target under 2 minutes per policy); without it, the embedded slice.
"""

from __future__ import annotations

from ..sim.replay import ReplayMetrics, ReplayOptions
from ..sim.report import format_metric, replay_policies
from ..sim.trace import load_trace
from .report import Section, table


def run(trace_path: str | None = None) -> Section:
    trace = load_trace(trace_path)
    replays = replay_policies(trace, ["live", "blind"], ReplayOptions())
    live, blind = replays["live"].metrics, replays["blind"].metrics
    plain = replay_policies(trace, ["live"], ReplayOptions(dedup_inflight=False))["live"].metrics
    rows = [
        [field, *(format_metric(getattr(m, field)) for m in (live, plain, blind))]
        for field in ReplayMetrics.model_fields
    ]
    rows.append(
        ["declined_inflight", f"{replays['live'].pipe.stats.declined_inflight:,}", "0", "0"]
    )
    share = (
        f"{live.l3_reads_wasted / blind.l3_reads_wasted:.0%}" if blind.l3_reads_wasted else "n/a"
    )
    body = table(["metric", "live", "live, no dedup", "blind"], rows)
    body += (
        f"\n\nTrace: {trace_path or 'the embedded slice'} ({len(trace):,} requests), default "
        f"options (page 64, 512 Ki device tokens, 256 Ki host tokens, seed 0). Live wastes "
        f"{live.l3_reads_wasted} L3 reads, {share} of blind's {blind.l3_reads_wasted}; "
        f"without in-flight dedup it wastes {plain.l3_reads_wasted} and reads "
        f"{plain.l3_reads - live.l3_reads:,} more spans. docs/replay.md explains where each "
        "comes from."
    )
    return Section("replay", "Trace replay: live tree vs blind gamble", body)
