"""SGLang 0.5.23's BufferModePipeline as a target: stepped on the caller's thread, fuzzed with
docs/design.md §10's invariants, and four bugs planted into SGLang that the campaign must catch.

These run when `make sglang` has installed the target (CI does); without it they skip and say so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis.stateful import run_state_machine_as_test

from stagefate.cli import main
from stagefate.spec.load import DEFAULT_SPEC_PATH
from stagefate.targets import TargetUnavailable
from stagefate.targets.sglang import require

from .harness import SGLANG_STILL_OPEN, fuzz_settings, looking_past_sglangs_open_findings

try:
    require()
except TargetUnavailable as missing:
    pytest.skip(f"{missing}", allow_module_level=True)

from sglang.srt.mem_cache.buffer_mode.pipeline import BufferModePipeline
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from stagefate.targets.sglang.fuzzer import (
    OUTCOMES,
    SEQUENCES,
    STATES,
    SGLangPipelineFuzzer,
)
from stagefate.targets.sglang.generations import stepped_sglang
from stagefate.targets.sglang.pipeline_driver import SteppedSGLang


@pytest.fixture
def driver() -> Iterator[SteppedSGLang]:
    stepped = stepped_sglang(page_size=4)
    yield stepped
    stepped.close()


def test_a_whole_prefetch_splices_the_producers_bytes(driver: SteppedSGLang) -> None:
    tokens = SEQUENCES[0]
    driver.produce(tokens, None)
    driver.publish(tokens[:8], None)  # the consumer's own device prefix: the anchor
    driver.issue("r0", tokens, None)
    driver.settle()
    pipeline = driver.consumer.cache.buffer_pipeline
    assert pipeline.has_staged(driver.requests["r0"].handle)
    assert pipeline.anchor_locked_tokens_ == 8  # pinned at the IO commit, on the anchor
    assert driver.admit("r0") == len(tokens) - 8
    driver.settle()
    assert driver.device_marks(tokens, None) == (len(tokens), True)
    assert pipeline.is_idle() and not pipeline.anchor_locks
    assert driver.pipeline_host_available() == driver.baseline_host
    driver.consumer.cache.sanity_check()


def test_namespaces_never_share_a_splice(driver: SteppedSGLang) -> None:
    tokens = SEQUENCES[1]
    driver.produce(tokens, "tenant-b")  # L3 has the span under one namespace only
    driver.issue("r0", tokens, None)
    driver.settle()
    assert driver.admit("r0") == 0
    driver.issue("r1", tokens, "tenant-b")
    driver.settle()
    assert driver.admit("r1") == len(tokens)
    driver.settle()
    assert driver.device_marks(tokens, "tenant-b") == (len(tokens), True)
    assert driver.device_marks(tokens, None) == (0, True)


def test_a_sibling_publish_after_staging_is_trimmed_at_admission(driver: SteppedSGLang) -> None:
    tokens = SEQUENCES[0]
    driver.produce(tokens, None)
    driver.publish(tokens[:8], None)
    driver.issue("r0", tokens, None)
    driver.settle()  # staged: 24 tokens after the 8 on the device
    driver.publish(tokens[:16], None)  # a sibling computes 8 of them meanwhile
    assert driver.admit("r0") == 16 == driver.requests["r0"].lacking_tokens
    driver.settle()
    assert driver.device_marks(tokens, None) == (len(tokens), True)
    assert driver.pipeline_host_available() == driver.baseline_host


def test_two_waiting_siblings_each_read_the_span_one_of_them_then_splices(
    driver: SteppedSGLang,
) -> None:
    """Why SGLang wastes 4-10x the reads live does under overload (docs/replay.md, the load
    sweep): its pipeline has no in-flight dedup, so two queued requests that need the same span
    each read it; the first admitted splices it, and the second's hold finds the device
    covering its whole span and is released (``device_covered``): a read for nothing. Live's
    IO commit waits for the sibling's read instead (``declined_inflight``,
    tests/test_replay.py)."""
    tokens = SEQUENCES[0]
    driver.produce(tokens, None)
    driver.publish(tokens[:8], None)
    driver.issue("r0", tokens, None)
    driver.issue("r1", tokens, None)  # a sibling, queued behind it with the same prompt
    driver.settle()
    pipeline = driver.consumer.cache.buffer_pipeline
    both = [pipeline.has_staged(driver.requests[rid].handle) for rid in ("r0", "r1")]
    assert both == [True, True]  # two reads of one span, both staged
    assert driver.admit("r0") == len(tokens) - 8
    assert driver.admit("r1") == 0  # the device holds its whole span now
    assert not driver.live("r1")  # its hold was released: the read went for nothing
    driver.settle()
    assert driver.pipeline_host_available() == driver.baseline_host


def test_abort_while_reading_keeps_the_bounce_until_the_read_lands(
    driver: SteppedSGLang,
) -> None:
    tokens = SEQUENCES[0]
    driver.produce(tokens, None)
    driver.issue("r0", tokens, None)
    driver.run_existence_queries()
    driver.tick()  # the IO commit: the bounce is allocated, the read queued
    held = driver.baseline_host - driver.pipeline_host_available()
    assert held == len(tokens)
    driver.abort("r0")
    assert driver.baseline_host - driver.pipeline_host_available() == held
    driver.settle()
    assert driver.pipeline_host_available() == driver.baseline_host
    assert not driver.live("r0")


LOOK_PAST = [arg for name in SGLANG_STILL_OPEN for arg in ("--set-aside", name)]
"""The findings still in 0.5.23 (docs/sglang-findings.md), set aside with their proposed fixes."""
CAMPAIGN_PROGRAMS = 200
"""The CI budget: the clean code passes it, and each planted bug is caught within it."""


def _campaign(steps: int, examples: int, pins: Mapping[str, Any] | None = None) -> None:
    """A short derandomized campaign, no shrinking (the CLI shrinks; a test needs the verdict),
    looking past the finding still in 0.5.23 with its proposed fix applied (:data:`LOOK_PAST`);
    ``pins``: the deployment fields it fixes (``fuzz --config``), the rest drawn."""
    machine = type("Pinned", (SGLangPipelineFuzzer,), {"pins": dict(pins or {})})
    with looking_past_sglangs_open_findings():
        run_state_machine_as_test(machine, settings=fuzz_settings(examples, steps))


@pytest.mark.slow
def test_the_campaign_passes_on_sglangs_code() -> None:
    OUTCOMES.clear()
    STATES.clear()
    _campaign(steps=80, examples=CAMPAIGN_PROGRAMS)
    assert STATES["steps"] > 500
    assert OUTCOMES["try_lock_anchor: locked"] > 0


# ---------------------------------------------------------------------- planted bugs


def _hold_released_without_freeing(monkeypatch: pytest.MonkeyPatch) -> None:
    release = BufferModePipeline.release_staged_hold

    def leaky(self: Any, request: Any, reason: str | None = None) -> bool:
        staged = self.staged_prefetches.get(request)
        if staged is not None:
            staged.host_indices = staged.host_indices[:0]  # its host slots are never freed
        return release(self, request, reason)

    monkeypatch.setattr(BufferModePipeline, "release_staged_hold", leaky)


def _anchor_lock_never_released(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BufferModePipeline, "release_anchor_lock", lambda self, request: None)


def _bounce_freed_at_abort_while_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    release = UnifiedRadixCache.release_aborted_request

    def eager(self: Any, request: Any) -> None:
        info = self.ongoing_prefetch.get(request)
        if info is not None and info.operation.host_indices is not None:
            self.cache_controller.mem_pool_host.free(info.operation.host_indices)
        release(self, request)

    monkeypatch.setattr(UnifiedRadixCache, "release_aborted_request", eager)


def _trim_ignored_at_admission(monkeypatch: pytest.MonkeyPatch) -> None:
    build = BufferModePipeline._build_staged_prefetch_plan

    def untrimmed(self: Any, staged: Any, key: Any, matched_len: int) -> Any:
        return build(self, staged, key, staged.matched_len)  # as if no sibling had published

    monkeypatch.setattr(BufferModePipeline, "_build_staged_prefetch_plan", untrimmed)


REACHES_A_STAGED_HIT = MappingProxyType({"prefetch_threshold": 1, "host_tokens": None})
"""The deployment where every hit is fetched and a whole one fits the bounce: a trim needs a
staged hit that a sibling's publish overtakes, which one program in tens draws otherwise (CI at
9e21068 missed it in 200 programs with every field drawn)."""

PLANTED: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], str, Mapping[str, Any]]] = {
    # bug: (how it is planted, what catches it: an invariant's message or SGLang's own check,
    # the deployment fields pinned: where the bug can be reached)
    "staged hold released without freeing its host slots": (
        _hold_released_without_freeing,
        "host pool leaked",
        {},
    ),
    "anchor lock never released": (
        _anchor_lock_never_released,
        # ours at quiescence, SGLang's at the next lock, or liveness: the cap it keeps busy
        # leaves the requests behind it waiting for ever
        "anchor lock|anchor already locked|still waiting after",
        {},
    ),
    "bounce freed at abort while its read is in flight": (
        _bounce_freed_at_abort_while_reading,
        "Double-free detected|host pool leaked",
        {},
    ),
    "trim ignored at admission": (
        _trim_ignored_at_admission,
        "not trimmed|init_load_back",  # SGLang's own assert in init_load_back, or ours
        REACHES_A_STAGED_HIT,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(PLANTED))
def test_the_campaign_catches_a_planted_bug(bug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plant, caught_by, pins = PLANTED[bug]
    plant(monkeypatch)
    with pytest.raises(AssertionError) as caught:
        _campaign(steps=80, examples=CAMPAIGN_PROGRAMS, pins=pins)
    where = f"{caught.value} " + " ".join(entry.name for entry in caught.traceback)
    assert re.search(caught_by, where), f"{bug} was caught, but not by {caught_by!r}: {where}"


@pytest.mark.slow
def test_fuzz_target_sglang_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--target", "sglang", "--steps", "2000", "--seed", "3", *LOOK_PAST]) == 0
    out = capsys.readouterr().out
    # the decisions table is printed (which rows it has depends on the deployments drawn)
    assert "BufferModePipeline" in out and "SGLang's decisions reached" in out
    assert "outcome: issued" in out


def test_namespaces_set_aside_issue_and_publish_in_the_root_namespace_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``fuzz --set-aside namespaces``: what looks past 0.5.19's L3 keys that ignore the
    namespace; the same draws, every namespace the root one."""
    used: set[str | None] = set()
    # where each call takes its namespace, after self: issue(rid, tokens, namespace, ...),
    # publish(tokens, namespace), produce(tokens, namespace)
    for method, position in (("issue", 2), ("publish", 1), ("produce", 1)):
        original = getattr(SteppedSGLang, method)

        def record(
            self: Any, *args: Any, _original: Any = original, _at: int = position, **kwargs: Any
        ) -> Any:
            used.add(args[_at])
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(SteppedSGLang, method, record)
    aside = type("Aside", (SGLangPipelineFuzzer,), {"namespaces": (None,)})
    with looking_past_sglangs_open_findings():  # the draws, not the verdicts, are the point
        run_state_machine_as_test(aside, settings=fuzz_settings(2, 30))
        assert used == {None}
        used.clear()
        run_state_machine_as_test(SGLangPipelineFuzzer, settings=fuzz_settings(2, 30))
    assert used == {None, "tenant-b"}


def test_bench_lifecycle_side_by_side_runs_both_pipelines() -> None:
    from stagefate.bench import lifecycle

    section = lifecycle.run_side_by_side("sglang==0.5.23", prefetches=5)
    header, _rule, row = section.body.split("\n")[:3]
    assert "stagefate, median µs" in header and "SGLang / stagefate" in header
    assert row.startswith("| 0.5.23 |")


def test_fuzz_target_sglang_without_the_install_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.metadata

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.setenv("STAGEFATE_TARGETS", "/nonexistent")  # no release environments either
    assert main(["fuzz", "--target", "sglang", "--steps", "10"]) == 2
    assert "make sglang" in capsys.readouterr().err


def test_an_unknown_target_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--target", "vllm"]) == 2
    assert "unknown target 'vllm'; choose one of stagefate, sglang" in capsys.readouterr().err


@pytest.mark.slow
def test_fuzz_target_sglang_logs_and_checks_its_design(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every program's design log is checked at teardown; --log keeps the last one's. The stop
    policy is pinned to the one the designs describe: with every field drawn, the first twenty
    programs of seed 0 may take no edge under it (so CI found once it wrote no log at all)."""
    log = tmp_path / "sglang.jsonl"
    argv = ["fuzz", "--target", "sglang", "--steps", "2000", "--log", str(log), *LOOK_PAST]
    assert main([*argv, "--config", "prefetch_policy=wait_complete"]) == 0
    assert "every program's run followed SGLang's own design" in capsys.readouterr().out
    design = str(DEFAULT_SPEC_PATH.parent / "designs" / "sglang-0.5.23.yaml")
    assert main(["validate", "--spec", design, str(log)]) == 0


def test_a_simulated_host_pool_builds_whatever_memory_the_machine_has_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SGLang refuses a host pool larger than the machine's free memory; a replay died there
    while another program used memory (issue 41). The pools here are a few bytes a token: the
    check is answered (:mod:`stagefate.targets.sglang.shim`), nothing else changes."""
    from sglang.srt.mem_cache.pool_host import base

    # what the machine reported then: less free than SGLang's reserve
    monkeypatch.setattr(base, "available_host_memory_bytes", lambda **_: 0)
    driver = stepped_sglang(page_size=4, device_tokens=64)
    try:
        assert driver.baseline_host > 0
    finally:
        driver.close()
