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


def test_the_probe_times_outer_calls_once_and_counts_pages_read_again() -> None:
    from types import SimpleNamespace

    from stagefate.targets.sglang.engine.probe import attach, leading

    steps: list[int] = []

    class Cache:
        def insert(self, tokens: int) -> int:
            return tokens

        def init_load_back(self, tokens: int) -> int:
            return int(scheduler.tree_cache.insert(tokens))  # a splice's insert: nested

    backend = SimpleNamespace(batch_get_v1=lambda keys, *_: [key != "gone" for key in keys])
    cache = Cache()
    cache.cache_controller = SimpleNamespace(storage_backend=backend)  # type: ignore[attr-defined]
    scheduler = SimpleNamespace(tree_cache=cache, get_next_batch_to_run=lambda: steps.append(1))
    probe = attach(scheduler)
    scheduler.get_next_batch_to_run()
    assert scheduler.tree_cache.init_load_back(3) == 3
    backend.batch_get_v1(["a", "b", "gone", "c"], None)
    backend.batch_get_v1(["b", "d"], None)
    backend.batch_get_v1(["gone"], None)  # read nothing: not a read
    report = probe.as_json()
    assert report["calls"] == {"init_load_back": 1} and steps == [1] and report["steps"] == 1
    assert (report["reads"], report["pages"], report["pages_again"]) == (2, 4, 1)
    assert leading([1, None, 1], lambda page: page is not None) == 1


def test_the_bench_row_says_what_each_pipeline_read_and_served() -> None:
    from stagefate.bench.sglang import figures, probe_difference, row

    before = {"steps": 10, "seconds": {"a": 1.0}, "reads": 1, "pages": 4, "pages_again": 0}
    after = {"steps": 30, "seconds": {"a": 1.5, "b": 0.5}, "reads": 4, "pages": 24}
    after["pages_again"] = 2
    probe = probe_difference(before, after)
    assert probe == {"steps": 20, "seconds": 1.0, "reads": 3, "pages": 20, "pages_again": 2}
    answers = [
        {"output_ids": [1, 2], "cached": {"storage": 60}, "cached_tokens": 64, "ttft_s": 0.010},
        {"output_ids": [3, 4], "cached": None, "cached_tokens": 0, "ttft_s": 0.030},
    ]
    baseline = [{"output_ids": [1, 2]}, {"output_ids": [3, 5]}]
    seen = figures({"answers": answers, "wall": 2.0, "probe": probe}, baseline)
    assert seen["same"] == 1 and (seen["read"], seen["never_used"], seen["again"]) == (80, 20, 8)
    assert (seen["served"], seen["cached"], seen["ttft50"], seen["ttft99"]) == (60, 64, 10, 30)
    slower = seen | {"same": 2, "ttft50": 50.0, "us_per_step": 0.0}
    cells = row("stagefate", [seen, slower, slower], 2)
    assert cells[:3] == ["stagefate", "1/2", "3"]  # the fewest equal outputs of any run
    assert cells[8] == "50" and cells[-2:] == ["0", "1000"]  # medians
