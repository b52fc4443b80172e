"""Trace replay on the continuous-batching engine: books, memory, retraction, the seed's failure,
determinism, the JSON keys, the sweep, and bad input."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.registry import make_replay, policies_for_all
from stagefate.sim.blind import BlindPolicy
from stagefate.sim.costs import CostModel
from stagefate.sim.engine_model import EngineOptions
from stagefate.sim.live import LivePolicy
from stagefate.sim.replay import Replay, ReplayMetrics, ReplayOptions
from stagefate.sim.stories import story
from stagefate.sim.tables import metric_rows
from stagefate.sim.trace import TraceError, TraceRequest, load_trace

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
    "wasted_by_reason",
    "engine",
    "arrivals",
    "prefetches",
    "l3_damage",
]
PREFETCH_KEYS = ["issued", "retried", "timed_out", "hit", "declined"]
ENGINE_KEYS = [
    "steps",
    "prefill_tokens",
    "decode_tokens",
    "retractions",
    "evicted_tokens",
    "peak_running",
    "simulated_seconds",
    "busy_fraction",
    "queue_wait_ms",
]
ENVELOPE = ["stagefate", "trace", "arguments", "options", "bound"]
"""What every ``replay --json`` file starts with, whatever its mode (then its body)."""
# A device pool of a few prompts, so that the replay evicts, re-reads from L3 and trims for real.
SMALL = ReplayOptions(device_tokens=40 * 1024, host_tokens=64 * 1024, speed=1.0)
POLICIES = [("live", True), ("live", False), ("blind", True)]


def _row(ms: float, blocks: list[int], output: int = 8) -> str:
    row = {"timestamp": ms, "input_length": 512 * len(blocks), "output_length": output}
    return json.dumps({**row, "hash_ids": blocks})


def _write(tmp_path_factory: pytest.TempPathFactory, name: str, rows: list[str]) -> list:  # type: ignore[type-arg]
    path = tmp_path_factory.mktemp("trace") / name
    path.write_text("\n".join(rows) + "\n")
    return load_trace(path)


@pytest.fixture(scope="module")
def siblings(tmp_path_factory: pytest.TempPathFactory) -> list[TraceRequest]:
    return siblings_trace(tmp_path_factory)


def siblings_trace(tmp_path_factory: pytest.TempPathFactory) -> list[TraceRequest]:
    return _write(tmp_path_factory, "siblings.jsonl", siblings_rows())


def siblings_rows() -> list[str]:
    """A prompt that comes back after eviction, with siblings at once: reads, trims, waste
    (replayed with :data:`SMALL`'s pools)."""
    shared, extra = list(range(1, 25)), list(range(500, 508))  # 24 + 8 blocks
    rows = [_row(0, shared + extra)]  # computed and written through to L3
    fresh = iter(range(1000, 100_000))
    for wave in range(4):
        start = 10_000 + wave * 20_000
        rows += [_row(start + i, [next(fresh) for _ in range(24)]) for i in range(6)]  # evicts
        rows += [_row(start + 12_000 + i, [*shared, next(fresh)]) for i in range(3)]  # siblings
        rows.append(_row(start + 12_005, shared + extra))  # its head is published meanwhile
    return rows


def assert_books_close(replay: Replay, metrics: ReplayMetrics, trace: list[TraceRequest]) -> None:
    """Every prompt token is a device hit, a splice or computed; every read token is spliced or
    wasted, and the reasons add up; the device pool holds exactly the tree; nothing is held."""
    books = replay.engine.books
    assert replay.engine.finished == len(trace), "every request finished"
    assert books.spliced_tokens == metrics.tokens_spliced
    assert books.input_tokens == (
        books.device_hit_tokens + metrics.tokens_spliced + metrics.prefill_tokens_computed
    )
    assert books.input_tokens >= sum(request.input_length for request in trace)
    assert metrics.hit_rate == pytest.approx(
        1 - metrics.prefill_tokens_computed / books.input_tokens, abs=1e-6
    )
    assert metrics.l3_read_tokens == metrics.tokens_spliced + metrics.l3_read_tokens_wasted
    reasons = metrics.wasted_by_reason.values()
    assert sum(w.reads for w in reasons) == metrics.l3_reads_wasted
    assert sum(w.tokens for w in reasons) == metrics.l3_read_tokens_wasted
    # every output token but the first (sampled by the prefill) is one decode; a retracted
    # request's re-run samples one more at its prefill, so no output is lost or made twice
    engine_metrics = metrics.engine
    decoded = engine_metrics.decode_tokens + engine_metrics.retractions
    assert decoded == sum(max(r.output_length - 1, 0) for r in trace)
    policy, engine = replay.policy, replay.engine
    assert not engine.busy() and not engine.running
    tree, pool = policy.tree, policy.device_pool
    assert tree.protected_size == 0
    assert pool.available() + tree.total_tokens() == pool.capacity
    tree.sanity_check()
    if isinstance(policy, LivePolicy | BlindPolicy):
        pipe = policy.pipe
        assert pipe.host_pool.available() == pipe.host_pool.capacity
    if isinstance(policy, LivePolicy):
        assert pipe.is_idle() and pipe.reads_in_flight() == (0, 0)
        assert metrics.l3_reads == pipe.spliced_from_reads() + metrics.l3_reads_wasted
    if policy.name == "sglang":  # SGLang's own books: no prefetch, hold, bounce or write left
        driver, cache = policy.driver, policy.cache  # type: ignore[attr-defined]
        assert driver.pipeline_host_available() == driver.baseline_host
        assert not cache.ongoing_prefetch and cache.buffer_pipeline.is_idle()
        assert not policy._unsettled  # type: ignore[attr-defined]


@pytest.mark.parametrize(("policy", "dedup"), POLICIES)
def test_books_close_and_memory_is_conserved(
    siblings: list[TraceRequest], policy: str, dedup: bool
) -> None:
    replay = make_replay(policy, siblings, SMALL.model_copy(update={"dedup_inflight": dedup}))
    metrics = replay.run()
    assert metrics.requests == len(siblings) and metrics.l3_reads > 0
    assert metrics.engine.evicted_tokens > 0
    assert_books_close(replay, metrics, siblings)


def test_live_reads_a_shared_head_once_where_blind_reads_it_per_request(
    siblings: list[TraceRequest],
) -> None:
    live, blind = (make_replay(policy, siblings, SMALL).run() for policy in ("live", "blind"))
    assert live.l3_read_tokens < blind.l3_read_tokens
    assert live.l3_read_tokens_wasted == 0 < blind.l3_read_tokens_wasted
    assert live.tokens_spliced > blind.tokens_spliced and live.hit_rate > blind.hit_rate


@pytest.fixture(scope="module")
def decode_heavy(tmp_path_factory: pytest.TempPathFactory) -> list[TraceRequest]:
    """Eight prompts at once whose outputs outgrow the pool together."""
    rows = [_row(i, [7000 + 2 * i, 7001 + 2 * i], output=3000) for i in range(8)]
    return _write(tmp_path_factory, "decode.jsonl", rows)


@pytest.mark.parametrize("policy", ["live", "blind"])
def test_decode_growth_retracts_and_every_request_finishes(
    decode_heavy: list[TraceRequest], policy: str
) -> None:
    options = ReplayOptions(device_tokens=16 * 1024, host_tokens=16 * 1024)
    replay = make_replay(policy, decode_heavy, options)
    metrics = replay.run()
    assert metrics.engine.retractions > 0
    assert metrics.engine.prefill_tokens > sum(r.input_length for r in decode_heavy)  # re-runs
    assert_books_close(replay, metrics, decode_heavy)


@pytest.fixture(scope="module")
def anchor_evicted(tmp_path_factory: pytest.TempPathFactory) -> list[TraceRequest]:
    """B's prefix P is on the device when it issues its prefetch of Q; while its existence query
    is in flight, short requests (below the prefetch threshold, so admitted at once) fill the
    pool and evict every unlocked leaf."""
    p, q = [1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11]
    # P + Q computed, written through to L3 (after its full-miss retries: 15 s leaves room for
    # the default budget at 500 ms a query)
    rows = [_row(0, p + q, output=1)]
    rows += [_row(15_000 + i, [100 + 5 * i + j for j in range(5)], 1) for i in range(3)]  # evict
    rows.append(_row(30_000, [*p, 200], output=1))  # P on the device again, Q not
    rows.append(_row(40_000, p + q, output=1))  # B
    rows += [_row(40_001 + i, [300 + 5 * i + j for j in range(5)], 1) for i in range(5)]
    return _write(tmp_path_factory, "anchor.jsonl", rows)


def test_an_anchor_evicted_during_the_read_is_shrunk_for_blind_and_pinned_for_live(
    anchor_evicted: list[TraceRequest],
) -> None:
    options = ReplayOptions(
        device_tokens=12 * 1024,
        host_tokens=16 * 1024,
        prefetch_threshold=3072,
        speed=1.0,
        costs=CostModel(exists_latency_ms=500),
        engine=EngineOptions(prefetch_policy="wait_complete"),
    )
    live, blind = (make_replay(policy, anchor_evicted, options) for policy in ("live", "blind"))
    live_metrics, blind_metrics = live.run(), blind.run()
    assert blind_metrics.wasted_by_reason["shrunk"].reads == 1
    assert blind_metrics.tokens_spliced == 0
    assert "shrunk" not in live_metrics.wasted_by_reason
    assert live_metrics.l3_reads_wasted == 0 and live_metrics.tokens_spliced == 3520
    assert isinstance(live.policy, LivePolicy)
    assert live.policy.pipe.stats.locked >= 1  # B's anchor was pinned at issue
    for replay, metrics in ((live, live_metrics), (blind, blind_metrics)):
        assert_books_close(replay, metrics, anchor_evicted)


def test_same_seed_same_json(siblings: list[TraceRequest]) -> None:
    first = make_replay("live", siblings, SMALL).run().model_dump()
    second = make_replay("live", siblings, SMALL).run().model_dump()
    first.pop("wall_seconds"), second.pop("wall_seconds")
    assert first == second


ENGINE_VARIANTS = (
    EngineOptions(schedule="lpm"),
    EngineOptions(prefetch_policy="best_effort"),
    EngineOptions(prefetch_policy="wait_complete"),
)
"""Scheduling and prefetch-wait settings besides the defaults, for the books-close tests."""


def test_lpm_and_every_prefetch_policy_close_their_books(siblings: list[TraceRequest]) -> None:
    for engine in ENGINE_VARIANTS:
        replay = make_replay("live", siblings, SMALL.model_copy(update={"engine": engine}))
        assert_books_close(replay, replay.run(), siblings)


@pytest.mark.slow
def test_cli_json_has_exactly_the_keys_for_one_and_all_policies(tmp_path: Path) -> None:
    for policy, expected in (("live", ["live"]), ("all", policies_for_all()[0])):
        out = tmp_path / f"{policy}.json"
        assert main(["replay", "--limit", "40", "--policy", policy, "--json", str(out)]) == 0
        payload = json.loads(out.read_text())
        assert list(payload) == [*ENVELOPE, "policies"]
        bound_keys = ["hit_rate", "reusable_tokens", "prompt_tokens", "store_tokens"]
        assert list(payload["bound"]) == bound_keys
        assert list(payload["policies"]) == expected
        for metrics in payload["policies"].values():
            assert list(metrics) == KEYS
            assert list(metrics["engine"]) == ENGINE_KEYS
            assert list(metrics["prefetches"]) == PREFETCH_KEYS
            for wasted in metrics["wasted_by_reason"].values():
                assert list(wasted) == ["reads", "tokens"]
    assert list(ReplayMetrics.model_fields) == KEYS


def test_the_json_says_which_run_it_came_from_and_notes_a_trace_out_of_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, out = tmp_path / "unsorted.jsonl", tmp_path / "run.json"
    rows = [_row(ms, [ms, ms + 1]) for ms in (0, 3000, 1000, 2000)]  # line 2 before 3 and 4
    trace.write_text("\n".join(rows) + "\n")
    argv = ["replay", "--trace", str(trace), "--policy", "live", "--speed", "2", "--limit", "3"]
    assert main([*argv, "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert list(payload) == [*ENVELOPE, "policies"]
    assert payload["stagefate"] == importlib.metadata.version("stagefate")
    assert payload["trace"] == {"source": str(trace), "requests": 3, "out_of_order": 2}
    assert payload["arguments"]["speed"] == 2 and payload["arguments"]["limit"] == 3
    assert payload["options"]["speed"] == 2 and payload["options"]["page_size"] == 64
    printed = " ".join(capsys.readouterr().out.split())
    assert "is not in time order (2 of the 3 requests replayed are not at their arrival rank" in (
        printed
    )
    assert "(--limit 3 took the earliest arrivals)" in printed  # 0, 1000 and 2000 ms
    assert main(["replay", "--trace", str(trace), "--speed", "2", "--policy", "live"]) == 0
    assert "note: " in capsys.readouterr().out
    in_order = tmp_path / "sorted.jsonl"
    in_order.write_text("\n".join(sorted(rows, key=lambda row: json.loads(row)["timestamp"])))
    assert main(["replay", "--trace", str(in_order), "--speed", "2", "--policy", "live"]) == 0
    assert "note: " not in capsys.readouterr().out


def test_cli_all_without_sglang_runs_live_and_blind_and_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.setenv("STAGEFATE_TARGETS", "/nonexistent")  # no release environments either
    out = tmp_path / "all.json"
    assert main(["replay", "--limit", "20", "--json", str(out)]) == 0
    assert list(json.loads(out.read_text())["policies"]) == ["live", "blind"]
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "--policy all: live and blind only" in printed and "make sglang" in printed


@pytest.mark.slow
def test_cli_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra: pip install '.[plot]'")
    out = tmp_path / "replay.png"
    assert main(["replay", "--limit", "30", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_cli_sweep_writes_json_and_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra: pip install '.[plot]'")
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    args = ["replay", "--limit", "30", "--sweep", "2,0.5", "--json", str(out), "--plot", str(png)]
    assert main(args) == 0
    payload = json.loads(out.read_text())
    assert list(payload) == [*ENVELOPE, "speeds"]
    assert list(payload["speeds"]) == ["0.5", "2"]
    expected = policies_for_all()[0]
    assert all(list(at["policies"]) == expected for at in payload["speeds"].values())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
        (
            '{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}',
            "input_length must be an int from 1 to",
        ),
        ('{"timestamp": NaN, "input_length": 1, "output_length": 1, "hash_ids": [1]}', "finite"),
        (
            '{"timestamp": Infinity, "input_length": 1, "output_length": 1, "hash_ids": [1]}',
            "finite",
        ),
        ('{"timestamp": true, "input_length": 1, "output_length": 1, "hash_ids": [1]}', "finite"),
        (
            '{"timestamp": 0, "input_length": true, "output_length": 1, "hash_ids": [1]}',
            "input_length must be an int",
        ),
        (
            '{"timestamp": 0, "input_length": 1e20, "output_length": 1, "hash_ids": [1]}',
            "input_length must be an int",
        ),
        (
            '{"timestamp": 0, "input_length": 100000000000000000000, "output_length": 1, '
            '"hash_ids": [1]}',
            "no model's context is longer",
        ),
        (
            '{"timestamp": 0, "input_length": 1, "output_length": 1, '
            '"hash_ids": [9007199254740993]}',
            "hash_ids must be a list of ints from 0 to 2\\*\\*53",
        ),
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


def test_a_binary_trace_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(TraceError, match=f"trace {path}: not a text file"):
        load_trace(path)


def test_limit_takes_the_earliest_arrivals_of_a_trace_out_of_order(tmp_path: Path) -> None:
    path = tmp_path / "unsorted.jsonl"
    rows = [(3000, 7), (1000, 8), (2000, 9)]
    path.write_text(
        "".join(
            f'{{"timestamp": {ms}, "input_length": 1, "output_length": 1, "hash_ids": [{h}]}}\n'
            for ms, h in rows
        )
    )
    assert [r.hash_ids for r in load_trace(path, limit=2)] == [(8,), (9,)]


def test_cli_bad_input_is_a_clear_error_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_costs = tmp_path / "costs.yaml"
    bad_costs.write_text("gpu_memory_gb: -1\n")
    cases = [
        (["--trace", str(tmp_path / "nope.jsonl")], "does not exist"),
        (["--trace", str(tmp_path)], "is a folder; pass --trace PATH to a .jsonl file"),
        (["--limit", "5", "--device-tokens", "1024"], "--device-tokens"),
        (["--limit", "5", "--sweep", "1,fast"], "--sweep takes speeds"),
        (["--limit", "5", "--costs", str(bad_costs)], "gpu_memory_gb"),
        (["--limit", "5", "--costs", str(tmp_path / "none.yaml")], "does not exist"),
    ]
    for args, message in cases:
        assert main(["replay", *args]) == 2, args
        printed = "".join(capsys.readouterr().err.split())  # rich wraps long lines
        assert "".join(message.split()) in printed, args
    with pytest.raises(SystemExit) as exited:
        main(["replay", "--model", "gpt-5"])
    assert exited.value.code == 2


def test_plots_start_counts_at_zero_and_keep_equal_lines_visible() -> None:
    """A panel where nothing was wasted once spanned -0.04 to 0.04, and two policies with equal
    figures drew one line over the other."""
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra: pip install '.[plot]'")
    from stagefate.sim.plots import _from_zero, _line_style, _pyplot

    plt = _pyplot()
    figure, (flat, counts) = plt.subplots(1, 2)
    flat.plot([1, 2], [0, 0])
    _from_zero(flat, 0)
    counts.plot([1, 2], [3, 5])
    _from_zero(counts, 5)
    assert flat.get_ylim() == (0, 1) and counts.get_ylim()[0] == 0 < 5 <= counts.get_ylim()[1]
    plt.close(figure)
    styles = [_line_style(i) for i in range(4)]
    assert len({(s["marker"], s["linestyle"]) for s in styles}) == 4
    assert [s["markersize"] for s in styles] == sorted(
        (s["markersize"] for s in styles), reverse=True
    )


@pytest.mark.parametrize(
    "policy", ["live", "blind", pytest.param("sglang", marks=pytest.mark.slow)]
)
def test_each_policy_says_why_it_read_what_it_read(
    policy: str, request: pytest.FixtureRequest
) -> None:
    """The ``prefetches`` block (issue 41): one issue per request at arrival, the policy's own
    retries, admissions that spliced, waits let go, and what it declined and why."""
    if policy == "sglang":
        request.getfixturevalue("sglang")  # skips where SGLang is not installed
    trace = load_trace(Path(__file__).parent / "data" / "multiturn_40.jsonl")
    # a device pool of two long conversations: turns come back to find their prefix in L3
    options = ReplayOptions(device_tokens=80 * 1024, speed=4.0, prefetch_threshold=1024)
    replay = make_replay(policy, trace, options)
    metrics = replay.run()
    counts = metrics.prefetches
    assert counts.issued == metrics.requests == len(trace)
    assert 0 < counts.hit <= metrics.l3_reads
    assert counts.declined and all(reason and n > 0 for reason, n in counts.declined.items())
    if policy == "live":  # every issue call is one of the pipeline's attempts
        stats = replay.policy.pipe.stats  # type: ignore[attr-defined]
        assert stats.attempts == counts.issued + counts.retried
        assert counts.declined["declined_too_short"] == stats.declined_too_short > 0
    rows = {row[0]: row[1] for row in metric_rows({policy: metrics})}
    assert rows["prefetches.issued"] == f"{len(trace):,}"
    assert all(f"prefetches.declined.{reason}" in rows for reason in counts.declined)


@pytest.mark.slow  # about 7 s: a replay over a file L3, twice
def test_a_file_l3_with_damaged_pages_heals_and_the_replay_says_so(
    siblings: list[TraceRequest], tmp_path: Path
) -> None:
    """Pages cut short (writers killed mid-write, say) are deleted when read, stored again by
    the next write-through, and named in the figures."""
    options = SMALL.model_copy(update={"storage": f"file:{tmp_path}"})
    make_replay("live", siblings, options).run()  # fills the store
    pages = [p for p in tmp_path.glob("*/*") if not p.name.startswith(".")]
    whole = pages[0].stat().st_size
    for page in pages:
        page.write_bytes(page.read_bytes()[:-5])
    metrics = make_replay("live", siblings, options).run()
    found = int(metrics.l3_damage.split(" ")[0])
    assert found > 0 and metrics.l3_damage == f"{found} pages damaged, removed, rewritten"
    assert sum(p.stat().st_size == whole for p in pages) == found  # each one read is whole again
    assert f"  L3: {metrics.l3_damage}" in story({"live": metrics}, 1.0)


@pytest.mark.slow  # about 13 s: two replays over a file L3
def test_the_bound_counts_what_a_persistent_l3_held_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file L3 an earlier run filled serves pages no request of this run wrote: the bound
    says so, and no policy is reported above it."""
    argv = ["replay", "--limit", "30", "--policy", "live", "--storage", f"file:{tmp_path}"]
    outs = []
    for run in ("first", "second"):
        assert main([*argv, "--json", str(tmp_path / f"{run}.json")]) == 0
        outs.append(" ".join(capsys.readouterr().out.split()))
    first, second = (json.loads((tmp_path / f"{r}.json").read_text()) for r in ("first", "second"))
    assert first["bound"]["store_tokens"] == 0 and "held before the run" not in outs[0]
    assert second["bound"]["store_tokens"] > 0 and "or the L3 held before the run" in outs[1]
    assert second["policies"]["live"]["hit_rate"] <= second["bound"]["hit_rate"]
