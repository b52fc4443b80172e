"""The replay's time model: how long storage, copies and prefill take, in simulated ms.

The KV the simulation moves is tiny (one layer, one head, one value a token) so a whole trace
fits in memory; time is charged as if each token carried ``kv_bytes_per_token`` of real KV. The
defaults model Llama-3-8B (32 layers x 8 KV heads x 128 dims x K and V x fp16 = 128 KiB a
token) on one H100-class GPU with an L3 store reached at 10 GB/s. Storage operations queue for
one of ``l3_channels`` (an existence query waits behind reads, as in an engine's prefetch
thread); H2D loads have a copy stream of their own. The figures compare policies on one trace;
they do not predict a deployment's latency.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CostModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kv_bytes_per_token: int = Field(128 * 1024, ge=1)
    exists_latency_ms: float = Field(0.2, ge=0)
    """A batch existence query to L3 (metadata only)."""
    l3_latency_ms: float = Field(1.0, ge=0)
    l3_gb_per_s: float = Field(10.0, gt=0)
    h2d_gb_per_s: float = Field(25.0, gt=0)
    prefill_tokens_per_s: float = Field(40_000.0, gt=0)
    prefill_overhead_ms: float = Field(5.0, ge=0)
    l3_channels: int = Field(2, ge=1)
    """Storage operations (existence queries and reads) served at once; the rest queue FIFO."""
    prefetch_timeout_ms: float = Field(500.0, ge=0)
    prefetch_timeout_per_ki_token_ms: float = Field(30.0, ge=0)
    """The queue head waits for its own prefetch ``prefetch_timeout_ms`` plus this per 1024
    tokens of its span (about twice their transfer time), then computes without it (SGLang's
    ``prefetch_timeout_base`` / ``prefetch_timeout_per_ki_token`` play the same role)."""

    def _transfer_ms(self, tokens: int, gb_per_s: float) -> float:
        return tokens * self.kv_bytes_per_token / (gb_per_s * 1e9) * 1e3

    def io_ms(self, kind: str, tokens: int) -> float:
        if kind == "exists":
            return self.exists_latency_ms
        if kind == "read":
            return self.l3_latency_ms + self._transfer_ms(tokens, self.l3_gb_per_s)
        return self._transfer_ms(tokens, self.h2d_gb_per_s)

    def prefill_ms(self, tokens: int) -> float:
        return self.prefill_overhead_ms + tokens / self.prefill_tokens_per_s * 1e3

    def prefetch_timeout(self, span_tokens: int) -> float:
        return self.prefetch_timeout_ms + self.prefetch_timeout_per_ki_token_ms * span_tokens / 1024
