"""A hybrid model in SGLang's fuzz world (issue 40, item 3): the SWA component beside full
attention, each pool's slots with one owner and its marks, and what SGLang refuses to deploy."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from stagefate.targets.sglang.fuzz_config import FuzzConfig, parse_pins

WINDOW = 8
"""Two pages: shorter than every hit of the world (a whole sequence is 32 tokens)."""


def test_a_hybrid_is_a_drawn_dimension_off_by_default() -> None:
    assert FuzzConfig().swa_window is None
    assert parse_pins([f"swa_window={WINDOW}"]) == {"swa_window": WINDOW}
    assert FuzzConfig(swa_window=WINDOW).driver_settings()["swa_window"] == WINDOW


@pytest.fixture(params=["python", "rust"])
def hybrid(request: pytest.FixtureRequest) -> Iterator[Any]:
    """SGLang deployed with an SWA window on each tree core, r0's whole sequence loaded from L3
    and admitted."""
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world

    driver = fuzz_world(FuzzConfig(swa_window=WINDOW), namespaces=(None,), core=request.param)
    try:
        driver.issue("r0", SEQUENCES[0], None)
        driver.settle()
        assert driver.admit("r0") == len(SEQUENCES[0])
        driver.settle()
        yield driver
    finally:
        driver.close()


def _window_peers(driver: Any) -> Any:
    """The SWA slots the tree maps r0's sequence to (0: none), in token order."""
    from stagefate.integrations.sglang.tree import device_prefix_indices
    from stagefate.targets.sglang.hybrid import swa_peers

    request = driver.requests["r0"]
    match = driver._match(driver.consumer, request.tokens, request.namespace)
    slots = device_prefix_indices(driver.consumer.cache, match)
    return swa_peers(driver.consumer.allocator, slots)


@pytest.mark.usefixtures("sglang")
def test_a_hybrid_loads_a_hit_with_its_window_and_every_pool_balances(hybrid: Any) -> None:
    from stagefate.targets.sglang.fuzzer import SEQUENCES

    assert hybrid.consumer.cache.supports_swa()
    assert hybrid.device_marks(SEQUENCES[0], None) == (len(SEQUENCES[0]), True)
    peers = _window_peers(hybrid)
    assert bool((peers[-WINDOW:] > 0).all()), "the load brought the window's SWA KV"
    assert hybrid.slot_problems() == []
    for books in (hybrid.device_books(), hybrid.swa_books()):
        free, cached, size = books
        assert free + cached == size


@pytest.mark.usefixtures("sglang")
def test_an_swa_slot_freed_while_the_tree_holds_it_is_caught(hybrid: Any) -> None:
    held = _window_peers(hybrid)[-4:]
    hybrid.consumer.allocator.swa_attn_allocator.free(held)
    assert hybrid.slot_problems() == [
        "4 SWA device slots are free and held by the tree or a decode at once "
        f"(e.g. {held.tolist()})"
    ]


@pytest.mark.usefixtures("sglang")
def test_the_tree_holds_the_swa_slots_its_resident_nodes_map_to(hybrid: Any) -> None:
    """What the Rust core's check reads (the SWA-resident nodes' full slots, mapped as the
    allocator maps them) is what the Python core's nodes hold as their SWA values."""
    from stagefate.targets.sglang.slot_owners import _swa_slots_of_the_tree

    core, allocator = hybrid.consumer.cache.tree_core, hybrid.consumer.allocator
    held = _swa_slots_of_the_tree(core, allocator)
    assert held.numel() >= WINDOW
    walk_only = type("WalkOnly", (), {"walk_for_kv_canary": core.walk_for_kv_canary})()
    mapped = _swa_slots_of_the_tree(walk_only, allocator)
    assert sorted(mapped.tolist()) == sorted(held.tolist())


@pytest.mark.usefixtures("sglang")
def test_an_swa_slot_holding_another_tokens_kv_is_caught(hybrid: Any) -> None:
    from stagefate.targets.sglang.fuzzer import SEQUENCES
    from stagefate.targets.sglang.hybrid import kv_buffers

    swa = kv_buffers(hybrid.consumer.allocator)[1]
    assert swa is not None
    swa[_window_peers(hybrid)[-1]] += 1  # full attention's KV is untouched
    assert hybrid.device_marks(SEQUENCES[0], None) == (len(SEQUENCES[0]), False)


@pytest.mark.usefixtures("sglang")
def test_a_decode_holds_the_swa_peers_of_its_slots_until_it_stops(hybrid: Any) -> None:
    assert hybrid.decode("r0", 4 * WINDOW)
    assert hybrid.slot_problems() == []
    hybrid.stop_decoding("r0")
    assert hybrid.slot_problems() == []
    free, cached, size = hybrid.swa_books()
    assert free + cached == size


@pytest.mark.usefixtures("sglang")
def test_a_hybrid_sglang_cannot_stage_is_refused_and_leaves_nothing() -> None:
    """A host pool of 8 tokens gives the SWA staging pool fewer than two windows: SGLang
    refuses to start, as its server would; a campaign rejects such a draw."""
    from stagefate.targets.sglang.fuzzer import fuzz_world
    from stagefate.targets.sglang.pipeline_driver import Undeployable

    before = set(Path(tempfile.gettempdir()).glob("sgl-l3-*"))
    with pytest.raises(Undeployable, match="two minimum Full/SWA transfers"):
        fuzz_world(FuzzConfig(swa_window=WINDOW, host_tokens=8), namespaces=(None,))
    assert set(Path(tempfile.gettempdir()).glob("sgl-l3-*")) <= before


@pytest.mark.usefixtures("sglang")
def test_a_load_that_brings_the_window_is_credited_with_the_full_kv_it_unlocks() -> None:
    """r0 loads the whole sequence; one page evicted takes the window's SWA with it, so the
    joint match serves nothing though full attention's KV of 28 tokens is still resident. r1's
    staged hit then loads 8 tokens and the window, unlocking the 24 resident ones: SGLang
    counts all 32 as storage's ("resident FULL the aux tail unlocks"), and so does the world."""
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world
    from stagefate.targets.sglang.hit_accounting import HitMetrics, keeps_hit_metrics

    driver = fuzz_world(FuzzConfig(swa_window=WINDOW), namespaces=(None,))
    try:
        if not keeps_hit_metrics(driver.consumer.cache):
            pytest.skip("this release exports no per-request hit metrics (0.5.19)")
        metrics, whole = HitMetrics.on(driver.consumer.cache), len(SEQUENCES[0])
        driver.issue("r0", SEQUENCES[0], None)
        driver.issue("r1", SEQUENCES[0], None)
        driver.settle()
        assert driver.admit("r0") == whole
        driver.settle()
        driver.evict(4)
        assert driver.device_marks(SEQUENCES[0], None) == (0, True)
        assert driver.admit("r1") == WINDOW
        r1 = driver.requests["r1"]
        assert (r1.unlocked_tokens, r1.credited_tokens) == (whole - WINDOW, whole)
        driver.settle()
        assert driver.device_marks(SEQUENCES[0], None) == (whole, True)
        assert (metrics.hit, driver.world_loads.loaded) == (2 * whole, 2 * whole)
        assert metrics.problem(driver.world_loads) is None
    finally:
        driver.close()


@pytest.mark.usefixtures("sglang")
def test_a_hybrid_read_missing_its_window_is_discarded_whole_and_logged_so() -> None:
    """The SWA objects of r0's hit are gone from L3, its full-attention pages are not: the
    read lands without the window, and SGLang drops the whole fetch at the ack (all or
    nothing, before anything is staged). The design log says read_done [read_empty]."""
    import io

    from stagefate.targets.sglang.design_log import watch_design
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world
    from stagefate.transition_log import TransitionLog

    driver = fuzz_world(FuzzConfig(swa_window=WINDOW), namespaces=(None,))
    try:
        log = io.StringIO()
        watch_design(driver, TransitionLog(log))
        driver.issue("r0", SEQUENCES[0], None)
        driver.run_existence_queries()
        driver.tick()  # the commit: the read is queued
        assert driver.drop_l3(lambda name: ".swa" not in name) > 0
        driver.settle()
        assert not driver.live("r0")
        assert driver.admit("r0") == 0
        last = log.getvalue().splitlines()[-1]
        assert '"event": "read_done", "guard": "read_empty", "target": "released"' in last
        assert driver.slot_problems() == []
    finally:
        driver.close()


@pytest.mark.slow  # an interpreter per release imports SGLang: half a minute each
def test_a_hybrid_prefetch_runs_on_every_installed_release() -> None:
    """The same hybrid prefetch on each release in its own process: up to 0.5.21 its paged
    allocation runs through the CPU shim's stand-in for a triton kernel (SGLang's own torch
    twin of it)."""
    from stagefate.targets.sglang.environments import installed
    from stagefate.targets.sglang.worker import call_in, one_prefetch

    ready = installed()
    if not ready:
        pytest.skip("no SGLang release is installed: make sglang")
    for version, target in ready.items():
        driver = "PlanDriver" if version == "0.5.19" else "PrepareDriver"
        assert call_in(target, one_prefetch, WINDOW) == (driver, 24, True, 0), version


@pytest.mark.usefixtures("sglang")
def test_resident_kv_the_window_unlocks_ahead_of_the_staged_span_is_no_hit() -> None:
    """r0's head page is on the device at its issue, so its L3 hit is the other 28 tokens; by
    its admission the head's window is gone (SWA reclaimed), its full-attention KV is not. The
    load makes all 32 usable, but only the staged 28 were a hit: SGLang credits 28, and so
    must the world (the third hybrid campaign's stop credited 32)."""
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world
    from stagefate.targets.sglang.hit_accounting import HitMetrics, keeps_hit_metrics

    driver = fuzz_world(FuzzConfig(swa_window=WINDOW), namespaces=(None,))
    try:
        if not keeps_hit_metrics(driver.consumer.cache):
            pytest.skip("this release exports no per-request hit metrics (0.5.19)")
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        metrics, tokens = HitMetrics.on(driver.consumer.cache), SEQUENCES[0]
        driver.publish(tokens[:4], None)
        driver.issue("r0", tokens, None)
        driver.settle()
        driver.consumer.cache.evict(EvictParams(num_tokens=0, swa_num_tokens=4))
        assert driver.device_marks(tokens, None) == (0, True)
        assert driver.admit("r0") == len(tokens) - 4
        r0 = driver.requests["r0"]
        assert (r0.lacking_tokens, r0.credited_tokens) == (len(tokens), len(tokens) - 4)
        driver.settle()
        assert driver.device_marks(tokens, None) == (len(tokens), True)
        assert metrics.hit == driver.world_loads.loaded == len(tokens) - 4
        assert metrics.problem(driver.world_loads) is None
    finally:
        driver.close()


@pytest.mark.usefixtures("sglang")
def test_a_head_trimmed_off_the_read_and_unlocked_by_the_window_is_the_hits() -> None:
    """The converse: r0's hit is all 32 tokens, and a sibling publishes its head page before
    the IO commit, which trims that page off the read (staged: 28). By admission the head's
    window is gone, its full-attention KV is not: the load brings 28 and the window, and all 32
    of the hit are storage's (the fourth hybrid campaign's stop credited 28)."""
    from stagefate.targets.sglang.fuzzer import SEQUENCES, fuzz_world
    from stagefate.targets.sglang.hit_accounting import HitMetrics, keeps_hit_metrics

    driver = fuzz_world(FuzzConfig(swa_window=WINDOW), namespaces=(None,))
    try:
        if not keeps_hit_metrics(driver.consumer.cache):
            pytest.skip("this release exports no per-request hit metrics (0.5.19)")
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        metrics, tokens = HitMetrics.on(driver.consumer.cache), SEQUENCES[0]
        driver.issue("r0", tokens, None)
        driver.run_existence_queries()
        driver.publish(tokens[:4], None)
        driver.settle()
        staged = driver.consumer.cache.buffer_pipeline.staged_prefetches
        assert staged[driver.requests["r0"].handle].num_tokens == len(tokens) - 4
        driver.consumer.cache.evict(EvictParams(num_tokens=0, swa_num_tokens=4))
        assert driver.admit("r0") == len(tokens) - 4
        assert driver.requests["r0"].credited_tokens == len(tokens)
        driver.settle()
        assert metrics.hit == driver.world_loads.loaded == len(tokens)
        assert metrics.problem(driver.world_loads) is None
    finally:
        driver.close()


class _Drawn:
    """What a fuzzer rule draws, given in order (a program of the campaign, replayed)."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        return self.values.pop(0)


@pytest.mark.usefixtures("sglang")
def test_a_load_of_the_window_alone_is_credited_with_what_it_unlocked() -> None:
    """The fifth hybrid campaign's stop, shrunk to five moves: r1's admission loads no
    full-attention row, only the window, and so makes its resident KV usable; SGLang resolves
    its hit as fulfilled at the ack, and the world credited nothing (it credited a hybrid's
    unlocked KV only when rows loaded: +16 tokens unaccounted for)."""
    from stagefate.targets.sglang.findings import proposed_fixes, set_aside
    from stagefate.targets.sglang.fuzzer import SGLangPipelineFuzzer

    with ExitStack() as fixes:  # the campaign looked past the id-reuse finding with its fix
        for fix in proposed_fixes(set_aside(["id_reuse"])):
            fixes.enter_context(fix())
        machine = SGLangPipelineFuzzer()
        machine.configure(_Drawn(FuzzConfig(prefetch_policy="timeout", swa_window=WINDOW)))
        moves = [
            lambda: machine.issue(sequence=0, namespace=None, stale=True),
            lambda: machine.abort(_Drawn("r0")),
            lambda: machine.reuse_id(_Drawn("r0"), sequence=1, namespace="tenant-b"),
            lambda: machine.drop_l3(seed=6),
            lambda: machine.issue(sequence=0, namespace="tenant-b", stale=False),
        ]
        for move in moves:
            move()
            machine.device_slots_hold_their_marks()
            machine.every_slot_has_one_owner()
            machine.sglang_sanity_check()
        requests = machine.driver.requests
        machine.teardown()  # the metrics balance at quiescence
    window_only = [r for r in requests.values() if r.loaded_tokens == 0 and r.unlocked_tokens]
    assert window_only, "the program no longer loads a window alone: re-shrink it"
