"""The replay's time and memory model: a named model on a named GPU, every figure sourced.

The KV the simulation moves is tiny (one layer, one head, one value a token) so a whole trace fits
in memory; time and memory are charged as if each token carried the model's real KV. A
:class:`CostModel` is one model on one GPU (or a tensor-parallel group of them); its fields are
the published figures and the few stated assumptions below, and everything else is derived:

* KV bytes per token = 2 (K and V) x layers x KV heads x head dim x dtype bytes;
* device KV tokens = (GPU memory x ``mem_fraction_static`` - weights / TP) / (KV bytes / TP);
* prefill ms = overhead + FLOPs / (peak x MFU x TP), FLOPs = 2 x params per token plus causal
  attention, 4 x layers x query heads x head dim per (token, earlier token) pair;
* decode step ms = overhead + per-request cost x batch + (weights + KV of every running
  context) / (HBM bandwidth x efficiency x TP): decode streams the weights and the batch's KV;
* L3 and H2D transfers = latency + bytes / bandwidth.

Sources (the figures are the vendors'; the assumptions are ours, overridable):

* NVIDIA H200 Tensor Core GPU datasheet: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS dense BF16
  (1,979 with sparsity); PCIe Gen5 x16 host link, 64 GB/s each way.
* Meta Llama 3.1 model cards and ``config.json``: 8B: 8.03 B params, 32 layers, 32 query heads,
  8 KV heads, head dim 128; 70B: 70.6 B params, 80 layers, 64 query heads, 8 KV heads, head dim
  128. BF16 weights and KV.
* SGLang reserves a static fraction of GPU memory for weights + KV (``--mem-fraction-static``,
  chosen from the GPU's memory at launch); the rest holds activations and CUDA graphs. 0.85 is
  assumed here.
* Assumed: prefill at 50 % MFU, decode at 70 % of HBM bandwidth, 2 ms per prefill batch and
  1 ms per decode step of launch/scheduling overhead, 10 us per running request and step
  (sampling, batch bookkeeping); L3 at 10 GB/s with 1 ms latency (one 100 Gb/s NIC to a
  storage service), 0.2 ms existence queries, 2 storage channels; H2D at 50 GB/s (pinned copies
  on PCIe Gen5 x16).

The figures compare policies on one trace; they do not predict a deployment's latency.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MAX_COST = 1e9
"""The largest figure a cost model takes (1e300 once became an internal error)."""


class CostModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "Llama-3.1-8B"
    gpu: str = "1x H200 SXM"
    # the model (Meta's config.json)
    params_billion: float = Field(8.03, gt=0)
    layers: int = Field(32, ge=1)
    query_heads: int = Field(32, ge=1)
    kv_heads: int = Field(8, ge=1)
    head_dim: int = Field(128, ge=1)
    dtype_bytes: int = Field(2, ge=1)
    # the GPU (NVIDIA's datasheet) and the tensor-parallel degree
    tensor_parallel: int = Field(1, ge=1)
    gpu_memory_gb: float = Field(141.0, gt=0)
    hbm_tb_per_s: float = Field(4.8, gt=0)
    peak_tflops: float = Field(989.0, gt=0)
    # assumptions
    mem_fraction_static: float = Field(0.85, gt=0, le=1)
    prefill_mfu: float = Field(0.5, gt=0, le=1)
    decode_bandwidth_efficiency: float = Field(0.7, gt=0, le=1)
    prefill_overhead_ms: float = Field(2.0, ge=0)
    decode_overhead_ms: float = Field(1.0, ge=0)
    decode_per_request_ms: float = Field(0.01, ge=0)
    # L3 and the host link
    exists_latency_ms: float = Field(0.2, ge=0)
    """A batch existence query to L3 (metadata only)."""
    l3_latency_ms: float = Field(1.0, ge=0)
    l3_gb_per_s: float = Field(10.0, gt=0)
    l3_channels: int = Field(2, ge=1)
    """Storage operations (existence queries and reads) served at once; the rest queue FIFO."""
    h2d_gb_per_s: float = Field(50.0, gt=0)

    @model_validator(mode="after")
    def _within_reason(self) -> CostModel:
        for name, value in self:
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(value) or value > MAX_COST:
                raise ValueError(
                    f"{name}={value!r}: each figure of the cost model is finite and at most "
                    f"{MAX_COST:.0e} (in its unit: ms, GB, GB/s, TFLOPS, billions); past it, "
                    "the engine's clock cannot step"
                )
        if self.kv_heads % self.tensor_parallel:
            raise ValueError(
                f"tensor_parallel={self.tensor_parallel} does not divide {self.model}'s "
                f"kv_heads={self.kv_heads}: each rank holds kv_heads / tensor_parallel heads; "
                "pick a divisor"
            )
        return self

    # ------------------------------------------------------------------ derived

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params_billion * 1e9 * self.dtype_bytes

    def device_kv_tokens(self) -> int:
        """KV tokens the GPU group holds once the weights are loaded."""
        tp = self.tensor_parallel
        budget = self.gpu_memory_gb * 1e9 * self.mem_fraction_static - self.weight_bytes / tp
        if budget <= 0:
            raise ValueError(
                f"{self.model} does not fit {self.gpu}: weights need "
                f"{self.weight_bytes / tp / 1e9:.1f} GB a GPU; raise tensor_parallel"
            )
        return int(budget // (self.kv_bytes_per_token / tp))

    def _transfer_ms(self, tokens: int, gb_per_s: float) -> float:
        return tokens * self.kv_bytes_per_token / (gb_per_s * 1e9) * 1e3

    def io_ms(self, kind: str, tokens: int) -> float:
        """An IO operation of the pipeline: ``exists``, an L3 ``read``, or an H2D ``load``."""
        if kind == "exists":
            return self.exists_latency_ms
        if kind == "read":
            return self.l3_latency_ms + self._transfer_ms(tokens, self.l3_gb_per_s)
        return self._transfer_ms(tokens, self.h2d_gb_per_s)

    def prefill_ms(self, chunks: list[tuple[int, int]]) -> float:
        """One prefill batch: ``(tokens, context before them)`` for each request in it."""
        if not chunks:
            return 0.0
        linear = 2 * self.params_billion * 1e9 * sum(tokens for tokens, _ in chunks)
        per_pair = 4 * self.layers * self.query_heads * self.head_dim
        pairs = sum(tokens * (before + tokens / 2) for tokens, before in chunks)
        flops = linear + per_pair * pairs
        seconds = flops / (self.peak_tflops * 1e12 * self.prefill_mfu * self.tensor_parallel)
        return self.prefill_overhead_ms + seconds * 1e3

    def decode_ms(self, batch: int, context_tokens: int) -> float:
        """One decode step of ``batch`` requests holding ``context_tokens`` of KV together."""
        if batch == 0:
            return 0.0
        streamed = self.weight_bytes + context_tokens * self.kv_bytes_per_token
        bandwidth = self.hbm_tb_per_s * 1e12 * self.decode_bandwidth_efficiency
        seconds = streamed / (bandwidth * self.tensor_parallel)
        return self.decode_overhead_ms + self.decode_per_request_ms * batch + seconds * 1e3


PRESETS: dict[str, CostModel] = {
    "llama-3.1-8b-h200": CostModel(),
    "llama-3.1-70b-h200-tp4": CostModel(
        model="Llama-3.1-70B",
        gpu="4x H200 SXM (TP 4)",
        params_billion=70.6,
        layers=80,
        query_heads=64,
        kv_heads=8,
        head_dim=128,
        tensor_parallel=4,
    ),
}
DEFAULT_PRESET = "llama-3.1-8b-h200"


def load_costs(preset: str = DEFAULT_PRESET, path: Path | str | None = None) -> CostModel:
    """A preset, with the fields of a small JSON or YAML file (if given) laid over it."""
    if preset not in PRESETS:
        raise ValueError(f"unknown cost preset {preset!r}; choose one of {sorted(PRESETS)}")
    base = PRESETS[preset]
    if path is None:
        return base
    file = Path(path)
    if not file.is_file():
        what = (
            "is a folder"
            if file.is_dir()
            else "is not a regular file (a pipe or a device)"
            if file.exists()
            else "does not exist"
        )
        raise ValueError(f"cost file {file} {what}; pass --costs PATH to a YAML or JSON file")
    try:
        overrides = yaml.safe_load(file.read_text())  # YAML reads JSON too
    except yaml.YAMLError as error:
        raise ValueError(f"cost file {file} is not valid YAML/JSON: {error}") from None
    if not isinstance(overrides, dict):
        raise ValueError(f"cost file {file} must hold a mapping of CostModel fields to values")
    try:
        return CostModel.model_validate({**base.model_dump(), **overrides})
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg'].removeprefix('Value error, ')}"
            for e in error.errors()
        )
        names = ", ".join(sorted(CostModel.model_fields))
        message = f"cost file {file}: {problems} (the fields are {names})"
        raise ValueError(message) from None
