"""Running one or more policies over a trace, and presenting the outcome (table, JSON, PNG)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from .replay import Replay, ReplayMetrics, ReplayOptions
from .trace import TraceRequest


def replay_policies(
    trace: list[TraceRequest],
    policies: Sequence[str],
    options: ReplayOptions,
    console: Console | None = None,
) -> dict[str, Replay]:
    """Each policy on a fresh engine over the same trace and seed, with a progress bar each."""
    replays: dict[str, Replay] = {}
    with Progress(console=console, transient=False, disable=console is None) as progress:
        for name in policies:
            task = progress.add_task(f"replay {name}", total=len(trace))
            replays[name] = replay = Replay(name, trace, options)
            replay.run(on_request=functools.partial(progress.advance, task))
    return replays


def dedup_line(replays: dict[str, Replay]) -> str | None:
    """What in-flight dedup did in the live run (not a JSON key: the keys are fixed)."""
    live = replays.get("live")
    if live is None:
        return None
    stats = live.pipe.stats
    return (
        f"live: {stats.declined_inflight:,} IO commits found a sibling already reading their "
        f"whole span and waited for it instead of reading (declined_inflight); compare "
        f"`--no-dedup` for the reads this saves"
    )


def metrics_table(results: dict[str, ReplayMetrics]) -> Table:
    table = Table(title="stagefate replay")
    table.add_column("metric")
    for name in results:
        table.add_column(name, justify="right")
    for field in ReplayMetrics.model_fields:
        values = [getattr(metrics, field) for metrics in results.values()]
        table.add_row(field, *(format_metric(v) for v in values))
    return table


def format_metric(value: object) -> str:
    """A metric for people: thousands separated, rates to three decimals."""
    return f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"


def write_json(results: dict[str, ReplayMetrics], path: Path) -> None:
    """One object keyed by policy name, also for a single policy."""
    payload = {name: metrics.model_dump() for name, metrics in results.items()}
    path.write_text(json.dumps(payload, indent=2) + "\n")


def write_plot(results: dict[str, ReplayMetrics], path: Path) -> None:
    """A PNG comparing the policies: L3 reads (used vs wasted) and prompt tokens by source."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'stagefate[plot]'") from None
    names = list(results)
    figure, (reads, tokens) = plt.subplots(1, 2, figsize=(10, 4))
    used = [m.l3_reads - m.l3_reads_wasted for m in results.values()]
    wasted = [m.l3_reads_wasted for m in results.values()]
    reads.bar(names, used, label="spliced from", color="#4c72b0")
    reads.bar(names, wasted, bottom=used, label="read, then discarded", color="#dd8452")
    reads.set_title("L3 reads")
    reads.legend()
    computed = [m.prefill_tokens_computed / 1e6 for m in results.values()]
    spliced = [m.tokens_spliced / 1e6 for m in results.values()]
    reads_wasted = [m.l3_read_tokens_wasted / 1e6 for m in results.values()]
    tokens.bar(names, spliced, label="spliced from L3", color="#4c72b0")
    tokens.bar(names, computed, bottom=spliced, label="prefill computed", color="#55a868")
    tokens.bar(
        names,
        reads_wasted,
        bottom=[a + b for a, b in zip(spliced, computed, strict=True)],
        label="read from L3, wasted",
        color="#dd8452",
    )
    tokens.set_title("tokens (millions)")
    tokens.legend()
    requests = next(iter(results.values())).requests
    figure.suptitle(f"stagefate replay: {requests:,} requests")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
