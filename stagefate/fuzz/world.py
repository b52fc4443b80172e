"""The world both stateful fuzzers run in: sequences that share heads, two namespaces, and KV
whose every value names its token and namespace.

Three token sequences share heads (so anchors collide and nodes split), in two namespaces. A
producer writes all of them through to L3 first, with KV whose every value is the token id plus
:data:`MARK_STRIDE` per namespace (:func:`mark`): any device slot a consumer's tree maps can then
be checked against the tokens it claims to hold, which catches a splice at the wrong offset, an
untrimmed head or a cross-namespace reuse as a byte mismatch. stagefate's fuzzer
(:mod:`.fuzzer`) and SGLang's (:mod:`stagefate.targets.sglang.fuzzer`) use the same marks and
namespaces; each picks its page size and how much its sequences share (:func:`sequences`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..runtime import MemoryStorage
from ..statemachine.config import PipelineConfig
from ..statemachine.pipeline import BufferPipeline
from ..statemachine.speeds import LoadSpeeds

NAMESPACES: tuple[str | None, ...] = (None, "tenant-b")
"""The namespaces (``cache_salt`` here, SGLang's ``extra_key``) requests are issued under."""
MARK_STRIDE = 1000
"""A namespace's offset in a mark: token ids stay below it, and marks stay exact in float16."""


def sequences(
    page: int, shared_pages: Sequence[int], tails: Sequence[int]
) -> tuple[list[int], ...]:
    """A head of 8 pages (token ids 1, 2, …), then for each ``shared_pages[i]`` a sequence of 8
    pages that shares that many pages of the head and continues with ids from ``tails[i]``."""
    head = list(range(1, 8 * page + 1))
    return (
        head,
        *(
            head[: shared * page] + list(range(tail, tail + (8 - shared) * page))
            for shared, tail in zip(shared_pages, tails, strict=True)
        ),
    )


def mark(
    tokens: Sequence[int] | torch.Tensor, namespace: str | None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The KV every slot of ``tokens`` holds under ``namespace``."""
    ids = tokens if isinstance(tokens, torch.Tensor) else torch.tensor(list(tokens))
    return ids.to(dtype) + MARK_STRIDE * NAMESPACES.index(namespace)


PAGE = 2
"""stagefate's fuzzer's page size."""
SEQUENCES = sequences(PAGE, shared_pages=(3, 5), tails=(100, 200))
"""stagefate's fuzzer's sequences: 8 pages each, sharing 3 and 5 pages of the first."""


KNOB_CHOICES: Mapping[str, tuple[Any, ...]] = {
    "host_tokens": (12, 4, 32),
    "prefetch_threshold": (2 * PAGE, 1, 8 * PAGE + 1),
    "anchor_lock_cap_fraction": (0.25, 0.0, 1.0),
    "retry_interval": (2, 0, 5),
    "retry_max_attempts": (4, 0, 1),
    "dedup_inflight": (True, False),
}
"""The :class:`PipelineConfig` fields each program of stagefate's fuzzer draws: the bounce
buffer (12 tokens holds no whole sequence, 4 not even two pages, 32 two sequences), the
threshold (``8 * PAGE + 1``: nothing is fetched), the anchor-lock cap (0: never pin), retry
pacing and budget (0: none), in-flight dedup. Each field's first choice is the world before
knobs were drawn, so a failure shrinks towards it."""


def fuzz_config(window: int | None = None, device: str = "cpu", **knobs: Any) -> PipelineConfig:
    """The fuzz world's configuration, with ``knobs`` (fields of :data:`KNOB_CHOICES`) set."""
    settings: dict[str, Any] = {name: choices[0] for name, choices in KNOB_CHOICES.items()}
    settings.update(knobs)
    return PipelineConfig(
        page_size=PAGE,
        sliding_window=window,
        layers=1,
        kv_heads=1,
        head_dim=1,
        dtype=torch.float32,
        device_tokens=24,
        device=device,
        io="manual",
        max_context_len=16,
        check_oracle=True,
        **settings,
    )


_L3: dict[int | None, tuple[list[str], list[torch.Tensor]]] = {}


def l3_contents(window: int | None) -> tuple[list[str], list[torch.Tensor]]:
    """What L3 holds when a program starts (every page-aligned prefix of every sequence, in
    each namespace, with its aux window), written by a producer pipeline once per window and
    replayed into each program's storage (the same keys and bytes, without the producer)."""
    found = _L3.get(window)
    if found is None:
        storage = MemoryStorage()
        producer = BufferPipeline(fuzz_config(window), storage=storage)
        for salt in NAMESPACES:
            for sequence in SEQUENCES:
                for end in range(PAGE, len(sequence) + 1, PAGE):
                    write_marked(producer, sequence[:end], salt, window)
        objects = storage.snapshot()
        keys = sorted(objects)
        found = _L3[window] = (keys, [objects[key] for key in keys])
    return found


_EXPECTED: dict[tuple[str | None, tuple[int, ...]], torch.Tensor] = {}


def expected_mark(salt: str | None, tokens: list[int]) -> torch.Tensor:
    """:func:`mark` of a node's tokens, remembered (the fuzzer's sequences are few and fixed)."""
    key = (salt, tuple(tokens))
    found = _EXPECTED.get(key)
    if found is None:
        found = _EXPECTED[key] = mark(tokens, salt)
    return found


def write_marked(
    producer: BufferPipeline, tokens: list[int], salt: str | None, window: int | None
) -> None:
    """The producer computes ``tokens`` (KV = :func:`mark`) and writes them through to L3."""
    slots = producer.device_pool.alloc(len(tokens))
    assert slots is not None
    values = mark(tokens, salt)[None, None, :, None, None]
    values = values.to(producer.device_pool.device)
    producer.device_pool.kv[:, :, slots] = values
    aux = None
    if window is not None and producer.aux_pool is not None:
        aux = producer.aux_pool.alloc(min(window, len(tokens)))
        assert aux is not None
        producer.aux_pool.kv[:, :, aux] = values[:, :, len(tokens) - aux.numel() :]
    producer.write_through(tokens, slots, cache_salt=salt, aux_indices=aux)
    producer.device_pool.free(slots)
    if aux is not None and producer.aux_pool is not None:
        producer.aux_pool.free(aux)


def measure(speeds: LoadSpeeds, measured: str, tokens: int, seconds: float) -> None:
    """What a fuzzer's engine reports of its speeds: a read's time (``load``), a forward's
    (``forward``), or that it starts measuring afresh (``nothing yet``)."""
    if measured == "load":
        speeds.observe_load(tokens, seconds)
    elif measured == "forward":
        speeds.observe_forward(tokens, seconds)
    else:
        speeds.forget()
