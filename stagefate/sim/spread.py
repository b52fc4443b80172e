"""The seed spread of replay figures: the same replay under several IO-jitter seeds.

The replay's only randomness is the seeded jitter of each IO's time (up to ±20 %). A figure from
one seed can differ from another seed's by as much as two designs differ, so with ``--seeds`` each
policy runs once per seed and every figure is reported as its median and its min–max. Two
policies are compared on a figure only where their ranges do not overlap.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .replay import ReplayMetrics

SeedRuns = Mapping[str, Sequence[ReplayMetrics]]
"""Each policy's runs, one per seed in the order of the seeds."""


@dataclass(frozen=True)
class Spread:
    """A figure over the seeds: its median, min and max."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def overlaps(self, other: Spread) -> bool:
        return self.low <= other.high and other.low <= self.high

    def show(self, rate: bool = False) -> str:
        """``median [min–max]`` (just the median when the seeds agree to the digits shown)."""

        def fmt(value: float) -> str:
            if rate:
                return f"{value:.3f}"
            return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"

        low, high = fmt(self.low), fmt(self.high)
        if low == high:  # every seed agrees, to the digits shown
            return fmt(self.median)
        return f"{fmt(self.median)} [{low}–{high}]"


def flatten(metrics: ReplayMetrics) -> dict[str, float]:
    """Every numeric figure of a run, nested blocks as ``engine.steps`` and
    ``wasted_by_reason.shrunk.reads``."""
    flat: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        elif isinstance(value, bool) or not isinstance(value, int | float):
            return
        else:
            flat[prefix] = value

    walk("", metrics.model_dump())
    return flat


def summary(runs: Sequence[ReplayMetrics]) -> dict[str, Spread]:
    """``{figure: Spread}`` over the runs of one policy (a figure missing from a run, such as a
    wasted reason it never saw, counts as 0 there)."""
    flats = [flatten(run) for run in runs]
    keys = sorted({key for flat in flats for key in flat})
    return {key: Spread.of([flat.get(key, 0) for flat in flats]) for key in keys}


def summary_json(spreads: Mapping[str, Spread]) -> dict[str, dict[str, float]]:
    return {key: {"median": s.median, "min": s.low, "max": s.high} for key, s in spreads.items()}


COMPARED = (
    ("hit_rate", "hit rate", True),
    ("l3_reads", "L3 reads", False),
    ("l3_reads_wasted", "wasted L3 reads", False),
    ("l3_read_tokens_wasted", "tokens read for nothing", False),
    ("prefill_tokens_computed", "prompt tokens computed", False),
)
"""The figures the story compares between policies: (key, words, is a rate)."""


def compare(
    first: str, first_runs: Mapping[str, Spread], second: str, second_runs: Mapping[str, Spread]
) -> list[str]:
    """One line per compared figure: the difference where the two ranges do not overlap, and
    "no difference beyond the seed spread" where they do."""
    lines = []
    for key, words, rate in COMPARED:
        a, b = first_runs[key], second_runs[key]
        shown = f"{first} {a.show(rate)}, {second} {b.show(rate)}"
        if a.overlaps(b):
            lines.append(f"{words}: no difference beyond the seed spread ({shown})")
        else:
            more = first if a.median > b.median else second
            lines.append(f"{words}: {more} higher at every seed ({shown})")
    return lines
