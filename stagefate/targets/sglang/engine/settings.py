"""How stagefate starts SGLang's engine here: its arguments and its environment.

The arguments are the ones that serve on a CPU (docs/sglang.md, "SGLang's engine"): the torch
attention and sampling backends, no CUDA graph, token ids in and out (no tokenizer), the
``direct`` IO backend with the ``layer_first`` layout (``kernel`` and ``page_first`` need
sgl_kernel's ops). Buffer mode is ``hicache_host_memory_mode="buffer_only"`` over the ``file``
L3 backend, which forces write-through; SGLang's cache report is on, so each answer carries its
device / host / storage split.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ....integrations.sglang.settings import VARIABLE

PrefetchPolicy = Literal["best_effort", "wait_complete", "timeout"]
Lifecycle = Literal["sglang", "stagefate"]
PREFETCH_POLICIES: tuple[PrefetchPolicy, ...] = ("best_effort", "wait_complete", "timeout")
BOOT = Path(__file__).resolve().parent / "boot"
"""The folder whose ``sitecustomize`` puts the stand-ins in place in every engine process."""
PACKAGE_ROOT = Path(__file__).resolve().parents[4]


@dataclass(frozen=True)
class EngineSettings:
    """One engine's configuration; the defaults serve the tiny model with buffer mode on."""

    buffer_mode: bool = True
    """HiCache buffer mode over a file L3 (False: no HiCache, the device tree alone)."""
    lifecycle: Lifecycle = "sglang"
    """Whose buffer-mode pipeline decides staged fetches: SGLang's own, or stagefate's
    (:mod:`stagefate.integrations.sglang`, over its own L3 in the same folder)."""
    prefetch_policy: PrefetchPolicy = "wait_complete"
    max_total_tokens: int = 8192
    """The device pool, in tokens: small enough and the tree evicts under concurrent requests."""
    page_size: int = 4
    max_running_requests: int = 8
    chunked_prefill_size: int = 1024
    host_ratio: float = 2.0
    """The bounce buffer's size against the device pool's."""
    prefetch_timeout_s: float = 2.0
    """The ``timeout`` policy's base wait (SGLang's ``prefetch_timeout_base``)."""
    metrics_port: int | None = None
    """With stagefate's lifecycle: serve its Prometheus metrics from the scheduler's process
    on this port of 127.0.0.1."""
    context_length: int | None = None
    """SGLang's ``context_length`` (None: the model's, 4,096). With the device pool it sets
    the anchor-lock cap: ``min(0.5 × pool, pool - context_length)`` pinned tokens."""

    def __post_init__(self) -> None:
        if self.prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(
                f"prefetch_policy {self.prefetch_policy!r}: SGLang's policies are "
                f"{', '.join(PREFETCH_POLICIES)}"
            )
        if self.lifecycle not in ("sglang", "stagefate"):
            raise ValueError(f"lifecycle {self.lifecycle!r}: choose 'sglang' or 'stagefate'")
        if self.lifecycle == "stagefate" and not self.buffer_mode:
            raise ValueError("lifecycle='stagefate' is buffer mode's pipeline: keep buffer_mode")
        for name in ("max_total_tokens", "page_size", "max_running_requests"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def arguments(self, model: Path) -> dict[str, Any]:
        """``sglang.Engine``'s keyword arguments (also the HTTP server's, as flags)."""
        arguments: dict[str, Any] = {
            "model_path": str(model),
            "load_format": "safetensors",
            "skip_tokenizer_init": True,
            "device": "cpu",
            "attention_backend": "torch_native",
            "sampling_backend": "pytorch",
            "disable_cuda_graph": True,
            "dtype": "bfloat16",
            "mem_fraction_static": 0.05,
            "max_total_tokens": self.max_total_tokens,
            "max_running_requests": self.max_running_requests,
            "chunked_prefill_size": self.chunked_prefill_size,
            "page_size": self.page_size,
            "random_seed": 0,
            "grammar_backend": "none",
            "enable_cache_report": True,
            "tp_size": 1,
            "log_level": "warning",
        }
        if self.context_length is not None:
            arguments["context_length"] = self.context_length
        if self.buffer_mode:
            extra = json.dumps(
                {"prefetch_threshold": 1, "prefetch_timeout_base": self.prefetch_timeout_s}
            )
            arguments |= {
                "enable_hierarchical_cache": True,
                "hicache_host_memory_mode": "buffer_only",
                "hicache_storage_backend": "file",
                "hicache_io_backend": "direct",
                "hicache_mem_layout": "layer_first",
                "hicache_write_policy": "write_through",
                "hicache_storage_prefetch_policy": self.prefetch_policy,
                "hicache_storage_backend_extra_config": extra,
                "hicache_ratio": self.host_ratio,
            }
        return arguments


def engine_environment(
    python: Path, l3: Path, settings: EngineSettings, transitions: Path
) -> dict[str, str]:
    """The environment of an engine's every process: the stand-ins at interpreter start (this
    stagefate and ``boot/`` on the path), SGLang's CPU platform, the file L3's folder, and
    SGLang's idle memory check strict (a leak raises in the scheduler instead of a warning).
    With stagefate's lifecycle, ``STAGEFATE_SGLANG`` turns it on over the same folder, its
    transition log written to ``transitions``."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env |= {
        "PYTHONPATH": os.pathsep.join((str(PACKAGE_ROOT), str(BOOT))),
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(l3),
        "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",
        "TORCH_EXTENSIONS_DIR": str(python.parent.parent / "torch_extensions"),
    }
    if settings.lifecycle == "stagefate":
        ours: dict[str, Any] = {"storage": f"file:{l3}", "log": str(transitions)}
        if settings.metrics_port is not None:
            ours["metrics_port"] = settings.metrics_port
        env[VARIABLE] = json.dumps(ours)
    return env
