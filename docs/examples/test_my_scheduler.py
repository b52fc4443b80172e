"""An engine developer's integration test: only the public API and ``stagefate.testing``.

Copy it next to your scheduler's tests and replace the calls marked "your scheduler" with yours.
Run it with ``pytest docs/examples/test_my_scheduler.py`` (stagefate's own suite runs it too).
"""

from __future__ import annotations

import torch

from stagefate import PipelineConfig
from stagefate.testing import assert_quiescent, kv_marks, make_pair, settle, step_io

PAGE = 4


def _config() -> PipelineConfig:
    return PipelineConfig(
        page_size=PAGE,
        layers=2,
        kv_heads=1,
        head_dim=4,
        dtype=torch.float16,
        device_tokens=64 * PAGE,
        host_tokens=64 * PAGE,
        device="cpu",
        io="manual",  # the test decides when each storage read and copy completes
        max_context_len=32 * PAGE,
    )


def test_a_sibling_publishes_the_head_while_the_read_is_in_flight() -> None:
    pair = make_pair(_config())
    prompt = list(range(1, 1 + 8 * PAGE))  # 8 pages
    pair.publish(prompt, mark=7.0)  # another instance computed it and wrote it to L3
    pipe = pair.consumer

    assert pipe.prefetch_from_storage("req", prompt, 0) == "no_anchor"  # your scheduler, arrival
    step_io(pipe, "exists")  # L3 answers: all 8 pages are there; poll() commits the read
    assert pipe.state("req") == "reading"

    pair.sibling_insert(prompt[: 3 * PAGE], mark=3.0)  # meanwhile a sibling computes 3 pages
    step_io(pipe, "read")  # the read lands in the bounce
    assert pipe.state("req") == "staged"

    # your scheduler, admission: plan against the live prefix, then splice after it
    prefix = pipe.tree.match_prefix(prompt)
    kv_tokens, _swa = pipe.plan_staged_splice("req", prefix.length)
    assert (prefix.length, kv_tokens) == (3 * PAGE, 5 * PAGE)  # only the tail is charged
    tail = pipe.init_load_back("req", prefix.device_indices)
    settle(pipe)  # the H2D copy completes and its ack releases the hold

    assert pipe.stats.filled == 1 and pipe.stats.trimmed_tokens == 3 * PAGE
    assert kv_marks(pipe, prefix.device_indices) == [3.0] * (3 * PAGE)  # the sibling's bytes
    assert kv_marks(pipe, tail) == [7.0] * (5 * PAGE)  # L3's bytes, spliced after them
    assert_quiescent(pipe)  # no pin, no hold, no slot left; every read settled


def test_an_abort_during_the_read_frees_the_bounce_when_it_lands() -> None:
    pair = make_pair(_config())
    prompt = list(range(1, 1 + 4 * PAGE))
    pair.publish(prompt, mark=5.0)
    pipe = pair.consumer
    pipe.prefetch_from_storage("req", prompt, 0)
    step_io(pipe, "exists")
    pipe.release_aborted_request("req")  # your scheduler, the client went away
    assert pipe.state("req") == "abandoned"
    step_io(pipe, "read")  # the read still lands; only then is its bounce freed
    assert pipe.state("req") is None
    assert pipe.wasted_by_reason() == {"aborted": (1, 4 * PAGE)}
    assert_quiescent(pipe)
