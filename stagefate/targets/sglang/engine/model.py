"""The tiny Llama the engine target serves, made here from a fixed seed.

SGLang's ``load_format="dummy"`` fills every weight in ±1e-3: every logit is about zero and the
output cannot tell the right KV from wrong KV, so a test of "served from L3" would pass on any
bytes. Weights drawn from a normal distribution (std :data:`WEIGHT_STD`, seed :data:`SEED`) and
written as ``model.safetensors`` make each greedy token depend on the KV it attends to. The shape
is the smallest that keeps SGLang's Llama paths ordinary (grouped-query attention: 4 query heads
over 2 KV heads); about 1 MB in bfloat16.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import torch

SEED = 0
WEIGHT_STD = 0.5
HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
VOCAB = 1000
MAX_POSITIONS = 4096

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "vocab_size": VOCAB,
    "max_position_embeddings": MAX_POSITIONS,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def _weights() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)

    def drawn(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * WEIGHT_STD).to(torch.bfloat16)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=torch.bfloat16)

    weights = {"model.embed_tokens.weight": drawn(VOCAB, HIDDEN)}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        weights |= {
            prefix + "self_attn.q_proj.weight": drawn(HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.k_proj.weight": drawn(KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.v_proj.weight": drawn(KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.o_proj.weight": drawn(HIDDEN, HEADS * HEAD_DIM),
            prefix + "mlp.gate_proj.weight": drawn(INTERMEDIATE, HIDDEN),
            prefix + "mlp.up_proj.weight": drawn(INTERMEDIATE, HIDDEN),
            prefix + "mlp.down_proj.weight": drawn(HIDDEN, INTERMEDIATE),
            prefix + "input_layernorm.weight": ones(HIDDEN),
            prefix + "post_attention_layernorm.weight": ones(HIDDEN),
        }
    weights["model.norm.weight"] = ones(HIDDEN)
    weights["lm_head.weight"] = drawn(VOCAB, HIDDEN)
    return weights


def shared_model() -> Path:
    """The model in one folder every engine here shares (under the targets folder), written on
    first use. SGLang's file L3 names a page by the model's path too: engines that share L3
    must serve the model from the same path."""
    from ..environments import targets_dir

    digest = hashlib.sha256(json.dumps([CONFIG, SEED, WEIGHT_STD]).encode()).hexdigest()[:12]
    folder = targets_dir() / "models" / f"tiny-llama-{digest}"
    if not (folder / "model.safetensors").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        write_model(partial)
        try:
            partial.rename(folder)
        except OSError:  # another engine wrote it first: the same bytes
            shutil.rmtree(partial, ignore_errors=True)
    return folder


def write_model(folder: Path) -> Path:
    """Write the model into ``folder`` (made if missing); the same bytes on every call."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=1) + "\n", encoding="utf-8")
    save_file(_weights(), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
