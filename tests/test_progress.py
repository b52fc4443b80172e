"""A hit the bounce buffer can never hold (issue 54): the spec declines it at the IO commit
(``declined_host_oversize``), and the model checker's ``progress`` invariant is what proves no
record can wait for ever. Without the decline the same checker finds the hole SGLang 0.5.19 to
0.5.21 had: the hit parks for ever, and every later hit parks behind it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from stagefate import BufferPipeline, MemoryStorage
from stagefate.spec import load_spec
from stagefate.spec.load import DEFAULT_SPEC_PATH, parse_spec
from stagefate.spec.model_world import Bounds
from stagefate.spec.modelcheck import ModelChecker
from stagefate.testing import settle

from .harness import assert_quiescent, config, seq_of

SMALL = Bounds(pages=3, requests=2, host_pages=1, device_pages=3, cap_pages=1, threshold_pages=1)
"""A world where a span of two or three pages can never fit a one-page bounce."""


def _without_the_decline() -> Any:
    """The shipped spec as it was before the decline: no ``span_oversize`` branch."""
    document = yaml.safe_load(DEFAULT_SPEC_PATH.read_text(encoding="utf-8"))
    for row in document["transitions"]:
        row["branches"] = [b for b in row["branches"] if b.get("guard") != "span_oversize"]
    del document["guards"]["span_oversize"]
    del document["reasons"]["declined_host_oversize"]
    for family in document["diagram"]["families"]:
        family["reasons"] = [r for r in family["reasons"] if r != "declined_host_oversize"]
    return parse_spec(document)


def test_the_model_checker_finds_a_hit_that_parks_for_ever_without_the_decline() -> None:
    result = ModelChecker(_without_the_decline(), SMALL).run()
    assert result.invariant == "progress"
    assert result.violation is not None and "'parked' never ends" in result.violation
    assert "nothing moves" in result.violation
    steps = result.counterexample or []
    # issue, the query completes with the whole span, the commit parks it: then nothing moves
    assert steps[0] == "r0: prefetch_from_storage"
    assert any("exists completes full" in step for step in steps)
    assert steps[-1].endswith("IO commit (poll)")


def test_every_record_ends_under_the_shipped_spec_at_the_same_bounds() -> None:
    result = ModelChecker(load_spec(), SMALL).run()
    assert result.violation is None, (result.violation, result.counterexample)
    assert ("no_anchor", "commit", "span_oversize") in result.edges


def _stored(pipe_tokens: int, host_tokens: int) -> tuple[BufferPipeline, list[int]]:
    storage = MemoryStorage()
    producer = BufferPipeline(config(), storage=storage)
    seq = seq_of(pipe_tokens, 1)
    slots = producer.device_pool.alloc(len(seq))
    assert slots is not None
    producer.write_through(seq, slots)
    return BufferPipeline(config(host_tokens=host_tokens), storage=storage), seq


@pytest.mark.invariant("exactly_once_end")
def test_a_span_larger_than_the_whole_bounce_is_declined_and_does_not_block_later_hits() -> None:
    consumer, seq = _stored(12, host_tokens=8)
    consumer.prefetch_from_storage("long", seq, 0)
    settle(consumer)
    assert consumer.state("long") is None and not consumer.prefetch_pending("long")
    assert consumer.stats.declined_host_oversize == 1
    assert consumer.retry_pending("long") is False  # the pool's size never changes: no retry
    consumer.prefetch_from_storage("short", seq[:6], 0)  # a later hit that fits reads at once
    settle(consumer)
    assert consumer.has_hold("short")
    consumer.release_staged_hold("short")
    assert consumer.stats.parked == 0
    assert_quiescent(consumer)
