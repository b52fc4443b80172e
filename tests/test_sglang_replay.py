"""``replay --policy sglang``: SGLang 0.5.23's buffer-mode pipeline and tree inside the replay's
engine, with the books closing as for live and blind.

These run when `make sglang` has installed the target (CI does); without it they skip and say so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stagefate.targets import TargetUnavailable
from stagefate.targets.sglang import require

try:
    require()
except TargetUnavailable as missing:
    pytest.skip(f"{missing}", allow_module_level=True)

from stagefate.cli import main
from stagefate.registry import make_replay
from stagefate.sim.costs import CostModel
from stagefate.sim.engine_model import EngineOptions
from stagefate.sim.replay import ReplayOptions
from stagefate.sim.trace import TraceRequest, load_trace
from stagefate.targets.sglang.policy import SGLangPolicy

from .test_replay import (
    ENGINE_VARIANTS,
    SMALL,
    assert_books_close,
    siblings_rows,
    siblings_trace,
)


@pytest.fixture(scope="module")
def siblings(tmp_path_factory: pytest.TempPathFactory) -> list[TraceRequest]:
    return siblings_trace(tmp_path_factory)


@pytest.mark.slow
def test_books_close_on_sglangs_pipeline(siblings: list[TraceRequest]) -> None:
    replay = make_replay("sglang", siblings, SMALL)
    metrics = replay.run()
    assert metrics.l3_reads > 0 and metrics.tokens_spliced > 0
    assert metrics.engine.evicted_tokens > 0
    assert_books_close(replay, metrics, siblings)
    assert isinstance(replay.policy, SGLangPolicy)
    stats = replay.policy.cache._prefetch_outcome_stats
    assert stats["issued"] > 0  # SGLang's own counters moved: its pipeline did the work
    assert not replay.policy.driver.storage_dir.exists()  # its L3 directory went at the end


@pytest.mark.slow
def test_every_prefetch_policy_closes_sglangs_books(siblings: list[TraceRequest]) -> None:
    for engine in ENGINE_VARIANTS:
        replay = make_replay("sglang", siblings, SMALL.model_copy(update={"engine": engine}))
        assert_books_close(replay, replay.run(), siblings)


@pytest.mark.slow
def test_a_timed_out_prefetch_ends_through_sglangs_deadline_path(
    siblings: list[TraceRequest],
) -> None:
    # L3 reads slower than any wait: every prefetch the engine stops waiting for is ended by
    # SGLang's own deadline code (its IO thread then skips the read), and nothing leaks.
    slow = SMALL.model_copy(
        update={
            "costs": CostModel(l3_latency_ms=5_000),
            "engine": EngineOptions(prefetch_timeout_base_ms=1, prefetch_timeout_per_ki_token_ms=0),
        }
    )
    replay = make_replay("sglang", siblings, slow)
    assert isinstance(replay.policy, SGLangPolicy)
    cache, expired = replay.policy.cache, []
    mark = cache._mark_prefetch_deadline_expired
    cache._mark_prefetch_deadline_expired = lambda operation: (expired.append(1), mark(operation))
    metrics = replay.run()
    assert_books_close(replay, metrics, siblings)
    assert expired and metrics.tokens_spliced == 0 and metrics.l3_reads == 0
    assert make_replay("sglang", siblings, SMALL).run().tokens_spliced > 0


@pytest.mark.slow
def test_same_seed_same_figures(siblings: list[TraceRequest]) -> None:
    first = make_replay("sglang", siblings, SMALL).run().model_dump()
    second = make_replay("sglang", siblings, SMALL).run().model_dump()
    first.pop("wall_seconds"), second.pop("wall_seconds")
    assert first == second


@pytest.mark.slow
def test_on_sglangs_rust_core() -> None:
    trace = load_trace(limit=120)
    replay = make_replay("sglang", trace, ReplayOptions(tree="sglang-rust"))
    assert_books_close(replay, replay.run(), trace)


def test_another_l3_is_refused_with_the_fix_named() -> None:
    with pytest.raises(ValueError, match="drop --storage"):
        make_replay("sglang", load_trace(limit=5), ReplayOptions(storage="file:/tmp/elsewhere"))


@pytest.mark.slow
def test_cli_all_runs_the_three_policies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, trace = tmp_path / "all.json", tmp_path / "siblings.jsonl"
    trace.write_text("\n".join(siblings_rows()) + "\n")
    small = ["--device-tokens", str(SMALL.device_tokens), "--host-tokens", str(SMALL.host_tokens)]
    args = ["replay", "--trace", str(trace), *small, "--speed", str(SMALL.speed)]
    assert main([*args, "--json", str(out)]) == 0
    payload = json.loads(out.read_text())["policies"]
    assert list(payload) == ["live", "blind", "sglang"]
    assert payload["sglang"]["l3_reads"] > 0
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "sglang (SGLang 0.5.23's own pipeline) wasted" in printed


@pytest.mark.slow
def test_sglang_behind_the_router_shares_one_l3_through_its_backend(
    siblings: list[TraceRequest],
) -> None:
    """Two SGLang instances over one store: the return of a prompt to the other instance is
    spliced from the pages the first wrote through SGLang's backend, and the books close per
    instance and in total on a trace that evicts, reads and trims."""
    from stagefate.registry import policy_factories
    from stagefate.sim.instances import InstancesReplay

    from .test_instances import assert_instances_books_close, returning_prompt

    factory = policy_factories(["sglang"])["sglang"]
    apart = InstancesReplay(factory, returning_prompt(), SMALL, 2, "round_robin").run()
    home, away = apart.instances
    assert home.tokens_spliced == 0 and away.tokens_spliced > 0
    assert apart.cross_instance_hits == away.tokens_spliced == apart.cross_instance_read_tokens
    replay = InstancesReplay(factory, siblings, SMALL, 2, "random")
    metrics = replay.run()
    assert_instances_books_close(replay, metrics, siblings)
    assert 0 < metrics.cross_instance_hits <= metrics.cross_instance_read_tokens


@pytest.mark.slow
def test_replay_log_writes_sglangs_run_in_its_designs_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--log live.jsonl`` beside SGLang: live's log there, SGLang's in ``live.sglang.jsonl``,
    which its design accepts with every record ended."""
    from stagefate.spec import load_spec
    from stagefate.spec.load import DEFAULT_SPEC_PATH
    from stagefate.transition_log import validate_log

    log = tmp_path / "live.jsonl"
    assert main(["replay", "--policy", "live,sglang", "--limit", "200", "--log", str(log)]) == 0
    design = DEFAULT_SPEC_PATH.parent / "designs" / "sglang-0.5.23.yaml"
    summary = validate_log(
        (tmp_path / "live.sglang.jsonl").read_text().splitlines(), load_spec(design)
    )
    assert summary.violation is None and not summary.live
    assert summary.ended["filled"] > 0
    assert main(["validate", str(log)]) == 0


@pytest.mark.slow
def test_sglangs_own_log_lines_go_to_a_file_named_at_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SGLang warns once per pool (a host pool smaller than the device pool, a CPU event without
    timing) and per L3 miss; over several policies and seeds they filled the terminal the
    figures print to (issue 41)."""
    trace = tmp_path / "siblings.jsonl"
    trace.write_text("\n".join(siblings_rows()) + "\n")
    smaller_host = ["--device-tokens", str(SMALL.device_tokens), "--host-tokens", "32768"]
    argv = ["replay", "--trace", str(trace), *smaller_host, "--policy", "sglang", "--speed", "1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "HiCache" not in captured.err and "HiCache" not in captured.out
    printed = " ".join(captured.out.split())
    named = re.search(r"SGLang's own log: ([\d,]+) lines in (\S+)", printed)
    assert named is not None, printed[-400:]
    lines = Path(named.group(2)).read_text(encoding="utf-8").splitlines()
    assert len(lines) == int(named.group(1).replace(",", ""))
    assert any("host pool" in line and "smaller than the device pool" in line for line in lines)
    Path(named.group(2)).unlink()
