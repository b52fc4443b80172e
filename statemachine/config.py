"""``PipelineConfig``: every knob of a :class:`BufferPipeline`, validated with the fix named."""

from __future__ import annotations

import zlib
from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Strict, field_validator, model_validator

from ..runtime.pools import KVLayout

Count = Annotated[int, Strict()]
"""An int and nothing else: ``True``, ``64.0`` or ``"64"`` is a mistake, not a count."""

_DTYPE_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


class PipelineConfig(BaseModel):
    """Every knob of a :class:`BufferPipeline` (pools, page size, thresholds, retries, dedup),
    each refused with its fix when out of range."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    page_size: Count = 1
    layers: Count = 2
    kv_heads: Count = 1
    head_dim: Count = 4
    dtype: torch.dtype = torch.float16
    device_tokens: Count = 64
    host_tokens: Count = 64
    sliding_window: int | None = None
    """Tokens of the sliding-window (aux) KV a staged fetch carries; None: no aux pool."""
    device: str = "auto"
    io: Literal["manual", "threaded"] = "manual"
    io_workers: Count = 2
    prefetch_threshold: Count = 1
    anchor_lock_cap_fraction: float = 0.5
    max_context_len: Count = 32
    retry_interval: Count = 8
    retry_max_attempts: Count = 12
    """Paced retries a request may make. SGLang 0.5.20+ ships 8 (at 8 passes: 64 passes); under
    overload a request waits hundreds of passes, spends them deep in the queue, and has none left
    when its device prefix is evicted or a sibling's hold was never spliced (docs/sglang.md,
    "Live against the best release at each load"). Of the budgets tried (8, 10, 12, 16, 24), 12 is
    the smallest at which live meets every release on every figure of the replay sweep."""
    retry_head_at_once: bool = True
    """The head of the waiting queue re-issues a paced retry at once instead of after the
    interval. False, as SGLang's scheduler does ("a speculative miss must never delay the
    queue head"), where a request waits for its prefetch before admission (SGLang's engine
    under ``wait_complete``): there a re-issued head would wait one more existence query."""
    storage: str = "memory"
    """The L3 when none is passed: ``memory``, ``file:PATH`` or ``mooncake://HOST:PORT``."""
    tp_size: Count = 1
    """Tensor-parallel ranks; each holds ``kv_heads / tp_size`` heads and agrees with the others
    through a :class:`~stagefate.statemachine.group.Group` (docs/tensor-parallel.md)."""
    tp_rank: Count = 0
    dedup_inflight: bool = True
    """Decline a read whose head (first page) a live sibling is already fetching, wait for
    it, and read only the rest once it has landed."""
    check_oracle: bool = False
    """Run the ``transitions`` oracle in lockstep; any disagreement raises (slow; for fuzzing)."""

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, value: object) -> torch.dtype:
        if isinstance(value, str):
            if value not in _DTYPE_NAMES:
                raise ValueError(
                    f"dtype {value!r} is not supported; use one of {list(_DTYPE_NAMES)}"
                )
            return _DTYPE_NAMES[value]
        if not isinstance(value, torch.dtype):
            raise ValueError(f"dtype must be a torch.dtype such as torch.float16, got {value!r}")
        if value not in _DTYPE_NAMES.values():
            # the pools, the copy engine and every L3 backend move these; others (fp8, ints)
            # would fail at the first write-through, after the work began
            raise ValueError(
                f"dtype {value} is not one that stagefate's pools and every L3 backend "
                f"store; use one of {[str(dtype) for dtype in _DTYPE_NAMES.values()]}"
            )
        return value

    @field_validator("page_size", "layers", "kv_heads", "head_dim", "io_workers", "tp_size")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"must be at least 1, got {value}")
        return value

    @field_validator(
        "device_tokens",
        "host_tokens",
        "prefetch_threshold",
        "max_context_len",
        "retry_interval",
        "retry_max_attempts",
    )
    @classmethod
    def _non_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"must be 0 or more, got {value}")
        return value

    @field_validator("anchor_lock_cap_fraction")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"must lie in [0, 1] (a share of the device pool), got {value}")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value != "auto" and not value.startswith(("cpu", "cuda")):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {value!r}")
        return value

    @model_validator(mode="after")
    def _aligned(self) -> PipelineConfig:
        page = self.page_size
        for name in ("device_tokens", "host_tokens"):
            if getattr(self, name) < page:
                # a bounce smaller than a page can stage nothing: every hit would be declined
                raise ValueError(
                    f"{name}={getattr(self, name)} is smaller than one page "
                    f"(page_size={page}): the pool could hold nothing; give it at least {page}"
                )
            if getattr(self, name) % page:
                raise ValueError(
                    f"{name}={getattr(self, name)} is not a multiple of page_size={page}; "
                    f"round it to whole pages"
                )
        if self.sliding_window is not None and (
            self.sliding_window < 1 or self.sliding_window % page
        ):
            raise ValueError(
                f"sliding_window={self.sliding_window} must be a positive multiple of "
                f"page_size={page} (or None for no aux window)"
            )
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(
                f"tp_rank={self.tp_rank} must lie in [0, tp_size={self.tp_size}): one "
                f"pipeline per rank, numbered from 0"
            )
        if self.kv_heads % self.tp_size:
            raise ValueError(
                f"kv_heads={self.kv_heads} is not divisible by tp_size={self.tp_size}: each "
                f"rank holds kv_heads / tp_size heads; pick a tp_size that divides it"
            )
        return self

    @property
    def rank_kv_heads(self) -> int:
        """The KV heads this rank holds (its shard)."""
        return self.kv_heads // self.tp_size

    @property
    def layout(self) -> KVLayout:
        """The KV layout of this rank's pools and L3 pages (its shard of the heads)."""
        return KVLayout(self.layers, self.rank_kv_heads, self.head_dim, self.dtype)

    def fingerprint(self) -> int:
        """A digest of every field but the rank's own (``tp_rank``, ``device``)."""
        shared = sorted((k, repr(v)) for k, v in self if k not in ("tp_rank", "device"))
        return zlib.crc32(repr(shared).encode())

    @property
    def anchor_lock_cap(self) -> int:
        """Tokens that prefetch anchor pins may protect at once."""
        by_fraction = int(self.anchor_lock_cap_fraction * self.device_tokens)
        return max(0, min(by_fraction, self.device_tokens - self.max_context_len))
