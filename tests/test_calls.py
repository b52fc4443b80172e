"""Which scheduler call fires which events is declared once, under ``calls`` in the spec, and
read by the pipeline (``_call``), the model checker (its counterexamples name the calls) and
the generated programs' world (``LineWorld``, one method per event the model steps on)."""

from __future__ import annotations

from typing import Any

import pytest

from stagefate import BufferPipeline, PipelineConfig
from stagefate.spec import SpecError, load_spec, parse_spec
from stagefate.spec.model_world import Bounds, Step
from stagefate.spec.modelcheck import ModelChecker
from stagefate.statemachine.errors import IncompleteImplementation
from stagefate.testing import LineWorld, make_pair, settle
from tests.harness import config, seq_of, spec_document


def test_the_lifecycle_binds_each_call_and_an_unknown_event_is_refused() -> None:
    calls = load_spec().calls
    assert calls["init_load_back"] == ("make_room", "consume")
    assert calls["release_aborted_request"] == ("abort",)
    doc = spec_document()
    doc["calls"]["release_staged_hold"] = ["release"]
    with pytest.raises(SpecError, match="'release_staged_hold' fires \\['release'\\]"):
        parse_spec(doc)


def test_the_pipeline_fires_what_the_spec_binds() -> None:
    """Bound to ``abort``, releasing a hold ends it ``aborted``, not ``released``."""
    doc = spec_document()
    doc["calls"]["release_staged_hold"] = ["abort"]
    cfg = config(page_size=4)
    pair = make_pair(cfg)
    tokens = seq_of(2, 4)
    pair.publish(tokens, mark=3)
    consumer = BufferPipeline(cfg, storage=pair.storage, spec=parse_spec(doc))
    consumer.prefetch_from_storage("r", tokens, 0)
    settle(consumer)
    assert consumer.has_hold("r") and consumer.release_staged_hold("r")
    assert (consumer.stats.aborted, consumer.stats.released) == (1, 0)


def test_a_spec_without_a_call_the_pipeline_makes_is_refused() -> None:
    doc = spec_document()
    del doc["calls"]["try_lock_anchor"]
    with pytest.raises(IncompleteImplementation, match="binds no events to the calls try_lock"):
        BufferPipeline(PipelineConfig(), spec=parse_spec(doc))


def test_counterexamples_and_the_line_world_name_the_bound_calls() -> None:
    spec = load_spec()
    checker = ModelChecker(spec, Bounds())
    assert checker.describe(Step("event", 0, "lock")) == "r0: try_lock_anchor"
    assert checker.describe(Step("live", 1, "consume")) == "r1: init_load_back(live prefix)"
    world = LineWorld(Bounds())
    called: list[str] = []

    class Recording:
        def __getattr__(self, name: str) -> Any:
            called.append(name)
            return getattr(world_pipe, name)

    world_pipe = world.pipe
    world.pipe = Recording()  # type: ignore[assignment]
    for call, events in spec.calls.items():
        step = events[-1] if call != "poll" else "poll"
        called.clear()
        try:
            method = getattr(world, step)
            method() if call == "poll" else method(0)
        except Exception:  # r0 is not issued: the binding is what is asked, not the outcome
            pass
        assert call in called, f"LineWorld.{step} does not make {call}"
