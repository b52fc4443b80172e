"""The stateful fuzzer over the real pipeline, at the active Hypothesis profile (``ci``: fast)."""

from __future__ import annotations

import pytest

from stagefate.fuzz.invariants import InvariantViolated
from stagefate.fuzz.machine import PipelineFuzzer
from stagefate.fuzz.world import KNOB_CHOICES, PAGE, mark

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


def test_a_program_runs_under_the_knobs_it_drew() -> None:
    fuzzer = PipelineFuzzer()
    fuzzer.setup(window=None, knobs={"host_tokens": 4, "dedup_inflight": False})
    config = fuzzer.pipe.config
    assert (config.host_tokens, config.dedup_inflight) == (4, False)
    assert config.retry_max_attempts == KNOB_CHOICES["retry_max_attempts"][0]  # not drawn


def test_a_retracted_request_prefetches_its_prompt_again_under_its_id() -> None:
    fuzzer = PipelineFuzzer()
    fuzzer.setup(window=None)
    fuzzer.issue(request_id="r0", sequence=0, pages=4, salt=None, stale=False)
    fuzzer.complete_all_io()
    fuzzer.complete_all_io()
    assert not fuzzer._retractable()  # staged: not running yet
    fuzzer.admit(request_id="r0")
    fuzzer.complete_all_io()  # the load back lands: r0 runs
    assert "r0" not in fuzzer.pipe.records and fuzzer._retractable() == ["r0"]
    fuzzer.evict(tokens=40)  # its KV left the device while it was out of the batch
    fuzzer.retract(request_id="r3")  # the draw falls through to the one retractable request
    assert fuzzer.pipe.records["r0"].tokens.tolist() == fuzzer.asked["r0"][0]  # the same prompt
    assert not fuzzer._retractable()
