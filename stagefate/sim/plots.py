"""The replay's figures as PNGs (matplotlib, the ``plot`` extra): one run, a sweep, over seeds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..output_files import atomic_output
from .replay import ReplayMetrics
from .spread import SeedRuns, Spread


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
    _save(figure, path)


def write_sweep_plot(sweep: dict[float, dict[str, ReplayMetrics]], path: Path) -> None:
    """Wasted reads, wasted tokens and hit rate against load, one line per policy."""
    runs = {speed: {name: [m] for name, m in results.items()} for speed, results in sweep.items()}
    _sweep_plot(runs, path, "stagefate replay: load sweep")


# ---------------------------------------------------------------------- several seeds

"""``{policy: [metrics of each seed]}``."""


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
    _save(figure, path)


def _save(figure: Any, path: Path) -> None:
    """The figure as a PNG at ``path``, written whole or not at all; then let go."""
    with atomic_output(path, binary=True) as handle:
        figure.savefig(handle, dpi=110, format="png")
    _pyplot().close(figure)
