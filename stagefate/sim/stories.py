"""The replay's figures in sentences: what each design did and why, and where the bound stands."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..statemachine.stats import Stats
from .blind import BlindPolicy
from .bound import TraceBound
from .instances import InstancesMetrics
from .live import LivePolicy
from .policy import Policy
from .replay import ReplayMetrics
from .spread import SeedRuns, compare, summary
from .tables import REASONS, seed_list, share_of_bound

AT_THE_BOUND = 0.995
"""A hit rate within half a percent of the bound is at it: nothing was left to reuse."""


def bound_story(
    by_speed: Mapping[float, Mapping[str, ReplayMetrics | Sequence[ReplayMetrics]]],
    bound: TraceBound,
) -> list[str]:
    """The bound in words, and, at each speed where every policy reaches it (under every seed,
    given a policy's runs over the seeds), what to do."""
    stored = (
        f" or the L3 held before the run ({bound.store_tokens:,} of them)"
        if bound.store_tokens
        else ""
    )
    lines = [
        f"the trace's bound: {bound.reusable_tokens:,} of {bound.prompt_tokens:,} prompt tokens "
        f"are in pages an earlier request wrote{stored} (hit rate {bound.hit_rate:.3f} with "
        "infinite device memory and L3)"
    ]
    for speed, results in by_speed.items():
        runs = [
            run
            for each in results.values()
            for run in ([each] if isinstance(each, ReplayMetrics) else each)
        ]
        if all(share_of_bound(m.hit_rate, bound) >= AT_THE_BOUND for m in runs):
            lines.append(
                f"every policy reaches the bound at {speed:g}x: this load leaves nothing to "
                "decide (every reusable page is served in time); raise it with --speed (e.g. "
                f"--speed {speed * 2:g}) or --sweep {speed:g},{speed * 2:g},{speed * 4:g} to "
                "compare the designs where they differ"
            )
    return lines


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


def in_short(
    results: Mapping[str, ReplayMetrics],
    bound: TraceBound,
    heading: str,
    releases: Mapping[str, str] | None = None,
) -> list[str]:
    """The first lines of a one-speed replay's report (``heading`` names the run): each
    policy's hit rate against the trace's bound, its L3 reads and those wasted, the prompt
    tokens it computed; then how each other policy differs from the first."""
    releases = releases or {}

    def label(name: str) -> str:
        return f"{name} (SGLang {releases[name]})" if name in releases else name

    lines = [f"in short: {heading}; the trace's bound is a hit rate of {bound.hit_rate:.3f}"]
    for name, m in results.items():
        lines.append(
            f"  {label(name)}: hit rate {m.hit_rate:.3f}, {counted(m.l3_reads, 'L3 read')} "
            f"({m.l3_reads_wasted:,} wasted), {m.prefill_tokens_computed:,} prompt tokens computed"
        )
    first, *others = results
    base = results[first]
    for name in others:
        m = results[name]
        more = m.prefill_tokens_computed - base.prefill_tokens_computed
        wasted = m.l3_reads_wasted - base.l3_reads_wasted
        if not more and not wasted:
            lines.append(f"  {name} computes and wastes what {first} does")
            continue
        computes = (
            f"computes {abs(more):,} {'more' if more > 0 else 'fewer'} prompt tokens"
            if more
            else "computes as many prompt tokens"
        )
        wastes = (
            f"wastes {counted(abs(wasted), 'more L3 read' if wasted > 0 else 'fewer L3 read')}"
            if wasted
            else "wastes as many L3 reads"
        )
        lines.append(f"  {name} {computes} and {wastes} than {first}")
    lines.append("the figures, and why each policy read what it read, follow")
    return lines


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
        if m.l3_damage:
            lines.append(f"  L3: {m.l3_damage}")
        biggest = sorted(m.wasted_by_reason.items(), key=lambda kv: -kv[1].tokens)
        for reason, wasted in biggest[:3]:
            what = f"{counted(wasted.reads, 'read')}, " if wasted.reads else ""
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


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 read``, ``2 reads``, ``2 processes``, ``2 policies`` (``plural`` where it is not the
    noun and an s): a line reads right for any count."""
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {plural or noun + ('es' if noun.endswith('s') else 's')}"


def _compare(lm: ReplayMetrics, bm: ReplayMetrics, stats: Stats, blind: BlindPolicy) -> list[str]:
    """What #36834 (and stagefate's own decisions) bought over the code just before it."""
    lines = []
    shrunk = bm.wasted_by_reason.get("shrunk")
    if shrunk is not None:
        lines.append(
            f"blind discarded {counted(shrunk.reads, 'span')} whose splice base was evicted while "
            f"the fetch was unpinned; live pins the anchor when it issues, or declines before "
            f"reading ({lm.declined_anchor_lost:,} declined_anchor_lost)"
        )
    not_trimmed = bm.wasted_by_reason.get("not_trimmed")
    if not_trimmed is not None:
        lines.append(
            f"blind discarded {counted(not_trimmed.reads, 'span')} whose head a sibling had "
            f"published; live trims such a head and splices the tail (it trimmed "
            f"{lm.tokens_trimmed:,} tokens)"
        )
    covered = bm.wasted_by_reason.get("device_covered")
    if covered is not None:
        lines.append(
            f"blind read {counted(covered.reads, 'span')} that a sibling brought to the device "
            f"first; live's commits found {counted(stats.declined_inflight, 'span')} a sibling was "
            f"already reading and waited for it instead (declined_inflight), and "
            f"{lm.declined_device_covered:,} already on the device (declined_device_covered)"
        )
    full = blind.ended_unread.get("host_capacity", 0)
    if full:
        lines.append(
            f"blind dropped {counted(full, 'hit')} at the commit for want of bounce room; live "
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
        f"{name} (SGLang {version}'s own pipeline) wasted {counted(sm.l3_reads_wasted, 'read')} "
        f"against live's {lm.l3_reads_wasted:,}"
        + (
            f"; {covered.reads:,} were spans a sibling brought to the device first: SGLang has "
            f"no in-flight dedup, live's commits waited for "
            f"{counted(stats.declined_inflight, 'sibling read')} instead"
            if covered is not None
            else ""
        ),
        f"hit rate: live {lm.hit_rate:.3f}, {name} {sm.hit_rate:.3f}; prompt tokens computed: "
        f"live {lm.prefill_tokens_computed:,}, {name} {sm.prefill_tokens_computed:,}",
    ]
    return lines


def spread_story(runs: SeedRuns, seeds: Sequence[int]) -> list[str]:
    """What the comparison shows over the seeds: each policy's medians, then every pair with
    live compared on a figure only where their ranges do not overlap."""
    spreads = {name: summary(policy_runs) for name, policy_runs in runs.items()}
    lines = [f"over {len(seeds)} IO-jitter seeds ({seed_list(seeds)}): median [min–max]"]
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
