"""The stateful fuzzer over the real pipeline, at the active Hypothesis profile (``ci``: fast)."""

from __future__ import annotations

import pytest

from stagefate.fuzz.invariants import InvariantViolated
from stagefate.fuzz.machine import PipelineFuzzer
from stagefate.fuzz.world import PAGE, mark

TestPipelineFuzz = PipelineFuzzer.TestCase


def _world_with_a_published_prefix() -> PipelineFuzzer:
    fuzzer = PipelineFuzzer()
    fuzzer.setup(window=None)
    fuzzer.sibling_publish(sequence=0, pages=3, salt="tenant-b")
    return fuzzer


def test_namespace_isolation_catches_a_slot_holding_another_namespaces_kv() -> None:
    fuzzer = _world_with_a_published_prefix()
    fuzzer.namespace_isolation()  # the clean world passes
    node = fuzzer.pipe.tree.nodes()[0]
    slot = int(node.value[1])
    fuzzer.pipe.device_pool.kv[:, :, slot] = float(mark([node.tokens()[1]], None)[0])
    with pytest.raises(InvariantViolated, match="namespace_isolation: KV of another namespace"):
        fuzzer.namespace_isolation()


def test_plan_equals_consume_catches_a_splice_of_another_size() -> None:
    fuzzer = PipelineFuzzer()
    fuzzer.setup(window=None)
    fuzzer.issue(request_id="r0", sequence=0, pages=4, salt=None, stale=False)
    fuzzer.complete_all_io()  # the existence query; the commit launches the read
    fuzzer.complete_all_io()  # the read: staged
    fuzzer.admit(request_id="r0")
    record = fuzzer.pipe.records["r0"]
    assert record.state == "consumed"
    fuzzer.plan_equals_consume()
    record.plan_prefix = 0 if record.plan_prefix else PAGE  # charged at the plan: another size
    with pytest.raises(InvariantViolated, match="plan_equals_consume"):
        fuzzer.plan_equals_consume()
