"""What the device path must do on every device: the bounce is pinned when a GPU is present,
loads run on their own stream, an ack never fires before its copy has landed, and the stateful
fuzzer's invariants hold with real device pools. ``cpu`` always runs; ``cuda`` runs where torch
sees a GPU (scripts/gpu-check runs these there)."""

from __future__ import annotations

import time

import torch
from hypothesis.stateful import run_state_machine_as_test

from stagefate.fuzz.fuzzer import configured
from stagefate.runtime import HostPool, KVLayout

from .harness import assert_quiescent, fuzz_settings, kv_marks, staged_with_threaded_io

STALL_CYCLES = 2_000_000_000
"""About a second of GPU clock: long enough that a poll before it ends must see the copy pending."""


def test_bounce_is_pinned_exactly_when_a_gpu_is_present(device: str) -> None:
    host = HostPool(KVLayout(layers=1, kv_heads=1, head_dim=4), 8)
    assert host.kv.is_pinned() == torch.cuda.is_available()
    assert host.kv.device.type == "cpu"


def test_a_load_runs_on_its_own_stream_and_its_ack_waits_for_the_copy(device: str) -> None:
    pipe, seq = staged_with_threaded_io(8)
    assert pipe.device_pool.device.type == device
    copy_stream = pipe.copy.stream
    if device == "cuda":
        assert copy_stream is not None and copy_stream != torch.cuda.current_stream()
        with torch.cuda.stream(copy_stream):
            torch.cuda._sleep(STALL_CYCLES)  # the H2D queues behind this: a slow copy
    else:
        assert copy_stream is None  # the CPU copy is synchronous: done when queued
    assert pipe.plan_staged_splice("r", 0) == (len(seq), 0)
    tail = pipe.init_load_back("r", torch.empty(0, dtype=torch.int64))
    assert tail.numel() == len(seq) and pipe.state("r") == "consumed"
    if device == "cuda":
        assert copy_stream is not None
        for _ in range(5):  # polled early and often: the event has not completed
            pipe.poll()
            assert pipe.state("r") == "consumed"
        assert not copy_stream.query()
        assert torch.cuda.current_stream().query()  # the caller's stream was never blocked
        copy_stream.synchronize()
    deadline = time.monotonic() + 10
    while pipe.state("r") is not None and time.monotonic() < deadline:
        pipe.poll()
    assert pipe.state("r") is None and pipe.stats.filled == 1
    assert kv_marks(pipe, pipe.tree.match_prefix(seq).device_indices) == [9.0] * len(seq)
    assert_quiescent(pipe)
    pipe.io.close()


def test_the_stateful_fuzzer_holds_on_the_device(device: str) -> None:
    """A short campaign with the device and aux pools on ``device`` (every invariant, including
    device bytes == tokens, after every step)."""
    run_state_machine_as_test(
        configured(device=device), settings=fuzz_settings(examples=6, steps=40)
    )
