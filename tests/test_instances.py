"""Many instances sharing one L3 behind a router: one instance is today's replay, the routers
route as they say, the books close per instance and in total, and bad input is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.registry import make_replay, policy_factories
from stagefate.sim.instances import InstancesMetrics, InstancesReplay
from stagefate.sim.replay import ReplayOptions
from stagefate.sim.trace import TraceRequest

from .test_replay import SMALL, assert_books_close, siblings_trace

LIVE = policy_factories(["live"])["live"]


def _figures(metrics: object) -> dict[str, object]:
    dumped = metrics.model_dump()  # type: ignore[attr-defined]
    dumped.pop("wall_seconds")
    return dumped  # type: ignore[no-any-return]


def test_one_instance_is_todays_replay(tmp_path_factory: pytest.TempPathFactory) -> None:
    siblings = siblings_trace(tmp_path_factory)
    alone = InstancesReplay(LIVE, siblings, SMALL, 1, "round_robin").run()
    today = _figures(make_replay("live", siblings, SMALL).run())
    assert _figures(alone.instances[0]) == today == _figures(alone.total)
    assert alone.cross_instance_read_tokens == 0


def _request(index: int, ms: float, blocks: list[int]) -> TraceRequest:
    return TraceRequest(index, ms, 512 * len(blocks), 4, tuple(blocks))


@pytest.mark.parametrize(("router", "landed"), [("cache_aware", [2, 0]), ("round_robin", [1, 1])])
def test_cache_aware_sends_a_returning_conversation_where_its_prefix_is(
    router: str, landed: list[int]
) -> None:
    first = [1, 2, 3, 4]
    trace = [_request(0, 0, first), _request(1, 1, [*first, 5])]
    metrics = InstancesReplay(LIVE, trace, SMALL, 2, router).run()
    assert [m.requests for m in metrics.instances] == landed


def returning_prompt() -> list[TraceRequest]:
    """A prompt, and a minute later (the first long finished) the same prompt extended."""
    first = [1, 2, 3, 4]
    return [_request(0, 0, first), _request(1, 60_000, [*first, 5])]


@pytest.mark.parametrize("policy", ["live", "blind"])
def test_a_prompt_another_instance_wrote_is_spliced_from_its_pages(policy: str) -> None:
    """Round-robin sends the return to the other instance: everything it splices is pages the
    first instance wrote; cache_aware sends it home, where the device holds it."""
    factory = policy_factories([policy])[policy]
    apart = InstancesReplay(factory, returning_prompt(), SMALL, 2, "round_robin").run()
    home, away = apart.instances
    assert home.tokens_spliced == 0 and away.tokens_spliced > 0
    assert apart.cross_instance_hits == away.tokens_spliced == apart.cross_instance_read_tokens
    together = InstancesReplay(factory, returning_prompt(), SMALL, 2, "cache_aware").run()
    assert together.total.l3_reads == 0 and together.cross_instance_hits == 0


def assert_instances_books_close(
    replay: InstancesReplay, metrics: InstancesMetrics, trace: list[TraceRequest]
) -> None:
    """Each instance's books close over the requests it was sent (test_replay's checks), and
    the total is their sum."""
    by_index = {request.index: request for request in trace}
    for instance, figures in zip(replay.replays, metrics.instances, strict=True):
        sent = [by_index[index] for index in instance.engine.finished_indices]
        assert figures.requests == len(sent)
        assert_books_close(instance, figures, sent)
    total = metrics.total
    assert total.requests == len(trace)
    for field in ("tokens_spliced", "l3_reads", "l3_reads_wasted", "prefill_tokens_computed"):
        assert getattr(total, field) == sum(getattr(m, field) for m in metrics.instances)


@pytest.mark.parametrize("router", ["round_robin", "random", "cache_aware"])
def test_books_close_per_instance_and_in_total_and_instances_read_each_others_pages(
    router: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    siblings = siblings_trace(tmp_path_factory)
    replay = InstancesReplay(LIVE, siblings, SMALL, 2, router)
    metrics = replay.run()
    assert_instances_books_close(replay, metrics, siblings)
    assert metrics.total.tokens_spliced > 0
    assert 0 <= metrics.cross_instance_read_tokens <= metrics.total.l3_read_tokens
    assert 0 <= metrics.cross_instance_hits <= metrics.cross_instance_read_tokens
    assert metrics.cross_instance_hits <= metrics.total.tokens_spliced


def test_the_same_seed_gives_the_same_json(tmp_path: Path) -> None:
    payloads = []
    for run in range(2):
        out = tmp_path / f"run{run}.json"
        argv = ["replay", "--limit", "40", "--instances", "2", "--router", "random"]
        assert main([*argv, "--policy", "live,blind", "--json", str(out)]) == 0
        payload = json.loads(out.read_text())["policies"]
        for name in ("live", "blind"):
            payload[name]["total"].pop("wall_seconds")
            for instance in payload[name]["instances"]:
                instance.pop("wall_seconds")
        payloads.append(payload)
    assert payloads[0] == payloads[1]
    assert list(payloads[0]) == ["live", "blind"]
    assert list(payloads[0]["live"]) == [
        "total",
        "instances",
        "cross_instance_read_tokens",
        "cross_instance_hits",
    ]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--policy", "live", "--tp", "2"], "does not combine with --tp yet"),
        (["--policy", "live", "--seeds", "2"], "drop --seeds and --sweep"),
        (["--policy", "live", "--plot", "p.png"], "does not combine with --plot yet"),
    ],
)
def test_what_instances_cannot_run_with_is_refused_with_the_fix(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--limit", "5", "--instances", "2", *argv]) == 2
    assert expected in " ".join(capsys.readouterr().err.split())


def test_an_instance_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one engine"):
        InstancesReplay(LIVE, [_request(0, 0, [1])], ReplayOptions(), 0, "round_robin")
    with pytest.raises(ValueError, match="unknown router 'nearest'"):
        InstancesReplay(LIVE, [_request(0, 0, [1])], ReplayOptions(), 2, "nearest")


@pytest.mark.slow
def test_auto_speed_gives_each_instance_one_engines_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from .test_replay import siblings_rows

    trace = tmp_path / "siblings.jsonl"
    trace.write_text("\n".join(siblings_rows()) + "\n")
    argv = ["replay", "--trace", str(trace), "--device-tokens", "40960", "--host-tokens", "65536"]
    assert main([*argv, "--policy", "live", "--instances", "2", "--utilization", "0.6"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    one = float(printed.split("--speed auto: ")[1].split("x")[0])
    both = float(printed.split("2 instances: ")[1].split("x")[0])
    assert both == pytest.approx(2 * one, rel=0.01)
