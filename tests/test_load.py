"""Load found for the user: the engine's busy fraction and queue waits, ``--speed auto`` and
``--sweep`` in multiples of it, and bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.cli.replay import AUTO_SWEEP, _parse_speeds
from stagefate.registry import make_replay, policy_factories
from stagefate.sim.engine_model import Percentiles
from stagefate.sim.load_search import PARTING_STEP, find_parting_speed, find_speed
from stagefate.sim.replay import ReplayOptions
from stagefate.sim.trace import TraceRequest

from .test_arrivals import _conversation
from .test_replay import SMALL, siblings_trace


def test_queue_waits_are_nearest_rank_percentiles() -> None:
    waits = [float(ms) for ms in range(1, 101)]  # 1 … 100 ms
    assert Percentiles.of(waits) == Percentiles(p50=50.0, p99=99.0)
    assert Percentiles.of([7.0]) == Percentiles(p50=7.0, p99=7.0)
    assert Percentiles.of([]) == Percentiles(p50=0.0, p99=0.0)


def test_a_lone_request_waits_nothing_and_the_engine_is_busy_only_while_it_runs() -> None:
    alone = [TraceRequest(0, 0.0, 200, 16, (1,))]  # below the prefetch threshold: no L3 wait
    metrics = make_replay("live", alone, SMALL).run()
    assert metrics.engine.queue_wait_ms == Percentiles(p50=0.0, p99=0.0)
    assert metrics.engine.busy_fraction == 1.0  # it arrives at 0 and runs to the end


def test_busy_fraction_and_queue_waits_rise_with_the_load(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    siblings = siblings_trace(tmp_path_factory)
    light, heavy = (
        make_replay("live", siblings, SMALL.model_copy(update={"speed": speed})).run().engine
        for speed in (0.5, 8.0)
    )
    assert 0 < light.busy_fraction < heavy.busy_fraction <= 1
    assert light.queue_wait_ms.p50 <= light.queue_wait_ms.p99
    assert light.queue_wait_ms.p99 < heavy.queue_wait_ms.p99


def test_the_search_lands_near_its_target_on_a_small_trace(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    siblings = siblings_trace(tmp_path_factory)
    live = policy_factories(["live"])["live"]
    search = find_speed(live, siblings, SMALL, 0.6)
    assert search.reached and abs(search.busy_fraction - 0.6) <= 0.05
    again = make_replay("live", siblings, SMALL.model_copy(update={"speed": search.speed})).run()
    assert again.engine.busy_fraction == search.busy_fraction  # the prefix is the whole trace


def test_the_search_refuses_a_target_outside_the_unit_interval() -> None:
    live = policy_factories(["live"])["live"]
    with pytest.raises(ValueError, match=r"must lie in \(0, 1\]"):
        find_speed(live, [TraceRequest(0, 0.0, 512, 1, (1,))], ReplayOptions(), 1.5)
    with pytest.raises(ValueError, match="needs a trace with requests"):
        find_speed(live, [], ReplayOptions(), 0.9)


def test_a_sweep_takes_multiples_of_the_auto_speed() -> None:
    assert _parse_speeds("0.5a, 1a,2") == [(0.5, True), (1.0, True), (2.0, False)]
    with pytest.raises(ValueError, match=r"0\.5a,1a,2a"):
        _parse_speeds("2x")


def test_sweep_auto_is_the_span_from_the_busy_load_to_past_the_parting_one() -> None:
    assert _parse_speeds(" auto ") == AUTO_SWEEP


# two turns 10 ms apart after a long prompt, no wait for L3: slow enough, the second finds the
# first's pages; faster, it arrives while the first still runs and misses them
PARTING = SMALL.model_copy(
    update={"engine": SMALL.engine.model_copy(update={"prefetch_policy": "best_effort"})}
)


def test_the_parting_search_climbs_from_the_busy_load_to_the_first_miss() -> None:
    designs = policy_factories(["live", "blind"])
    found = find_parting_speed(designs, _conversation(), PARTING, 0.01)
    assert found.parted and found.evaluations == 3
    assert found.speed == pytest.approx(0.01 * PARTING_STEP**2)
    assert found.busy_shares == {"live": 1.0, "blind": 1.0}  # nothing to decide at the start
    assert min(found.shares.values()) < 0.99
    at_once = find_parting_speed(designs, _conversation(), PARTING, 0.05)
    assert at_once.parted and at_once.evaluations == 1 and at_once.speed == 0.05
    never = find_parting_speed(designs, _conversation(), PARTING, 0.001)
    assert not never.parted and never.evaluations == 6  # still at the bound at the fastest


def test_the_parting_search_stops_at_once_where_nothing_is_reusable() -> None:
    alone = [TraceRequest(0, 0.0, 512, 1, (1,)), TraceRequest(1, 5.0, 512, 1, (2,))]
    found = find_parting_speed(policy_factories(["live", "blind"]), alone, SMALL, 1.0)
    assert (found.parted, found.evaluations, found.speed) == (False, 0, 1.0)


def test_auto_on_an_empty_trace_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["replay", "--trace", str(empty), "--speed", "auto"]) == 2
    assert "holds no requests" in capsys.readouterr().err


@pytest.mark.slow
def test_auto_load_on_the_embedded_slice_lands_within_five_hundredths_of_the_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "auto.json"
    assert main(["replay", "--policy", "live", "--speed", "auto", "--json", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    busy = re.search(r"--speed auto: ([\d.]+)x keeps the engine busy ([\d.]+) of", printed)
    assert busy is not None and abs(float(busy.group(2)) - 0.9) <= 0.05
    assert "of the time (target 0.9) over the first 1,000" in printed
    # then the replay runs where the designs part: the busy load, or the one the search found
    climbed = re.search(r"they (?:part|still do) at ([\d.]+)x", printed)
    expected = float((climbed or busy).group(1))
    assert json.loads(out.read_text())["arguments"]["speed"] == expected


@pytest.mark.slow
def test_a_sweep_in_two_processes_gives_the_figures_of_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = []
    for jobs in ("1", "2"):
        out = tmp_path / f"sweep{jobs}.json"
        argv = ["replay", "--limit", "30", "--sweep", "0.3,0.6", "--jobs", jobs]
        assert main([*argv, "--json", str(out)]) == 0
        speeds = json.loads(out.read_text())["speeds"]
        # each replay said it finished, as it finished, with its figures
        printed = capsys.readouterr().out
        for speed, at in speeds.items():
            for name, metrics in at["policies"].items():
                reads = f"{metrics['l3_reads']:,} L3 reads"
                assert re.search(rf"  \d of \d: {name} ×{speed}: {reads}", printed)
        for at in speeds.values():
            for metrics in at["policies"].values():
                metrics.pop("wall_seconds")
        figures.append(speeds)
    assert figures[0] == figures[1]
    assert list(figures[0]) == ["0.3", "0.6"]
