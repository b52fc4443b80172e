"""The replay's figures as tables: one run, a sweep, over seeds, per instance, the reads wasted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel
from rich.table import Table

from .bound import TraceBound
from .instances import InstancesMetrics
from .replay import ReplayMetrics
from .spread import SeedRuns, Spread, summary

REASONS = {
    "shrunk": "the splice base was evicted before admission: the live prefix ends before the span",
    "not_trimmed": "a sibling published the span's head; all-or-nothing cannot splice the tail",
    "device_covered": "by admission the device held the whole span: a sibling computed it",
    "dropped": "the live prefix moved between the plan and the splice",
    "discarded": "L3 returned nothing usable for the span (pages missing, damaged or failed)",
    "aborted": "admitted without it (prefetch timeout): the read landed after admission",
    "device_capacity": "no device room for the splice at admission",
    "host_capacity": "no bounce room when the read was due",
    "released": "the scheduler released the hold",
    "aux_cut": "a trim would have cut into the sliding window",
    "trimmed": "heads of spliced spans a sibling had published meanwhile (tokens only)",
    "short_read": "tails of spliced spans L3 did not return (tokens only)",
}
"""What each ``wasted_by_reason`` key means (docs/replay.md has the long form)."""


def format_metric(value: object) -> str:
    """A metric for people: thousands separated, rates to three decimals."""
    if isinstance(value, str):
        return value
    return f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"


_NESTED = ("wasted_by_reason", "engine", "arrivals", "prefetches", "l3_damage")


def metric_rows(results: dict[str, ReplayMetrics]) -> list[list[str]]:
    """``[metric, value per policy…]``: the scalar keys, the engine block, then the wasted
    reads and tokens by reason (one row per reason, ``reads / tokens``)."""
    metrics = list(results.values())
    rows = [
        [field, *(format_metric(getattr(m, field)) for m in metrics)]
        for field in ReplayMetrics.model_fields
        if field not in _NESTED
    ]
    for block in ("engine", "arrivals", "prefetches"):
        rows += _block_rows(block, [getattr(m, block) for m in metrics])
    for reason in sorted({r for m in metrics for r in m.wasted_by_reason}):
        cells = []
        for m in metrics:
            wasted = m.wasted_by_reason.get(reason)
            cells.append("-" if wasted is None else f"{wasted.reads:,} / {wasted.tokens:,}")
        rows.append([f"wasted: {reason}", *cells])
    return rows


def _block_rows(prefix: str, blocks: Sequence[BaseModel]) -> list[list[str]]:
    """``[prefix.field, value per policy…]`` for a nested block, one row per leaf field."""
    rows = []
    for field, value in blocks[0]:
        values = [getattr(block, field) for block in blocks]
        if isinstance(value, BaseModel):  # queue_wait_ms, delay_ms: one row per percentile
            rows += _block_rows(f"{prefix}.{field}", values)
        elif isinstance(value, dict):  # prefetches.declined: one row per reason any policy has
            for key in sorted({key for counts in values for key in counts}):
                cells = [format_metric(counts[key]) if key in counts else "-" for counts in values]
                rows.append([f"{prefix}.{field}.{key}", *cells])
        else:
            rows.append([f"{prefix}.{field}", *(format_metric(v) for v in values)])
    return rows


def metrics_table(results: dict[str, ReplayMetrics], bound: TraceBound | None = None) -> Table:
    """Every figure, one column per policy; with ``bound``, each hit rate's share of it."""
    table = Table(title="stagefate replay")
    table.add_column("metric")
    for name in results:
        table.add_column(name, justify="right")
    for row in metric_rows(results):
        if not row[0].startswith("wasted: "):  # the wasted table shows them with meanings
            table.add_row(*row)
        if row[0] == "hit_rate" and bound is not None:
            shares = [format_metric(share_of_bound(m.hit_rate, bound)) for m in results.values()]
            table.add_row(f"hit_rate / bound {bound.hit_rate:.3f}", *shares)
    return table


_PER_INSTANCE = (
    "requests",
    "hit_rate",
    "l3_reads",
    "l3_reads_wasted",
    "l3_read_tokens_wasted",
    "tokens_spliced",
)


def instances_table(name: str, metrics: InstancesMetrics) -> Table:
    """One policy behind the router: a few figures per instance, and the total."""
    table = Table(title=f"{name}: per instance")
    table.add_column("metric")
    for index in range(len(metrics.instances)):
        table.add_column(f"#{index}", justify="right")
    table.add_column("total", justify="right")
    for field in _PER_INSTANCE:
        cells = [format_metric(getattr(m, field)) for m in [*metrics.instances, metrics.total]]
        table.add_row(field, *cells)
    busy = [format_metric(m.engine.busy_fraction) for m in [*metrics.instances, metrics.total]]
    table.add_row("engine.busy_fraction", *busy)
    return table


def wasted_table(results: dict[str, ReplayMetrics]) -> Table:
    """Wasted reads / tokens by reason, one column per policy, with what each reason means."""
    table = Table(title="wasted L3 reads by reason (reads / tokens)")
    table.add_column("reason")
    for name in results:
        table.add_column(name, justify="right")
    table.add_column("meaning")
    for row in metric_rows(results):
        if row[0].startswith("wasted: "):
            reason = row[0].removeprefix("wasted: ")
            table.add_row(reason, *row[1:], REASONS.get(reason, ""))
    return table


def sweep_table(sweep: dict[float, dict[str, ReplayMetrics]]) -> Table:
    table = Table(title="load sweep")
    for column in (
        "speed",
        "policy",
        "L3 reads",
        "wasted reads",
        "wasted tokens",
        "hit rate",
        "engine s",
    ):
        table.add_column(column, justify="right")
    for speed, results in sweep.items():
        for name, m in results.items():
            table.add_row(
                f"{speed:g}",
                name,
                f"{m.l3_reads:,}",
                f"{m.l3_reads_wasted:,}",
                f"{m.l3_read_tokens_wasted:,}",
                f"{m.hit_rate:.3f}",
                f"{m.engine.simulated_seconds:,.0f}",
            )
    return table


def spread_rows(runs: SeedRuns) -> list[list[str]]:
    """``[figure, median [min–max] per policy…]`` for every figure of any policy."""
    spreads = {name: summary(policy_runs) for name, policy_runs in runs.items()}
    keys = sorted({key for s in spreads.values() for key in s}, key=_figure_order)
    return [
        [key, *(s[key].show(key.endswith("rate")) if key in s else "-" for s in spreads.values())]
        for key in keys
    ]


def spread_table(runs: SeedRuns, seeds: Sequence[int], bound: TraceBound) -> Table:
    """Every figure of every policy as ``median [min–max]`` over the seeds; after the hit
    rate, its share of the trace's bound."""
    table = Table(title=f"stagefate replay: median [min–max] over seeds {seed_list(seeds)}")
    table.add_column("metric")
    for name in runs:
        table.add_column(name, justify="right")
    for row in spread_rows(runs):
        table.add_row(*row)
        if row[0] == "hit_rate":
            table.add_row(
                f"hit_rate / bound {bound.hit_rate:.3f}",
                *(_share_spread(policy_runs, bound) for policy_runs in runs.values()),
            )
    return table


def _share_spread(runs: Sequence[ReplayMetrics], bound: TraceBound) -> str:
    return Spread.of([share_of_bound(m.hit_rate, bound) for m in runs]).show(rate=True)


def _figure_order(key: str) -> tuple[int, int, str]:
    """The replay's own field order first, then the engine block, then wasted reasons."""
    fields = list(ReplayMetrics.model_fields)
    head = key.split(".")[0]
    return (0 if "." not in key else 1 if head == "engine" else 2, fields.index(head), key)


_SWEEP_FIGURES = (
    ("L3 reads", "l3_reads"),
    ("wasted reads", "l3_reads_wasted"),
    ("wasted tokens", "l3_read_tokens_wasted"),
    ("hit rate", "hit_rate"),
    ("engine s", "engine.simulated_seconds"),
)
"""The sweep table's columns: (title, figure of :func:`~.spread.summary`)."""


def spread_sweep_table(
    sweep: Mapping[float, SeedRuns], seeds: Sequence[int], bound: TraceBound
) -> Table:
    table = Table(title=f"load sweep: median [min–max] over seeds {seed_list(seeds)}")
    titles = (*(title for title, _key in _SWEEP_FIGURES), f"hit / bound {bound.hit_rate:.3f}")
    for column in ("speed", "policy", *titles):
        table.add_column(column, justify="right")
    for speed, runs in sweep.items():
        for name, policy_runs in runs.items():
            spreads = summary(policy_runs)
            cells = [spreads[key].show(rate=key == "hit_rate") for _title, key in _SWEEP_FIGURES]
            table.add_row(f"{speed:g}", name, *cells, _share_spread(policy_runs, bound))
    return table


def share_of_bound(hit_rate: float, bound: TraceBound) -> float:
    return round(hit_rate / bound.hit_rate, 6) if bound.hit_rate else 0.0


def seed_list(seeds: Sequence[int]) -> str:
    return ", ".join(map(str, seeds))
