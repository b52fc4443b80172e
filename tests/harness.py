"""The suite's configs and device selection; the producer/consumer pair, settle and the
whole-state assertions come from :mod:`stagefate.testing` (re-exported here)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import yaml
from hypothesis import HealthCheck, Phase, settings

from stagefate import BufferPipeline, MemoryStorage, PipelineConfig
from stagefate.spec.load import DEFAULT_SPEC_PATH
from stagefate.testing import Pair, assert_quiescent, kv_marks, make_pair, settle

__all__ = [
    "Pair",
    "assert_quiescent",
    "config",
    "fuzz_settings",
    "kv_marks",
    "make_pair",
    "seq_of",
    "settle",
    "staged_with_threaded_io",
]


def _devices() -> list[str]:
    """``cpu`` always, ``cuda`` when torch sees a GPU; ``STAGEFATE_TEST_DEVICES=cuda`` (as
    scripts/gpu-check sets it) keeps only the listed ones."""
    found = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    wanted = os.environ.get("STAGEFATE_TEST_DEVICES")
    if wanted is None:
        return found
    chosen = [name for name in wanted.split(",") if name in found]
    if not chosen:
        raise RuntimeError(f"STAGEFATE_TEST_DEVICES={wanted!r}, but this machine has {found}")
    return chosen


DEVICES = _devices()
_current_device = ["cpu"]


@contextlib.contextmanager
def on_device(name: str) -> Iterator[None]:
    """Pipelines that :func:`config` builds inside the block put their device pools on ``name``."""
    previous = _current_device[0]
    _current_device[0] = name
    try:
        yield
    finally:
        _current_device[0] = previous


def current_device() -> str:
    return _current_device[0]


def config(page_size: int = 1, window: int | None = None, **overrides: object) -> PipelineConfig:
    base: dict[str, object] = dict(
        page_size=page_size,
        layers=2,
        kv_heads=1,
        head_dim=4,
        dtype=torch.float16,
        device_tokens=64 * page_size,
        host_tokens=64 * page_size,
        sliding_window=window,
        device=current_device(),
        io="manual",
        prefetch_threshold=1,
        anchor_lock_cap_fraction=0.5,
        max_context_len=32 * page_size,
        retry_interval=8,
        retry_max_attempts=8,
        check_oracle=True,
    )
    base.update(overrides)
    return PipelineConfig(**base)  # type: ignore[arg-type]


def seq_of(pages: int, page_size: int, start: int = 1) -> list[int]:
    return list(range(start, start + pages * page_size))


def fuzz_settings(examples: int, steps: int) -> settings:
    """A short, derandomized fuzz run that stops at the first failure (no shrinking)."""
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def staged_with_threaded_io(tokens: int) -> tuple[BufferPipeline, list[int]]:
    """A consumer with threaded IO whose request ``r`` staged ``tokens`` tokens (marked 9) that
    a producer wrote through; the IO threads do the work, this thread only polls."""
    storage = MemoryStorage()
    cfg = config(io="threaded")
    producer, consumer = BufferPipeline(cfg, storage=storage), BufferPipeline(cfg, storage=storage)
    seq = seq_of(tokens, 1)
    slots = producer.device_pool.alloc(len(seq))
    assert slots is not None
    producer.device_pool.kv[:, :, slots] = 9
    producer.write_through(seq, slots)
    consumer.prefetch_from_storage("r", seq, 0)
    deadline = time.monotonic() + 10
    while consumer.state("r") != "staged" and time.monotonic() < deadline:
        consumer.poll()
        time.sleep(0.001)
    assert consumer.state("r") == "staged"
    return consumer, seq


def spec_document() -> dict[str, Any]:
    """The shipped ``lifecycle.yaml`` as a fresh dict, for a test to edit into another spec."""
    loaded: dict[str, Any] = yaml.safe_load(DEFAULT_SPEC_PATH.read_text(encoding="utf-8"))
    return loaded


SGLANG_STILL_OPEN = ("id_reuse", "unusable_fetch")
"""The ``fuzz --set-aside`` names of the SGLang findings still in 0.5.23
(docs/sglang-findings.md), which the SGLang campaigns' tests look past with their fixes."""


@contextlib.contextmanager
def looking_past_sglangs_open_findings() -> Iterator[None]:
    """The proposed fixes of :data:`SGLANG_STILL_OPEN`'s findings, applied to SGLang."""
    from stagefate.targets.sglang.findings import proposed_fixes, set_aside

    with contextlib.ExitStack() as fixes:
        for fix in proposed_fixes(set_aside(SGLANG_STILL_OPEN)):
            fixes.enter_context(fix())
        yield


def engine_target(version: str) -> Any:
    """SGLang ``version``'s installed release, when its engine serves here (its install
    recorded so); else the test skips, naming the command that fixes it."""
    from stagefate.targets.sglang.engine.serving import check_command, recorded
    from stagefate.targets.sglang.environments import install_command, installed

    target = installed().get(version)
    if target is None:
        pytest.skip(f"SGLang {version} is not installed: {install_command(version)}")
    check = recorded(target)
    if check is None:
        pytest.skip(f"SGLang {version}'s engine was never checked: {check_command(version)}")
    if not check.serves:
        pytest.skip(f"SGLang {version}'s engine does not serve here: {check.detail}")
    return target
