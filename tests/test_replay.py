"""Trace replay: the books close for both policies, the JSON keys are exact, bad traces fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.sim.replay import Replay, ReplayMetrics, ReplayOptions
from stagefate.sim.trace import TraceError, load_trace

KEYS = [
    "requests",
    "l3_reads",
    "l3_read_tokens",
    "l3_reads_wasted",
    "l3_read_tokens_wasted",
    "tokens_spliced",
    "tokens_trimmed",
    "prefill_tokens_computed",
    "declined_anchor_lost",
    "declined_device_covered",
    "hit_rate",
    "wall_seconds",
]
# A device pool of a few prompts, so that the replay evicts, re-reads from L3 and trims for real.
SMALL = ReplayOptions(device_tokens=40 * 1024, host_tokens=64 * 1024)


def _row(ms: int, blocks: list[int]) -> str:
    row = {"timestamp": ms, "input_length": 512 * len(blocks), "output_length": 8}
    return json.dumps({**row, "hash_ids": blocks})


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> list:  # type: ignore[type-arg]
    """A prompt that comes back after eviction, with siblings at once: reads, trims, waste."""
    shared, extra = list(range(1, 25)), list(range(500, 508))  # 24 + 8 blocks
    rows = [_row(0, shared + extra)]  # computed and written through to L3
    fresh = iter(range(1000, 100_000))
    for wave in range(4):
        start = 1000 + wave * 5000
        rows += [_row(start + i, [next(fresh) for _ in range(24)]) for i in range(6)]  # evicts
        rows += [_row(start + 3000 + i, [*shared, next(fresh)]) for i in range(3)]  # siblings
        rows.append(_row(start + 3005, shared + extra))  # its head is published meanwhile
    path = tmp_path_factory.mktemp("trace") / "siblings.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return load_trace(path)


def test_live_trims_where_blind_discards(trace: list) -> None:  # type: ignore[type-arg]
    live, blind = (Replay(policy, trace, SMALL).run() for policy in ("live", "blind"))
    assert live.tokens_trimmed > 0 and blind.tokens_trimmed == 0
    assert live.tokens_spliced > blind.tokens_spliced
    assert live.l3_read_tokens_wasted < blind.l3_read_tokens_wasted


@pytest.mark.parametrize("policy", ["live", "blind"])
def test_replay_books_close(trace: list, policy: str) -> None:  # type: ignore[type-arg]
    replay = Replay(policy, trace, SMALL)
    metrics = replay.run()
    assert metrics.requests == len(trace) and metrics.l3_reads > 0
    # every prompt token was found on the device, spliced from L3, or computed
    total = sum(request.input_length for request in trace)
    assert replay.input_tokens == total
    assert (
        total == replay.device_hit_tokens + metrics.tokens_spliced + metrics.prefill_tokens_computed
    )
    assert metrics.hit_rate == pytest.approx(1 - metrics.prefill_tokens_computed / total, abs=1e-6)
    # every read was spliced from or wasted, to the token; nothing is left in flight
    assert metrics.l3_read_tokens == metrics.tokens_spliced + metrics.l3_read_tokens_wasted
    pipe = replay.pipe
    assert pipe.host_pool.available() == pipe.host_pool.capacity
    assert pipe.tree.protected_size == 0
    assert pipe.device_pool.available() + pipe.tree.total_tokens() == pipe.device_pool.capacity
    pipe.tree.sanity_check()
    if policy == "live":
        assert pipe.is_idle() and pipe.reads_in_flight() == (0, 0)
        assert metrics.l3_reads == pipe.stats.filled + metrics.l3_reads_wasted


def test_replay_is_deterministic(trace: list) -> None:  # type: ignore[type-arg]
    first = Replay("live", trace, SMALL).run().model_dump()
    second = Replay("live", trace, SMALL).run().model_dump()
    first.pop("wall_seconds"), second.pop("wall_seconds")
    assert first == second


def test_cli_json_has_exactly_the_keys_for_one_and_all_policies(tmp_path: Path) -> None:
    for policy, expected in (("live", ["live"]), ("all", ["live", "blind"])):
        out = tmp_path / f"{policy}.json"
        assert main(["replay", "--limit", "40", "--policy", policy, "--json", str(out)]) == 0
        payload = json.loads(out.read_text())
        assert list(payload) == expected
        for metrics in payload.values():
            assert list(metrics) == KEYS
    assert list(ReplayMetrics.model_fields) == KEYS


def test_cli_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra: pip install '.[plot]'")
    out = tmp_path / "replay.png"
    assert main(["replay", "--limit", "30", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "missing field 'hash_ids'"),
        (
            '{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}',
            "1 hash_ids for input_length=1000; expected 2",
        ),
        ('{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}', "timestamp"),
    ],
)
def test_bad_trace_lines_name_file_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [7]}\n' + line + "\n"
    )
    with pytest.raises(TraceError, match=message) as caught:
        load_trace(path)
    assert f"{path}:2" in str(caught.value)


def test_cli_reports_a_missing_trace_and_a_pool_too_small(tmp_path: Path) -> None:
    assert main(["replay", "--trace", str(tmp_path / "nope.jsonl")]) == 2
    assert main(["replay", "--limit", "5", "--device-tokens", "1024"]) == 2
