"""The engine target's parts that need no engine: its stand-ins against SGLang's own rules, its
arguments, its model (fast; the engine itself is tests/test_sglang_engine.py, slow)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from stagefate.targets.sglang.engine.batch import Batch
from stagefate.targets.sglang.engine.model import write_model
from stagefate.targets.sglang.engine.server import flags
from stagefate.targets.sglang.engine.settings import EngineSettings
from stagefate.targets.sglang.engine.standins import assign_req_to_token_pool_cpu
from stagefate.targets.sglang.shim import _alloc_decode


def test_the_token_pool_op_writes_each_request_its_own_slots_back_to_back() -> None:
    req_to_token = torch.zeros((4, 16), dtype=torch.int32)
    out = torch.arange(100, 109, dtype=torch.int64)
    assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]), req_to_token, torch.tensor([3, 0]), torch.tensor([7, 5]), out, 16
    )
    assert req_to_token[2, 3:7].tolist() == [100, 101, 102, 103]
    assert req_to_token[0, 0:5].tolist() == [104, 105, 106, 107, 108]
    assert int(req_to_token.count_nonzero()) == 9


@pytest.mark.usefixtures("sglang")
@pytest.mark.parametrize("seed", range(20))
def test_alloc_decode_in_torch_is_sglangs_own_rule(seed: int) -> None:
    """The stand-in for 0.5.19-0.5.21's decode kernel answers as 0.5.22's own torch twin."""
    from sglang.srt.mem_cache.allocator.paged import alloc_decode_naive

    generator = torch.Generator().manual_seed(seed)
    page = 4
    batch = int(torch.randint(1, 9, (1,), generator=generator))
    seq_lens = torch.randint(1, 40, (batch,), generator=generator)
    last_loc = torch.randint(0, 400, (batch,), generator=generator)
    free_pages = torch.randperm(100, generator=generator)[:12] + 1
    new_pages = int(((seq_lens - 1) % page == 0).sum())
    ours = torch.empty(batch, dtype=torch.int64)
    theirs = torch.empty(batch, dtype=torch.int64)
    _alloc_decode(seq_lens, last_loc, free_pages, ours, 16, page)
    alloc_decode_naive(seq_lens, last_loc, free_pages, theirs, page, new_pages)
    assert ours.tolist() == theirs.tolist()


def test_the_model_is_the_same_bytes_every_time(tmp_path: Path) -> None:
    pytest.importorskip("safetensors", reason="the engine's extra is not installed: make sglang")

    def digest(folder: Path) -> str:
        return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()

    assert digest(write_model(tmp_path / "a")) == digest(write_model(tmp_path / "b"))


def test_buffer_mode_arguments_and_their_flags() -> None:
    arguments = EngineSettings(prefetch_policy="timeout").arguments(Path("/m"))
    assert arguments["hicache_host_memory_mode"] == "buffer_only"
    assert arguments["hicache_storage_prefetch_policy"] == "timeout"
    argv = flags(arguments)
    assert "--enable-hierarchical-cache" in argv and "--skip-tokenizer-init" in argv
    assert argv[argv.index("--page-size") + 1] == "4"
    plain = EngineSettings(buffer_mode=False).arguments(Path("/m"))
    assert "enable_hierarchical_cache" not in plain


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"prefetch_policy": "eager"}, "best_effort, wait_complete, timeout"),
        ({"page_size": 0}, "page_size must be a positive int"),
        ({"max_total_tokens": 64.0}, "max_total_tokens must be a positive int"),
    ],
)
def test_bad_settings_name_the_field(change: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        EngineSettings(**change)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        ({"rids": ["a"]}, "rids has 1 entries for 2 prompts"),
        ({"timeout_s": 1.0}, "give every prompt a rid"),
        ({"rids": ["a", "b"], "abort_after_s": {"c": 0.0}}, "which no prompt's rid is"),
        ({"start_after": [None]}, "start_after has 1 entries"),
    ],
)
def test_a_batch_that_cannot_be_sent_as_asked_is_refused_naming_the_fix(
    shape: dict[str, object], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        Batch([[1], [2]], **shape)  # type: ignore[arg-type]
