"""Running policies over a trace, and presenting the outcome: tables, the story, PNGs (the JSON
file is :mod:`.report_json`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ..statemachine.record import Instrument
from ..statemachine.stats import Stats
from ..transition_log import TransitionLog
from .blind import BlindPolicy
from .bound import TraceBound
from .instances import InstancesMetrics
from .live import LivePolicy
from .policy import LogsTransitions, Policy, PolicyFactory
from .ranks import RankedReplay, build_replay, replays_of
from .replay import Replay, ReplayMetrics, ReplayOptions
from .spread import SeedRuns, Spread, compare, summary
from .trace import TraceRequest

REASONS = {
    "shrunk": "the splice base was evicted before admission: the live prefix ends before the span",
    "not_trimmed": "a sibling published the span's head; all-or-nothing cannot splice the tail",
    "device_covered": "by admission the device held the whole span: a sibling computed it",
    "dropped": "the live prefix moved between the plan and the splice",
    "discarded": "L3 returned nothing for the span",
    "aborted": "admitted without it (prefetch timeout): the read landed after admission",
    "device_capacity": "no device room for the splice at admission",
    "host_capacity": "no bounce room when the read was due",
    "released": "the scheduler released the hold",
    "aux_cut": "a trim would have cut into the sliding window",
    "trimmed": "heads of spliced spans a sibling had published meanwhile (tokens only)",
    "short_read": "tails of spliced spans L3 did not return (tokens only)",
}
"""What each ``wasted_by_reason`` key means (docs/replay.md has the long form)."""


def replay_policies(
    trace: list[TraceRequest],
    policies: Mapping[str, PolicyFactory],
    options: ReplayOptions,
    console: Console | None = None,
    live_instruments: Sequence[Sequence[Instrument]] = (),
    design_logs: Mapping[str, TransitionLog] | None = None,
) -> dict[str, Replay | RankedReplay]:
    """Each policy (``{name: factory}``, :func:`stagefate.registry.policy_factories`) on a
    fresh engine over the same trace and seed (as ``options.tp_size`` ranks where it is more
    than one), with a progress bar each; ``live_instruments[r]`` watch rank ``r``'s live
    pipeline (a transition log, metrics); ``design_logs[name]`` gets that policy's
    transitions in its own design's words."""
    replays: dict[str, Replay | RankedReplay] = {}
    with Progress(console=console, transient=False, disable=console is None) as progress:
        for name, factory in policies.items():
            task = progress.add_task(f"replay {name} ×{options.speed:g}", total=len(trace))
            replays[name] = replay = build_replay(factory, trace, options)
            for rank, instruments in zip(replays_of(replay), live_instruments, strict=False):
                if isinstance(rank.policy, LivePolicy):
                    rank.policy.pipe.instruments.extend(instruments)
            log = (design_logs or {}).get(name)
            if log is not None:
                attach_design_log(replay, name, log)
            replay.run(on_request=functools.partial(progress.advance, task))
    return replays


def attach_design_log(replay: Replay | RankedReplay, name: str, log: TransitionLog) -> None:
    """The ``name`` policy's pipeline writes its transitions to ``log`` in its own design's
    words (``log.spec`` says which)."""
    policy = replays_of(replay)[0].policy
    if not isinstance(policy, LogsTransitions):
        raise ValueError(f"the {name} policy writes no transition log of its own")
    log.spec = policy.log_transitions(log)


# ---------------------------------------------------------------------- tables


def format_metric(value: object) -> str:
    """A metric for people: thousands separated, rates to three decimals."""
    if isinstance(value, str):
        return value
    return f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"


_NESTED = ("wasted_by_reason", "engine", "arrivals", "prefetches")


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
            shares = [format_metric(_share(m.hit_rate, bound)) for m in results.values()]
            table.add_row(f"hit_rate / bound {bound.hit_rate:.3f}", *shares)
    return table


def _share(hit_rate: float, bound: TraceBound) -> float:
    return round(hit_rate / bound.hit_rate, 6) if bound.hit_rate else 0.0


AT_THE_BOUND = 0.995
"""A hit rate within half a percent of the bound is at it: nothing was left to reuse."""


def bound_story(
    by_speed: Mapping[float, Mapping[str, ReplayMetrics | Sequence[ReplayMetrics]]],
    bound: TraceBound,
) -> list[str]:
    """The bound in words, and, at each speed where every policy reaches it (under every seed,
    given a policy's runs over the seeds), what to do."""
    lines = [
        f"the trace's bound: {bound.reusable_tokens:,} of {bound.prompt_tokens:,} prompt tokens "
        f"are in pages an earlier request wrote (hit rate {bound.hit_rate:.3f} with infinite "
        "device memory and L3)"
    ]
    for speed, results in by_speed.items():
        runs = [
            run
            for each in results.values()
            for run in ([each] if isinstance(each, ReplayMetrics) else each)
        ]
        if all(_share(m.hit_rate, bound) >= AT_THE_BOUND for m in runs):
            lines.append(
                f"every policy reaches the bound at {speed:g}x: this load leaves nothing to "
                "decide (every reusable page is served in time); raise it with --speed (e.g. "
                f"--speed {speed * 2:g}) or --sweep {speed:g},{speed * 2:g},{speed * 4:g} to "
                "compare the designs where they differ"
            )
    return lines


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


def cross_instance_story(results: dict[str, InstancesMetrics]) -> list[str]:
    """Per policy: what it spliced from pages another instance wrote, and how much of what it
    wasted such pages account for."""
    lines = []
    for name, metrics in results.items():
        total, hits = metrics.total, metrics.cross_instance_hits
        wasted = metrics.cross_instance_read_tokens - hits
        spliced = f" ({hits / total.tokens_spliced:.0%} of its spliced tokens)" if hits else ""
        of_waste = (
            f" ({wasted / total.l3_read_tokens_wasted:.0%} of its wasted tokens)"
            if total.l3_read_tokens_wasted
            else ""
        )
        lines.append(
            f"{name}: {hits:,} tokens spliced from L3 pages another instance wrote{spliced}; "
            f"{wasted:,} read from such pages went unspliced{of_waste}"
        )
    return lines


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


# ---------------------------------------------------------------------- the story


def story(
    results: dict[str, ReplayMetrics],
    arrival_seconds: float,
    ran: Mapping[str, Policy] | None = None,
    releases: Mapping[str, str] | None = None,
) -> list[str]:
    """What the comparison shows, in words, from the figures themselves. ``ran``: the policies
    run in this process, by name, whose counters explain live's and blind's sides;
    ``releases``: the SGLang release each ``sglang`` policy ran (by policy name)."""
    lines, ran = [], ran or {}
    for name, m in results.items():
        share = f"{m.l3_reads_wasted / m.l3_reads:.0%}" if m.l3_reads else "n/a"
        lines.append(
            f"{name}: {m.l3_reads:,} L3 reads, {m.l3_reads_wasted:,} wasted ({share}), "
            f"{m.l3_read_tokens_wasted:,} tokens read for nothing; hit rate {m.hit_rate:.3f}; "
            f"the engine ran {m.engine.simulated_seconds:,.0f} s for {arrival_seconds:,.0f} s "
            f"of arrivals"
        )
        arrivals = m.arrivals
        if arrivals.delayed:
            lines.append(
                f"  {arrivals.delayed:,} of {arrivals.turns:,} turns arrived after their trace "
                f"time, waiting for the turn before (p50 {arrivals.delay_ms.p50:,.0f} ms, p99 "
                f"{arrivals.delay_ms.p99:,.0f} ms later)"
            )
        biggest = sorted(m.wasted_by_reason.items(), key=lambda kv: -kv[1].tokens)
        for reason, wasted in biggest[:3]:
            what = f"{_count(wasted.reads, 'read')}, " if wasted.reads else ""
            lines.append(f"  {reason}: {what}{wasted.tokens:,} tokens: {REASONS.get(reason, '')}")
    live = ran.get("live")
    if not isinstance(live, LivePolicy) or "live" not in results:
        return lines
    stats = live.pipe.stats
    blind = ran.get("blind")
    if isinstance(blind, BlindPolicy) and "blind" in results:
        lines += _compare(results["live"], results["blind"], stats, blind)
    for name, version in (releases or {}).items():
        if name in results:
            lines += _compare_with_sglang(results["live"], results[name], stats, name, version)
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _compare(lm: ReplayMetrics, bm: ReplayMetrics, stats: Stats, blind: BlindPolicy) -> list[str]:
    """What #36834 (and stagefate's own decisions) bought over the code just before it."""
    lines = []
    shrunk = bm.wasted_by_reason.get("shrunk")
    if shrunk is not None:
        lines.append(
            f"blind discarded {_count(shrunk.reads, 'span')} whose splice base was evicted while "
            f"the fetch was unpinned; live pins the anchor when it issues, or declines before "
            f"reading ({lm.declined_anchor_lost:,} declined_anchor_lost)"
        )
    not_trimmed = bm.wasted_by_reason.get("not_trimmed")
    if not_trimmed is not None:
        lines.append(
            f"blind discarded {_count(not_trimmed.reads, 'span')} whose head a sibling had "
            f"published; live trims such a head and splices the tail (it trimmed "
            f"{lm.tokens_trimmed:,} tokens)"
        )
    covered = bm.wasted_by_reason.get("device_covered")
    if covered is not None:
        lines.append(
            f"blind read {_count(covered.reads, 'span')} that a sibling brought to the device "
            f"first; live's commits found {_count(stats.declined_inflight, 'span')} a sibling was "
            f"already reading and waited for it instead (declined_inflight), and "
            f"{lm.declined_device_covered:,} already on the device (declined_device_covered)"
        )
    full = blind.ended_unread.get("host_capacity", 0)
    if full:
        lines.append(
            f"blind dropped {_count(full, 'hit')} at the commit for want of bounce room; live "
            f"parks such a hit until room frees ({stats.parked:,} parked)"
        )
    lines.append(
        f"both retry a span that was not in L3 yet (PR #36227, four days older than #36834, on "
        f"in blind with live's pacing: 0.5.19 ships it off): live armed "
        f"{stats.retries_armed:,} retries, blind {blind.retries_armed:,}; live re-issues the "
        f"queue head's at once, blind's sweep paces the head like the rest"
    )
    lines.append(
        f"hit rate: live {lm.hit_rate:.3f}, blind {bm.hit_rate:.3f}; prompt tokens computed: "
        f"live {lm.prefill_tokens_computed:,}, blind {bm.prefill_tokens_computed:,}"
    )
    return lines


def _compare_with_sglang(
    lm: ReplayMetrics, sm: ReplayMetrics, stats: Stats, name: str, version: str
) -> list[str]:
    covered = sm.wasted_by_reason.get("device_covered")
    lines = [
        f"{name} (SGLang {version}'s own pipeline) wasted {_count(sm.l3_reads_wasted, 'read')} "
        f"against live's {lm.l3_reads_wasted:,}"
        + (
            f"; {covered.reads:,} were spans a sibling brought to the device first: SGLang has "
            f"no in-flight dedup, live's commits waited for "
            f"{_count(stats.declined_inflight, 'sibling read')} instead"
            if covered is not None
            else ""
        ),
        f"hit rate: live {lm.hit_rate:.3f}, {name} {sm.hit_rate:.3f}; prompt tokens computed: "
        f"live {lm.prefill_tokens_computed:,}, {name} {sm.prefill_tokens_computed:,}",
    ]
    return lines


# ---------------------------------------------------------------------- plots


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'stagefate[plot]'") from None
    return plt


_MARKERS = ("o", "s", "^", "D", "v", "P")
_DASHES = ("-", "--", ":", "-.")


def _line_style(index: int) -> dict[str, Any]:
    """Policy ``index``'s line: its own marker and dash, and a marker a size smaller than the
    one before, so lines with equal figures stay visible on top of one another."""
    return {
        "marker": _MARKERS[index % len(_MARKERS)],
        "linestyle": _DASHES[index % len(_DASHES)],
        "markersize": max(10 - 2 * index, 3),
    }


def _from_zero(axis: Any, largest: float) -> None:
    """A panel of counts starts at 0; one whose ``largest`` value is 0 spans 0 to 1 (not
    matplotlib's -0.04 to 0.04 around a flat line at 0)."""
    if largest > 0:
        axis.set_ylim(bottom=0)
    else:
        axis.set_ylim(0, 1)


def write_plot(results: dict[str, ReplayMetrics], path: Path) -> None:
    """A PNG comparing the policies: L3 reads (used vs wasted) and prompt tokens by source."""
    plt = _pyplot()
    names = list(results)
    figure, (reads, tokens) = plt.subplots(1, 2, figsize=(10, 4))
    used = [m.l3_reads - m.l3_reads_wasted for m in results.values()]
    wasted = [m.l3_reads_wasted for m in results.values()]
    reads.bar(names, used, label="spliced from", color="#4c72b0")
    reads.bar(names, wasted, bottom=used, label="read, then discarded", color="#dd8452")
    reads.set_title("L3 reads")
    _from_zero(reads, max(m.l3_reads for m in results.values()))
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


def write_sweep_plot(sweep: dict[float, dict[str, ReplayMetrics]], path: Path) -> None:
    """Wasted reads, wasted tokens and hit rate against load, one line per policy."""
    runs = {speed: {name: [m] for name, m in results.items()} for speed, results in sweep.items()}
    _sweep_plot(runs, path, "stagefate replay: load sweep")


# ---------------------------------------------------------------------- several seeds

"""``{policy: [metrics of each seed]}``."""


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
    table = Table(title=f"stagefate replay: median [min–max] over seeds {_seed_list(seeds)}")
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
    return Spread.of([_share(m.hit_rate, bound) for m in runs]).show(rate=True)


def _figure_order(key: str) -> tuple[int, int, str]:
    """The replay's own field order first, then the engine block, then wasted reasons."""
    fields = list(ReplayMetrics.model_fields)
    head = key.split(".")[0]
    return (0 if "." not in key else 1 if head == "engine" else 2, fields.index(head), key)


def _seed_list(seeds: Sequence[int]) -> str:
    return ", ".join(map(str, seeds))


def spread_story(runs: SeedRuns, seeds: Sequence[int]) -> list[str]:
    """What the comparison shows over the seeds: each policy's medians, then every pair with
    live compared on a figure only where their ranges do not overlap."""
    spreads = {name: summary(policy_runs) for name, policy_runs in runs.items()}
    lines = [f"over {len(seeds)} IO-jitter seeds ({_seed_list(seeds)}): median [min–max]"]
    for name, s in spreads.items():
        lines.append(
            f"{name}: {s['l3_reads'].show()} L3 reads, {s['l3_reads_wasted'].show()} wasted, "
            f"hit rate {s['hit_rate'].show(rate=True)}"
        )
    if "live" in spreads:
        for other in spreads:
            if other != "live":
                lines += [
                    f"live vs {other}: {line}"
                    for line in compare("live", spreads["live"], other, spreads[other])
                ]
    return lines


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
    table = Table(title=f"load sweep: median [min–max] over seeds {_seed_list(seeds)}")
    titles = (*(title for title, _key in _SWEEP_FIGURES), f"hit / bound {bound.hit_rate:.3f}")
    for column in ("speed", "policy", *titles):
        table.add_column(column, justify="right")
    for speed, runs in sweep.items():
        for name, policy_runs in runs.items():
            spreads = summary(policy_runs)
            cells = [spreads[key].show(rate=key == "hit_rate") for _title, key in _SWEEP_FIGURES]
            table.add_row(f"{speed:g}", name, *cells, _share_spread(policy_runs, bound))
    return table


def write_spread_sweep_plot(sweep: Mapping[float, SeedRuns], path: Path) -> None:
    """The sweep plot with each policy's median line and its min–max band."""
    _sweep_plot(sweep, path, "stagefate replay: load sweep (median, band: min–max over the seeds)")


def _sweep_plot(sweep: Mapping[float, SeedRuns], path: Path, title: str) -> None:
    """Wasted reads, wasted tokens and hit rate against load: a median line per policy, and a
    min–max band where its runs differ."""
    plt = _pyplot()
    speeds = list(sweep)
    policies = list(next(iter(sweep.values())))
    figure, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels: tuple[tuple[str, Callable[[ReplayMetrics], float], bool], ...] = (
        ("wasted L3 reads", lambda m: m.l3_reads_wasted, True),
        ("wasted L3 tokens (millions)", lambda m: m.l3_read_tokens_wasted / 1e6, True),
        ("hit rate", lambda m: m.hit_rate, False),  # (its differences are small: no zero)
    )
    for axis, (heading, value, counts) in zip(axes, panels, strict=True):
        for index, name in enumerate(policies):
            spreads = [Spread.of([value(m) for m in sweep[s][name]]) for s in speeds]
            (line,) = axis.plot(
                speeds, [p.median for p in spreads], label=name, **_line_style(index)
            )
            if any(p.low != p.high for p in spreads):
                axis.fill_between(
                    speeds,
                    [p.low for p in spreads],
                    [p.high for p in spreads],
                    color=line.get_color(),
                    alpha=0.2,
                )
        if counts:
            _from_zero(
                axis, max(value(m) for runs in sweep.values() for r in runs.values() for m in r)
            )
        axis.set_title(heading)
        axis.set_xlabel("load (arrival speed ×)")
        axis.set_xscale("log", base=2)
        axis.set_xticks(speeds, [f"{s:g}" for s in speeds])
        axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
