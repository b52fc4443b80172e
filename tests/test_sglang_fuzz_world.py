"""The SGLang fuzzer's wider world (issue 40): drawn deployments, ids that come back, and the
per-request structures found by walking a target's objects.

The configuration and the walk are plain Python and always run; the moves on SGLang's pipeline
run where `make sglang` installed it.
"""

from __future__ import annotations

import io
import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from stagefate.cli import main
from stagefate.targets.sglang.fuzz_config import CHOICES, PAGE, FuzzConfig, parse_pins
from stagefate.targets.sglang.request_books import per_request_books

# ---------------------------------------------------------------------- the configuration


def test_pins_parse_each_field_and_default_means_the_releases_own() -> None:
    pins = parse_pins(
        [
            "prefetch_policy=timeout",
            "retry-interval=0",
            "retry_max_attempts=default",
            "anchor_lock=off",
            "anchor_cap=0.5",
            "host_tokens=16",
            "prefetch_threshold=12",
            "swa_window=off",
        ]
    )
    assert pins == {
        "prefetch_policy": "timeout",
        "retry_interval": 0,
        "retry_max_attempts": None,
        "anchor_lock": False,
        "anchor_cap": 0.5,
        "host_tokens": 16,
        "prefetch_threshold": 12,
        "swa_window": None,
    }
    assert parse_pins(["swa_window=8"]) == {"swa_window": 8}
    assert FuzzConfig(**pins).driver_settings()["host_tokens"] == 16
    assert set(CHOICES) == set(pins)


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        (["policy=timeout"], "expected KEY=VALUE with KEY one of prefetch_policy"),
        (["prefetch_policy"], "expected KEY=VALUE"),
        (["prefetch_policy=fast"], "one of wait_complete, best_effort, timeout (got 'fast')"),
        (["anchor_lock=maybe"], "on or off (got 'maybe')"),
        (["anchor_cap=2"], "anchor_cap is a share from 0 to 1"),
        (["host_tokens=0"], "host_tokens is at least 1"),
        (["retry_interval=-1"], "retry_interval is at least 0"),
        (["retry_interval=x"], "or another number (got 'x')"),
        (["host_tokens=8", "host_tokens=16"], "--config host_tokens is given twice"),
        (["swa_window=0"], "swa_window is at least 1"),
        (["swa_window=on"], "one of off, 4, 8, or another number (got 'on')"),
    ],
)
def test_a_bad_pin_is_refused_naming_the_key_and_the_choices(
    texts: list[str], expected: str
) -> None:
    with pytest.raises(ValueError) as refused:
        parse_pins(texts)
    assert expected in str(refused.value)


def test_config_without_the_sglang_target_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--steps", "10", "--config", "host_tokens=16"]) == 2
    assert "use them with --target sglang" in capsys.readouterr().err


# ---------------------------------------------------------------------- the walk


@dataclass(eq=False)
class _Operation:
    request_id: str


@dataclass(eq=False)
class _Controller:
    queue: deque[_Operation] = field(default_factory=deque)
    totals: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class _Cache:
    ongoing: dict[str, int] = field(default_factory=dict)
    retries: set[str] = field(default_factory=set)
    controller: _Controller = field(default_factory=_Controller)
    elsewhere: Any = None


def test_the_walk_finds_every_structure_that_names_a_request() -> None:
    cache = _Cache()
    cache.controller.totals["hits"] = 3  # keyed by a name that is no request
    assert per_request_books({"cache": cache}, {"r0", "r1"}, package=__name__) == {}
    cache.ongoing["r0"] = 1
    cache.retries.add("r1")
    cache.controller.queue.append(_Operation("r1"))  # an item naming its request
    cache.elsewhere = {"r0": 1}  # a dict in an attribute of a class not the target's package
    found = per_request_books({"cache": cache}, {"r0", "r1"}, package=__name__)
    assert found == {
        "cache.ongoing": 1,
        "cache.retries": 1,
        "cache.controller.queue": 1,
        "cache.elsewhere": 1,
    }
    # objects of another package are not walked into
    assert per_request_books({"cache": cache}, {"r0", "r1"}, package="sglang") == {
        "cache.ongoing": 1,
        "cache.retries": 1,
        "cache.elsewhere": 1,
    }


# ---------------------------------------------------------------------- on SGLang's pipeline


@pytest.mark.slow  # about 11 s
@pytest.mark.usefixtures("sglang")
def test_an_id_reused_while_its_read_lands_keeps_two_records_in_the_design_log() -> None:
    """r0's read is under way when r0 is aborted and a new request reuses the id: the log
    writes the new attempt as r0@1, and the abandoned read's landing ends r0."""
    from stagefate.targets.sglang.design_log import design_path, load_design, watch_design
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world
    from stagefate.transition_log import TransitionLog, validate_log

    driver = fuzz_world(FuzzConfig(), namespaces=(None,))
    try:
        written = io.StringIO()
        watch_design(driver, TransitionLog(written))
        driver.issue("r0", SEQUENCES[0], None)
        driver.run_existence_queries()
        driver.tick()  # the IO commit: the read is queued
        driver.abort("r0")
        driver.issue("r0", SEQUENCES[0], None, fresh=True)
        driver.settle()
        assert driver.admit("r0") > 0
        driver.settle()
        lines = written.getvalue().splitlines()
        records = [json.loads(line) for line in lines]
        ends = {(r["request"], r["source"], r["event"], r["reason"]) for r in records}
        assert ("r0", "abandoned", "read_done", "aborted") in ends
        assert ("r0@1", "consumed", "ack", "filled") in ends
        summary = validate_log(
            lines, load_design(design_path(driver.consumer.cache.buffer_pipeline))
        )
        assert summary.violation is None and not summary.live
    finally:
        driver.close()


@pytest.mark.usefixtures("sglang")
def test_a_retry_of_an_admitted_request_is_refused_and_a_retraction_starts_afresh() -> None:
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world

    driver = fuzz_world(FuzzConfig(), namespaces=(None,))
    try:
        driver.issue("r0", SEQUENCES[0], None)
        driver.settle()
        assert driver.admit("r0") == len(SEQUENCES[0])
        assert driver.requests["r0"].state == "admitted"
        with pytest.raises(ValueError, match="r0 is admitted: a retry re-issues a waiting"):
            driver.issue("r0", SEQUENCES[0], None)
        driver.settle()
        driver.issue("r0", SEQUENCES[0], None, fresh=True)  # retracted: the same rid again
        assert driver.requests["r0"].state == "waiting"
        driver.settle()
        driver.admit("r0")
        assert driver.requests["r0"].state == "admitted"
    finally:
        driver.close()


# ---------------------------------------------------------------------- one owner per slot


@pytest.fixture
def staged_world() -> Iterator[Any]:
    """SGLang with r0's hit staged in the bounce buffer and r1's sequence on the device."""
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world

    driver = fuzz_world(FuzzConfig(), namespaces=(None,))
    try:
        driver.publish(SEQUENCES[1], None)
        driver.issue("r0", SEQUENCES[0], None)
        driver.settle()
        assert driver.consumer.cache.buffer_pipeline.has_staged(driver.requests["r0"].handle)
        assert driver.slot_problems() == []
        yield driver
    finally:
        driver.close()


@pytest.mark.usefixtures("sglang")
def test_a_bounce_slot_freed_under_a_staged_hold_is_free_and_held_at_once(
    staged_world: Any,
) -> None:
    pipeline = staged_world.consumer.cache.buffer_pipeline
    staged = pipeline.staged_prefetches[staged_world.requests["r0"].handle]
    _host_pool(staged_world).free(staged.host_indices[:4])
    assert staged_world.slot_problems() == [
        "4 host slots are free and held by an operation or book at once "
        f"(e.g. {staged.host_indices[:4].tolist()})"
    ]


@pytest.mark.usefixtures("sglang")
def test_a_staged_hold_dropped_without_its_free_leaves_slots_with_no_owner(
    staged_world: Any,
) -> None:
    pipeline = staged_world.consumer.cache.buffer_pipeline
    staged = pipeline.staged_prefetches.pop(staged_world.requests["r0"].handle)
    size = _host_pool(staged_world).size
    assert staged_world.slot_problems() == [
        f"{len(staged.host_indices)} of the {size} host slots are neither free nor held by an "
        "operation or book"
    ]


@pytest.mark.usefixtures("sglang")
def test_a_device_slot_freed_while_the_tree_holds_it_is_caught(staged_world: Any) -> None:
    held = staged_world.consumer.cache.all_values_flatten()[:4]
    staged_world.consumer.allocator.free(held)
    assert staged_world.slot_problems() == [
        f"4 device slots are free and held by the tree or a decode at once (e.g. {held.tolist()})"
    ]


def _host_pool(driver: Any) -> Any:
    pool = driver.consumer.cache.cache_controller.mem_pool_host
    anchor = getattr(pool, "anchor_entry", None)
    return pool if anchor is None else anchor.host_pool


@pytest.mark.usefixtures("sglang")
def test_the_oldest_query_and_read_go_first_the_others_held_past_them() -> None:
    """SGLang's storage threads take their queues first in first out: the world answers the
    oldest query alone, lands the oldest read alone (r0's), and holds r1's read past r1's abort
    and a new request under its id; then it lands and frees its bounce once."""
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world

    driver = fuzz_world(FuzzConfig(), namespaces=(None,))
    try:
        controller = driver.consumer.cache.cache_controller
        queries, reads = controller.prefetch_queue, controller.prefetch_buffer
        driver.issue("r0", SEQUENCES[0], None)
        driver.issue("r1", SEQUENCES[1], None)
        driver.run_existence_queries(only_oldest=True)  # r0's query alone
        assert [op.request_id for op in queries.queue] == ["r1"]
        driver.run_existence_queries()
        driver.tick()  # both commits: both reads queued, r0's first
        assert [op.request_id for op in reads.queue] == ["r0", "r1"]
        driver.run_reads(only_oldest=True)
        assert [op.request_id for op in reads.queue] == ["r1"]
        driver.abort("r1")
        driver.issue("r1", SEQUENCES[2], None, fresh=True)
        assert driver.slot_problems() == []
        driver.settle()
        assert driver.admit("r0") > 0
        driver.admit("r1")
        driver.settle()
        assert driver.slot_problems() == []
        assert driver.pipeline_host_available() == driver.baseline_host
    finally:
        driver.close()


@pytest.mark.usefixtures("sglang")
def test_quiescence_waits_for_the_bounce_an_ack_released_in_the_last_pass() -> None:
    """A campaign's stop (2026-12-04), the world's: r1's read, abandoned by its abort, is acked
    and its bounce queued for release, which SGLang frees a pass later (each drain takes only
    what its queues held when it began). The world took the pipeline's ``is_idle`` for
    quiescence and checked the host pool a pass early: "host pool leaked: 584 free of 616"."""
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world

    driver = fuzz_world(FuzzConfig(prefetch_policy="best_effort"), namespaces=(None,))
    try:
        releases = driver.consumer.cache.cache_controller.host_mem_release_queue
        driver.issue("r0", SEQUENCES[0], None)
        driver.issue("r1", SEQUENCES[0], None)
        driver.run_existence_queries()
        driver.admit("r0")  # best_effort: admitted at once; r1's read goes on
        driver.tick()
        driver.abort("r1")
        seen_waiting = False
        for _ in range(4):
            driver.settle(rounds=1)
            if not releases.empty():
                assert driver.consumer.cache.buffer_pipeline.is_idle()
                assert not driver.idle()  # the release still to come is work
                seen_waiting = True
        assert seen_waiting, "no pass left a release queued: the program no longer shows it"
        assert driver.idle()
        assert driver.pipeline_host_available() == driver.baseline_host
    finally:
        driver.close()


@pytest.mark.usefixtures("sglang")
def test_a_running_batch_that_fills_the_device_leaves_a_staged_hit_waiting_until_it_shrinks() -> (
    None
):
    """Pressure: r1 runs and its decode takes every device slot (the tree evicted first), so r0's
    staged hit cannot load; once r1 is retracted its slots are free and r0 loads."""
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world

    driver = fuzz_world(FuzzConfig(), namespaces=(None,))
    try:
        driver.issue("r1", SEQUENCES[1], None)
        driver.settle()
        assert driver.admit("r1") > 0
        driver.settle()
        driver.issue("r0", SEQUENCES[0], None)
        driver.settle()
        free = driver.device_books()[0]
        evictable = int(driver.consumer.cache.evictable_size())
        assert driver.decode("r1", free + evictable)  # the tree is evicted to make room
        assert driver.device_books()[0] == 0
        assert not driver.decode("r1", PAGE)  # nothing left: the scheduler must retract
        assert driver.admit("r0") == 0 and driver.requests["r0"].state == "waiting"
        assert driver.slot_problems() == []
        driver.stop_decoding("r1")  # retracted: its decode slots are freed
        driver.settle()
        assert driver.admit("r0") > 0
        driver.settle()
        assert driver.slot_problems() == []
    finally:
        driver.close()


# ---------------------------------------------------------------------- waste against a twin


@pytest.mark.usefixtures("sglang")
def test_a_program_replayed_on_a_twin_without_the_anchor_lock_wastes_the_read() -> None:
    """The anchor of r0's staged hit is evicted before admission: with the lock (0.5.23's
    default) the anchor stays and all 28 tokens read are spliced; the twin without it reads the
    same 28 and splices none. Recorded once, replayed on the twin, printed as driver calls."""
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world
    from stagefate.targets.sglang.waste import (
        Comparison,
        ReadTokens,
        RecordingDriver,
        Waste,
        program_text,
        replay,
        spliced,
        twin_config,
    )

    def measured(config: FuzzConfig) -> tuple[Any, ReadTokens]:
        world = fuzz_world(config, namespaces=(None,))
        world.consumer.cache.enable_storage_metrics = True
        world.consumer.cache.storage_metrics_collector = read = ReadTokens()
        return world, read

    config = FuzzConfig()
    world, read = measured(config)
    twin, twin_read = measured(twin_config(config, "anchor_lock", False))
    try:
        driver = RecordingDriver(world)
        driver.publish(SEQUENCES[0][:PAGE], None)
        driver.issue("r0", SEQUENCES[0], None)
        driver.settle()
        driver.evict(8 * PAGE)
        driver.admit("r0")
        driver.settle()
        drawn = Waste(read.tokens, spliced(driver.calls))
        loaded, skipped = replay(driver.calls, twin)
        other = Waste(twin_read.tokens, loaded)
    finally:
        world.close()
        twin.close()
    assert (drawn, other, skipped) == (Waste(28, 28), Waste(28, 0), 0)
    comparison = Comparison("anchor_lock", False)
    comparison.add(config, driver.calls, drawn, other)
    assert comparison.more == {"drawn": 0, "twin": 1}
    assert comparison.worst["twin"] == (28, config, driver.calls)
    assert program_text(driver.calls, SEQUENCES) == (
        "driver.publish(SEQUENCES[0][:4], None)\n"
        "driver.issue('r0', SEQUENCES[0], None)\n"
        "driver.settle()\n"
        "driver.evict(32)\n"
        "driver.admit('r0')  # 28\n"
        "driver.settle()"
    )


@pytest.mark.slow  # a short campaign, each program run twice
@pytest.mark.usefixtures("sglang")
def test_a_twin_with_the_drawn_setting_wastes_exactly_what_the_drawn_side_does() -> None:
    """The comparison measures the setting and nothing else: with the twin's setting the drawn
    one, every program wastes the same on both sides, on a hybrid too (the invariants' matches
    split SGLang's nodes and tombstone SWA, so the twin replays them; until 2026-12-04 it did
    not, and 89 of 224 hybrid programs differed with nothing to differ by)."""
    from hypothesis.stateful import run_state_machine_as_test

    from stagefate.targets.sglang.fuzzer import SGLangPipelineFuzzer
    from stagefate.targets.sglang.waste import WASTE

    from .harness import fuzz_settings, looking_past_sglangs_open_findings

    pins = {"anchor_lock": False, "swa_window": 8, "host_tokens": 64}
    machine = type(
        "SameTwin", (SGLangPipelineFuzzer,), {"pins": pins, "compare": ("anchor_lock", False)}
    )
    WASTE.start("anchor_lock", False)
    with looking_past_sglangs_open_findings():
        run_state_machine_as_test(machine, settings=fuzz_settings(40, 40))
    assert WASTE.programs > 0
    assert WASTE.more == {"drawn": 0, "twin": 0}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--compare", "anchor_lock=maybe"], "--compare anchor_lock=: one of default, on, off"),
        (
            ["--config", "anchor_lock=off", "--compare", "anchor_lock=off"],
            "--config pins anchor_lock to the same value",
        ),
        (["--waste-fails", "twin"], "--waste-fails needs --compare KEY=VALUE"),
    ],
)
@pytest.mark.usefixtures("sglang")
def test_a_bad_comparison_is_refused_before_any_program_runs(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fuzz", "--target", "sglang", "--steps", "10", *argv]) == 2
    assert expected in capsys.readouterr().err


@pytest.mark.usefixtures("sglang")
def test_a_comparison_with_the_release_under_test_itself_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from stagefate.targets.sglang.environments import resolve

    version = resolve(None).version
    assert main(["fuzz", "--target", "sglang", "--compare", f"release={version}"]) == 2
    assert f"the campaign runs {version} already" in capsys.readouterr().err


@pytest.mark.usefixtures("sglang")
def test_a_recorded_program_replays_in_a_release_process_as_it_does_here() -> None:
    """The cross-release twin: programs pickle to another release's worker (no closures, no
    SGLang objects in them) and replay there; on the same release the replay matches the
    recording."""
    import pickle

    from stagefate.targets.sglang.fuzzer import SEQUENCES, KeepL3
    from stagefate.targets.sglang.twins import replayed_in_this_release

    calls = [
        ("issue", ("r0", SEQUENCES[0], None), {}, None),
        ("drop_l3", (KeepL3(3),), {}, None),
        ("settle", (), {}, None),
        ("admit", ("r0",), {}, 28),
        ("settle", (), {}, None),
    ]
    programs = pickle.loads(pickle.dumps([(FuzzConfig(), calls)]))
    ((waste, skipped),) = replayed_in_this_release(programs, (None,), "python", ())
    assert skipped == 0 and waste.read >= waste.spliced > 0


# ---------------------------------------------------------------------- SGLang's hit metrics


def _metered(driver: Any) -> Any:
    """``driver``'s consumer with SGLang's storage metrics on, exported into a stand-in."""
    from stagefate.targets.sglang.hit_accounting import HitMetrics

    return HitMetrics.on(driver.consumer.cache)


@pytest.mark.usefixtures("sglang")
def test_sglang_exports_each_hit_token_once_loaded_unfulfilled_or_left_out() -> None:
    """r0 loads its whole hit; r1's hit is half on the device by its admission (a sibling
    published r1's head: device_covered); r2 is aborted while staged, and r0 is retracted and
    re-admitted (both left out of the metrics on purpose). At every point the exported hit
    tokens less the unfulfilled equal the world's loads plus what was left out."""
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world
    from stagefate.targets.sglang.hit_accounting import keeps_hit_metrics

    driver = fuzz_world(FuzzConfig(), namespaces=(None,))
    try:
        if not keeps_hit_metrics(driver.consumer.cache):
            pytest.skip("this release exports no per-request hit metrics (0.5.19)")
        metrics, world = _metered(driver), driver.world_loads
        driver.issue("r0", SEQUENCES[0], None)
        driver.settle()
        assert driver.admit("r0") == len(SEQUENCES[0])
        driver.settle()
        whole = len(SEQUENCES[0])
        assert (metrics.hit, world.loaded, metrics.problem(world)) == (whole, whole, None)

        driver.issue("r1", SEQUENCES[2], None)
        driver.settle()
        driver.publish(SEQUENCES[2][: 4 * PAGE], None)  # a sibling computed r1's head
        loaded = driver.admit("r1")
        driver.settle()
        assert metrics.unfulfilled["device_covered"] == 2 * PAGE
        assert world.loaded == whole + loaded and metrics.problem(world) is None

        driver.issue("r2", SEQUENCES[1], None)
        driver.settle()
        driver.abort("r2")
        driver.stop_decoding("r0")
        driver.issue("r0", SEQUENCES[0], None, fresh=True, retracted=True)
        driver.settle()
        driver.admit("r0")
        driver.settle()
        assert world.left_out > 0 and metrics.problem(world) is None
    finally:
        driver.close()


@pytest.mark.usefixtures("sglang")
def test_hit_tokens_resolved_without_a_reason_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug: admission forgets the tokens the device covered, so the ack resolves
    them silently (fulfilled without a reason) and they are exported as neither."""
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world
    from stagefate.targets.sglang.hit_accounting import keeps_hit_metrics

    driver = fuzz_world(FuzzConfig(), namespaces=(None,))
    try:
        cache = driver.consumer.cache
        if not keeps_hit_metrics(cache):
            pytest.skip("this release exports no per-request hit metrics (0.5.19)")
        monkeypatch.setattr(type(cache), "_settle_storage_prefetch_hit", lambda *args, **kw: None)
        metrics = _metered(driver)
        driver.issue("r1", SEQUENCES[2], None)
        driver.settle()
        driver.publish(SEQUENCES[2][: 4 * PAGE], None)
        loaded = driver.admit("r1")
        driver.settle()
        problem = metrics.problem(driver.world_loads)
        assert problem is not None
        assert f"the world's admissions loaded {loaded}" in problem
        assert f"{len(SEQUENCES[2]) - loaded:+d} tokens unaccounted for" in problem
    finally:
        driver.close()


@pytest.mark.usefixtures("sglang")
@pytest.mark.parametrize("fixed", [False, True])
def test_a_reused_ids_revoked_prefetch_leaves_its_hit_tokens_unresolved_unless_fixed(
    fixed: bool,
) -> None:
    """docs/sglang-findings.md, "An aborted request's leftover revokes the next prefetch of its
    id": the leftover answer is exported as the new request's hit and never resolved; with the
    proposed fix the hit is loaded and the metrics balance."""
    from contextlib import nullcontext

    from stagefate.targets.sglang.findings import FINDINGS, proposed_fixes
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world
    from stagefate.targets.sglang.hit_accounting import keeps_hit_metrics

    finding = FINDINGS["aborted_query_revokes_its_ids_next_prefetch"]
    driver = fuzz_world(finding.config)
    try:
        if not keeps_hit_metrics(driver.consumer.cache):
            pytest.skip("this release exports no per-request hit metrics (0.5.19)")
        (fix,) = proposed_fixes([finding.name])
        with fix() if fixed else nullcontext():
            metrics = _metered(driver)
            finding.program(driver)
            driver.settle()
            driver.admit("r0")
            driver.settle()
        whole = len(SEQUENCES[0])
        assert (metrics.hit, driver.world_loads.loaded) == (whole, whole if fixed else 0)
        problem = metrics.problem(driver.world_loads)
        assert (problem is None) == fixed
        if not fixed:
            assert problem is not None and f"+{whole} tokens unaccounted for" in problem
    finally:
        driver.close()


def test_the_world_retracts_the_request_sglang_would() -> None:
    """SGLang's default retraction order (``ScheduleBatch._get_decode_retraction_order``: kept
    by ``(len(output_ids), -len(origin_input_ids))`` descending, retracted from the end): the
    fewest output tokens first, then the longest input. The world takes no other."""
    from types import SimpleNamespace

    from stagefate.targets.sglang.fuzzer import SGLangPipelineFuzzer

    state = SGLangPipelineFuzzer.__new__(SGLangPipelineFuzzer)
    running = {"long-decoded": (10, 12), "short-fresh": (0, 4), "long-fresh": (0, 9)}
    state.driver = SimpleNamespace(  # type: ignore[assignment]
        requests={
            rid: SimpleNamespace(state="admitted", tokens=[0] * length)
            for rid, (_, length) in running.items()
        },
        decoding={rid: torch.zeros(out) for rid, (out, _) in running.items() if out},
        loading=lambda rid: False,
    )
    assert state._sglangs_retraction_choice() == "long-fresh"
    del state.driver.requests["long-fresh"]
    assert state._sglangs_retraction_choice() == "short-fresh"
