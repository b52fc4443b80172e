"""``stagefate replay --seeds``: every figure as median [min–max] over IO-jitter seeds, and a
difference between designs told only where it holds beyond the spread."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.registry import make_replay
from stagefate.runner import replay_over_seeds
from stagefate.sim.replay import ReplayMetrics
from stagefate.sim.spread import Spread, compare, flatten, summary
from stagefate.sim.trace import TraceRequest, load_trace

from .test_replay import SMALL, siblings_rows

FAST = SMALL.model_copy(update={"speed": 4.0})
"""On the siblings trace at 4×, seeds 0, 2 and 3 differ (queue waits, the engine's steps)."""


@pytest.fixture(scope="module")
def siblings(tmp_path_factory: pytest.TempPathFactory) -> list[TraceRequest]:
    path = tmp_path_factory.mktemp("trace") / "siblings.jsonl"
    path.write_text("\n".join(siblings_rows()) + "\n")
    return load_trace(path)


def _runs(trace: list[TraceRequest], seeds: list[int]) -> list[ReplayMetrics]:
    return [make_replay("live", trace, FAST.model_copy(update={"seed": s})).run() for s in seeds]


def test_the_summary_is_the_median_min_and_max_of_the_runs(siblings: list[TraceRequest]) -> None:
    runs = _runs(siblings, [0, 2, 3])
    waits = {flatten(run)["engine.queue_wait_ms.p50"] for run in runs}
    assert len(waits) == 3, "the seeds must differ here"
    spreads = summary(runs)
    for key in ("engine.queue_wait_ms.p50", "engine.steps", "hit_rate"):
        values = sorted(flatten(run)[key] for run in runs)
        assert (spreads[key].low, spreads[key].median, spreads[key].high) == (
            values[0],
            values[1],
            values[2],
        )


@pytest.mark.slow  # spawned processes each import torch
def test_runs_in_processes_equal_the_same_runs_here(siblings: list[TraceRequest]) -> None:
    here = _runs(siblings, [0, 2])
    there = replay_over_seeds(siblings, ["live"], FAST, [0, 2], jobs=2)["live"]
    strip = {"wall_seconds"}
    assert [r.model_dump(exclude=strip) for r in there] == [
        r.model_dump(exclude=strip) for r in here
    ]


def test_the_story_refuses_a_comparison_whose_ranges_overlap() -> None:
    live = {key: Spread(0.5, 0.4, 0.6) for key in ("l3_reads", "l3_reads_wasted")}
    other = {key: Spread(0.55, 0.5, 0.7) for key in ("l3_reads", "l3_reads_wasted")}
    live |= {"hit_rate": Spread(0.8, 0.79, 0.81), "l3_read_tokens_wasted": Spread(5, 5, 5)}
    other |= {"hit_rate": Spread(0.7, 0.69, 0.71), "l3_read_tokens_wasted": Spread(6, 6, 6)}
    live["prefill_tokens_computed"] = other["prefill_tokens_computed"] = Spread(9, 8, 10)
    lines = compare("live", live, "blind", other)
    assert "L3 reads: no difference beyond the seed spread (live 0.5 [0.4–0.6], blind" in lines[1]
    assert lines[0].startswith("hit rate: live higher at every seed")
    assert lines[3].startswith("tokens read for nothing: blind higher at every seed")
    assert "no difference beyond the seed spread" in lines[4]


def test_one_seed_writes_todays_json(tmp_path: Path) -> None:
    plain, seeded = tmp_path / "plain.json", tmp_path / "seeded.json"
    base = ["replay", "--limit", "30", "--policy", "live", "--seed", "3"]
    assert main([*base, "--json", str(plain)]) == 0
    assert main([*base, "--seeds", "1", "--json", str(seeded)]) == 0
    one, other = json.loads(plain.read_text()), json.loads(seeded.read_text())
    for payload in (one, other):
        payload["policies"]["live"].pop("wall_seconds")
    assert one["policies"] == other["policies"] and one["bound"] == other["bound"]


def test_several_seeds_keep_each_run_and_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "seeds.json"
    argv = ["replay", "--limit", "30", "--policy", "live", "--seeds", "0,5", "--jobs", "1"]
    assert main([*argv, "--json", str(out)]) == 0
    # the bound's row, its line and (a light load: every run reaches it) the advice, as one run
    printed = capsys.readouterr().out
    assert re.search(r"hit_rate / bound 0\.\d{3} +│ +1\.000", printed)
    assert "the trace's bound:" in printed
    assert "every policy reaches the bound at 0.3x: this load leaves nothing to decide" in printed
    assert "1 policy × 2 seeds, in up to 1 process\n" in printed
    # each replay says it finished, with its figures (one process: in the order submitted)
    whole = json.loads(out.read_text())
    runs = whole["policies"]["live"]["seeds"]
    for done, seed in ((1, "0"), (2, "5")):
        figures = f"{runs[seed]['l3_reads']:,} L3 reads, {runs[seed]['l3_reads_wasted']:,} wasted"
        assert f"  {done} of 2: live ×0.3 seed {seed}: {figures}, hit rate" in printed
    assert printed.index(" 2 of 2: ") < printed.index("hit_rate / bound")
    assert list(whole["policies"]) == ["live"]
    payload = whole["policies"]["live"]
    assert sorted(payload["seeds"]) == ["0", "5"]
    hit = [payload["seeds"][s]["hit_rate"] for s in ("0", "5")]
    assert payload["summary"]["hit_rate"] == {
        "median": sum(hit) / 2,
        "min": min(hit),
        "max": max(hit),
    }


@pytest.mark.parametrize(
    ("seeds", "named"),
    [
        ("0", "a count must be at least 1"),
        ("", "is not a count or a list of seeds"),
        ("1,two", "is not a count or a list of seeds"),
        ("1,1", "seeds are distinct and not negative"),
    ],
)
def test_bad_seeds_exit_2_and_name_the_fix(
    seeds: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--limit", "5", "--seeds", seeds]) == 2
    out = capsys.readouterr().err
    assert named in out and "--seeds 0,1,2" in out


def test_seeds_refuse_a_log_and_a_plot_without_a_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--limit", "5", "--seeds", "2", "--log", str(tmp_path / "l")]) == 2
    assert main(["replay", "--limit", "5", "--seeds", "2", "--plot", str(tmp_path / "p.png")]) == 2
    out = capsys.readouterr().err
    assert "drop --seeds or --log" in out and "add --sweep" in out


@pytest.mark.slow
def test_a_sweep_over_seeds_plots_median_lines_with_bands(tmp_path: Path) -> None:
    trace = tmp_path / "siblings.jsonl"
    trace.write_text("\n".join(siblings_rows()) + "\n")
    plot, out = tmp_path / "sweep.png", tmp_path / "sweep.json"
    argv = ["replay", "--trace", str(trace), "--device-tokens", "40960", "--host-tokens", "65536"]
    argv += ["--policy", "live", "--sweep", "2,4", "--seeds", "0,2", "--plot", str(plot)]
    assert main([*argv, "--json", str(out)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    speeds = json.loads(out.read_text())["speeds"]
    assert sorted(speeds) == ["2", "4"]
    live = speeds["4"]["policies"]["live"]
    wasted = [live["seeds"][s]["l3_reads_wasted"] for s in ("0", "2")]
    assert live["summary"]["l3_reads_wasted"]["max"] == max(wasted)


def test_the_sweep_plot_keeps_its_title_above_its_panels(
    siblings: list[TraceRequest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure

    from stagefate.sim.plots import write_spread_sweep_plot

    titles: list[str] = []
    suptitle = Figure.suptitle

    def recorded(self: Figure, text: str, **kwargs: object) -> object:
        titles.append(text)
        return suptitle(self, text, **kwargs)

    monkeypatch.setattr(Figure, "suptitle", recorded)
    runs = _runs(siblings[:4], [0, 1])
    write_spread_sweep_plot({1.0: {"live": runs}, 2.0: {"live": runs}}, tmp_path / "p.png")
    assert titles == ["stagefate replay: load sweep (median, band: min–max over the seeds)"]
