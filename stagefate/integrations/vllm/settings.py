"""The connector's settings: ``kv_connector_extra_config``, validated at startup.

Every key is named here; an unknown one is refused with the list of known keys, before anything
is built (nothing is written to L3 or to ``/dev/shm`` by a refused configuration).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ...runtime.pools import KVLayout
from ..settings import checked


class ConnectorSettings(BaseModel):
    """What a deployment sets under ``KVTransferConfig(kv_connector_extra_config={...})``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    storage: str = "file:/tmp/stagefate-l3"
    """The L3: ``file:PATH`` (shared by every process and instance on the machine),
    ``mooncake://HOST:PORT`` (shared by instances on several machines), or ``memory`` (one
    process only: vLLM in-process mode, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    host_tokens: int = Field(default=16384, ge=1)
    """Slots of the host bounce buffer (a file mapping in ``/dev/shm`` both processes see)."""
    prefetch_threshold: int = Field(default=1, ge=1)
    anchor_lock_cap_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    retry_interval: int = Field(default=8, ge=0)
    retry_max_attempts: int = Field(default=12, ge=0)
    io_workers: int = Field(default=2, ge=1)
    dedup_inflight: bool = True
    decline_slower_loads: bool = True
    """Time every forward (the pipeline times its L3 reads), and let the IO commit decline a
    span whose load would take longer than computing it (the spec's
    ``load_slower_than_compute``) and a request stop waiting for a read that has run longer
    than computing its tokens takes (``give_up_slow_read``); false: every hit is loaded and
    waited for."""
    l3_wait_ms: float = Field(default=2.0, ge=0.0)
    """The longest one scheduling pass waits, in all, for L3 on behalf of the requests it asks
    about: their existence answers, and the reads of their hits (the IO commits then run at
    once). What lands within it is acted on in that pass: a miss is computed in this step, a
    staged hit loaded into it. 0: answers and reads are acted on at the pass's end."""
    synchronous_loads: bool = True
    """A staged span is loaded in the step that admits its request (vLLM's synchronous load:
    the worker copies bounce → blocks before that step's forward); false: asynchronously
    (``load_kv_async``), the request scheduled a step after its copy."""
    write_through: bool = True
    """Store every full block vLLM computes in L3 under stagefate's page keys."""
    log: str | None = None
    """Write the transition log here (``stagefate validate`` checks it against the spec)."""
    shm_dir: str = "/dev/shm"
    """Where the bounce buffer's file mapping lives."""
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    """Serve stagefate's Prometheus metrics (``stagefate.metrics``) on this port, from the
    process that runs vLLM's scheduler (vLLM's own ``/metrics`` is served by its API server
    process, which does not see them)."""
    metrics_address: str = "127.0.0.1"

    def host_slots(self, block_size: int) -> int:
        """The bounce buffer's slots: ``host_tokens`` rounded down to whole blocks (the
        scheduler side creates it this size, the worker maps it this size)."""
        slots = self.host_tokens - self.host_tokens % block_size
        if not slots:
            raise ValueError(
                f"stagefate.host_tokens={self.host_tokens} holds no whole block of "
                f"{block_size} tokens: give at least {block_size}"
            )
        return slots

    @field_validator("storage")
    @classmethod
    def _storage(cls, value: str) -> str:
        if value == "memory" or value.startswith(("file:", "mooncake://")):
            return value
        raise ValueError(
            f"storage {value!r}: expected 'file:PATH', 'mooncake://HOST:PORT' or 'memory'"
        )

    @classmethod
    def parse(cls, extra: dict[str, Any] | None) -> ConnectorSettings:
        """The settings under ``stagefate.*`` keys of ``kv_connector_extra_config``.

        Keys without the prefix belong to other connectors (MultiConnector shares one dict)."""
        ours = {
            key.removeprefix("stagefate."): value
            for key, value in (extra or {}).items()
            if key.startswith("stagefate.")
        }
        return checked(cls, ours, "kv_connector_extra_config", prefix="stagefate.")

    def check_storage_reachable(self, multiprocess: bool) -> None:
        """Refuse at startup an L3 the two sides could not share, or cannot reach."""
        if self.storage == "memory" and multiprocess:
            raise ValueError(
                "stagefate.storage='memory' lives in one process, but vLLM runs its scheduler "
                "and workers in separate ones: use 'file:PATH' (or 'mooncake://HOST:PORT'), "
                "or run vLLM in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0)"
            )
        if self.storage.startswith("file:"):
            path = Path(self.storage.removeprefix("file:").removeprefix("//"))
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise ValueError(
                    f"stagefate.storage={self.storage!r} cannot be created ({error}); give a "
                    "folder this user can write"
                ) from None
            if not os.access(path, os.W_OK):
                raise ValueError(
                    f"stagefate.storage={self.storage!r} is not writable; give a folder this "
                    "user can write"
                )


def model_layout(vllm_config: Any) -> tuple[KVLayout, int]:
    """The per-token KV layout and block size of the served model, or a refusal naming why."""
    model, parallel, cache = (
        vllm_config.model_config,
        vllm_config.parallel_config,
        vllm_config.cache_config,
    )
    if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
        raise ValueError(
            "StagefateConnector serves one worker per engine (tensor_parallel_size=1, "
            "pipeline_parallel_size=1) for now"
        )
    if cache.cache_dtype != "auto":
        raise ValueError(
            f"StagefateConnector stores KV in the model's dtype; kv_cache_dtype="
            f"{cache.cache_dtype!r} is not served: leave it 'auto'"
        )
    lookahead = getattr(vllm_config, "num_hash_lookahead_tokens", 0)  # vLLM 0.33 on
    if lookahead:
        raise ValueError(
            f"vLLM hashes each block with the {lookahead} tokens after it "
            "(num_hash_lookahead_tokens, for speculative decoding); StagefateConnector keys L3 "
            "by the block's own tokens: set disable_lookahead_block_hashes in the speculative "
            "config"
        )
    if not cache.enable_prefix_caching:
        raise ValueError(
            "StagefateConnector re-matches every prefetch against vLLM's prefix cache: turn "
            "it on (enable_prefix_caching=True)"
        )
    layout = KVLayout(
        model.get_num_layers(parallel),
        model.get_num_kv_heads(parallel),
        model.get_head_size(),
        model.dtype,
    )
    return layout, int(cache.block_size)
