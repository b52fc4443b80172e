"""How a deployment turns stagefate's lifecycle on in SGLang: one environment variable.

``STAGEFATE_SGLANG`` holds a JSON object (``{}`` for the defaults). Set in the environment of
SGLang's scheduler process, with HiCache in buffer mode (``hicache_host_memory_mode=
"buffer_only"``), it makes the buffer-mode pipeline SGLang builds stagefate's (docs/sglang.md,
"stagefate in SGLang's engine"). Every key is named here; an unknown key or a bad value is
refused when the scheduler builds its cache, before anything is written.

The prefetch threshold, the anchor-lock cap and the device pool are SGLang's own arguments
(``hicache_storage_backend_extra_config``'s ``prefetch_threshold``,
``SGLANG_HICACHE_BUFFER_ANCHOR_LOCK_CAP``, the KV pool): the lifecycle reads them from the
cache SGLang built, so both pipelines decide under the same limits.
"""

from __future__ import annotations

import json
import os

from pydantic import BaseModel, ConfigDict, Field

from ..settings import checked

VARIABLE = "STAGEFATE_SGLANG"


class SGLangSettings(BaseModel):
    """What ``STAGEFATE_SGLANG`` may set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    storage: str = "file:/tmp/stagefate-l3"
    """stagefate's L3 (``file:PATH``, ``mooncake://HOST:PORT``): its pages are stagefate's,
    keyed by the request's namespace, written through by the lifecycle (SGLang's own L3
    backend is left unused)."""
    host_tokens: int | None = Field(default=None, ge=1)
    """Slots of stagefate's bounce buffer; None: as many as SGLang's host pool has."""
    io_workers: int = Field(default=2, ge=1)
    retry_interval: int = Field(default=8, ge=0)
    retry_max_attempts: int = Field(default=12, ge=0)
    dedup_inflight: bool = True
    log: str | None = None
    """Write the transition log here, live (``stagefate validate`` checks it)."""
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    """Serve stagefate's Prometheus metrics from the scheduler's process on this port."""
    metrics_address: str = "127.0.0.1"

    @classmethod
    def from_environment(cls) -> SGLangSettings | None:
        """The settings ``STAGEFATE_SGLANG`` holds, or None when it is unset (SGLang's own
        pipeline then runs)."""
        raw = os.environ.get(VARIABLE)
        if raw is None:
            return None
        try:
            given = json.loads(raw or "{}")
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{VARIABLE}={raw!r} is not JSON ({error.msg}); give an object such as "
                '\'{"storage": "file:/var/cache/stagefate"}\' or {}'
            ) from None
        if not isinstance(given, dict):
            raise ValueError(f"{VARIABLE} must hold a JSON object, got {raw!r}")
        return checked(cls, given, VARIABLE)
