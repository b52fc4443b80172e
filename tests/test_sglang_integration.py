"""stagefate's lifecycle as SGLang's buffer-mode pipeline: its parts that need no engine (fast;
the engine itself is tests/test_sglang_engine_lifecycle.py, slow): its settings, the bridges to
SGLang's KV and allocator, its tree's frees, and how it is turned on."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from stagefate.integrations.sglang.settings import VARIABLE, SGLangSettings
from stagefate.runtime.pools import HostPool
from stagefate.targets.sglang.engine.settings import EngineSettings, engine_environment


def test_unset_means_sglangs_own_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    assert SGLangSettings.from_environment() is None
    monkeypatch.setenv(VARIABLE, "{}")
    assert SGLangSettings.from_environment() == SGLangSettings()
    monkeypatch.setenv(VARIABLE, json.dumps({"storage": "file:/x", "io_workers": 3}))
    assert SGLangSettings.from_environment() == SGLangSettings(storage="file:/x", io_workers=3)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("{storage: 1}", "is not JSON"),
        ("[1]", "must hold a JSON object"),
        ('{"stroage": "file:/x"}', "unknown key(s) stroage; known: storage, host_tokens"),
        ('{"io_workers": 0}', "io_workers: Input should be greater than or equal to 1"),
    ],
)
def test_bad_settings_are_refused_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch, raw: str, says: str
) -> None:
    monkeypatch.setenv(VARIABLE, raw)
    with pytest.raises(ValueError, match=f"^{VARIABLE}") as refused:
        SGLangSettings.from_environment()
    assert says in str(refused.value)


def test_the_engine_target_turns_the_lifecycle_on_by_its_settings(tmp_path: Any) -> None:
    python = tmp_path / "bin" / "python"
    log = tmp_path / "transitions.jsonl"
    theirs = engine_environment(python, tmp_path / "l3", EngineSettings(), log)
    assert VARIABLE not in theirs
    ours = engine_environment(python, tmp_path / "l3", EngineSettings(lifecycle="stagefate"), log)
    assert json.loads(ours[VARIABLE]) == {"storage": f"file:{tmp_path / 'l3'}", "log": str(log)}
    with pytest.raises(ValueError, match="keep buffer_mode"):
        EngineSettings(lifecycle="stagefate", buffer_mode=False)
    with pytest.raises(ValueError, match="choose 'sglang' or 'stagefate'"):
        EngineSettings(lifecycle="vllm")  # type: ignore[arg-type]


def _sglang_kv(size: int = 64, page: int = 4) -> tuple[Any, Any]:
    """SGLang's device KV pool (2 layers, 2 heads, dim 4, bf16) and its paged allocator."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    from stagefate.targets.sglang.cache import tiny_kv_pool

    kv = tiny_kv_pool(size, page, layers=2, heads=2, head_dim=4, dtype=torch.bfloat16)
    allocator = PagedTokenToKVPoolAllocator(
        size=size, page_size=page, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False
    )
    return kv, allocator


@pytest.mark.usefixtures("sglang")
def test_the_bounce_lands_in_sglangs_own_kv_and_comes_back_as_pages() -> None:
    from stagefate.integrations.sglang.kv import EngineLoads, EngineSlots

    kv, allocator = _sglang_kv()
    slots = EngineSlots(allocator)
    assert (slots.layout.layers, slots.layout.kv_heads, slots.layout.head_dim) == (2, 2, 4)
    free = slots.available()
    bounce = HostPool(slots.layout, 16)
    bounce.kv.copy_(torch.randn(bounce.kv.shape).to(bounce.kv.dtype))
    taken = slots.alloc(8)
    assert taken is not None and slots.available() == free - 8
    EngineLoads(torch.device("cpu")).h2d(bounce, torch.arange(4, 12), slots, taken)
    for layer in range(2):
        assert torch.equal(kv.k_buffer[layer][taken], bounce.kv[layer, 0, 4:12])
        assert torch.equal(kv.v_buffer[layer][taken], bounce.kv[layer, 1, 4:12])
    pages = EngineLoads.pages_of(slots, taken, 4)
    assert [page.shape for page in pages] == [(2, 2, 4, 2, 4)] * 2
    assert torch.equal(torch.cat(pages, dim=2), bounce.kv[:, :, 4:12])
    slots.free(taken)
    assert slots.available() == free


@pytest.mark.usefixtures("sglang")
@pytest.mark.parametrize("core", ["python", "rust"])
def test_a_splice_below_a_held_prefix_frees_nothing_of_sglangs(core: str) -> None:
    """SGLang 0.5.23's insert frees the part of the value its tree already holds through the
    paged allocator's segment free (not ``free``): the adapter holds that free too, so a splice
    below a prefix SGLang holds leaves its slots alone."""
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from stagefate.integrations.sglang.kv import EngineSlots
    from stagefate.integrations.sglang.tree import SGLangTree
    from stagefate.targets.sglang.cache import unified_cache

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=4))
    _, allocator = _sglang_kv()
    requests = ReqToTokenPool(size=4, max_context_len=8, device="cpu", enable_memory_saver=False)
    cache, _ = unified_cache(
        core,
        req_to_token_pool=requests,
        token_to_kv_pool_allocator=allocator,
        page_size=4,
        disable=False,
    )
    tree = SGLangTree(cache, allocator, EngineSlots(allocator), remember_keys=False)
    tokens = list(range(10, 26))
    head = allocator.alloc(8)
    tree.insert(tokens[:8], head)
    free = allocator.available_size()
    tail = allocator.alloc(8)
    node = tree.insert_leaf(tree.match_prefix(tokens[:8]).last_node, tokens, 8, tail)
    assert allocator.available_size() == free - 8  # the tail taken, nothing of the head freed
    match = tree.match_prefix(tokens)
    assert match.length == 16 and match.last_node.node_id == node.node_id
    assert torch.equal(match.device_indices, torch.cat([head, tail]))
    assert tree.keys == {}  # a serving engine's tree remembers no key


@pytest.mark.usefixtures("sglang")
def test_install_replaces_the_seam_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.mem_cache.unified_cache.components.base import TreeComponent

    from stagefate.integrations.sglang.pipeline import install

    own = TreeComponent.create_buffer_pipeline
    monkeypatch.delenv(VARIABLE, raising=False)
    assert install() is False and TreeComponent.create_buffer_pipeline is own
    monkeypatch.setattr(TreeComponent, "create_buffer_pipeline", own)  # restored after
    monkeypatch.setenv(VARIABLE, '{"stroage": 1}')
    with pytest.raises(ValueError, match="unknown key"):
        install()
    assert TreeComponent.create_buffer_pipeline is own  # refused before anything changed
    monkeypatch.setenv(VARIABLE, "{}")
    assert install() is True and TreeComponent.create_buffer_pipeline is not own
