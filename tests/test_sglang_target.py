"""SGLang 0.5.23 as a target: its radix trees under stagefate's pipeline, fuzzer and replay.

These run when `make sglang` has installed the target (CI does); without it they skip and say so.
"""

from __future__ import annotations

import collections
import importlib.metadata
from typing import Any

import pytest
import torch
from hypothesis.stateful import run_state_machine_as_test

from stagefate import BufferPipeline
from stagefate.cli import main
from stagefate.fuzz.fuzzer import configured
from stagefate.registry import make_replay, tree_factory
from stagefate.runtime import DevicePool, KVLayout
from stagefate.sim.replay import ReplayOptions
from stagefate.sim.trace import load_trace
from stagefate.targets import TargetUnavailable
from stagefate.targets.sglang import require

from .harness import assert_quiescent, config, fuzz_settings, kv_marks, make_pair, seq_of, settle

try:
    require()
except TargetUnavailable as missing:
    pytest.skip(f"{missing}", allow_module_level=True)

from stagefate.integrations.sglang.tree import SGLangTree, SGLangTreeError
from stagefate.targets.sglang.tree import new_sglang_tree

CORES = ["python", "rust"]


def _tree(core: str, slots: int = 64, page: int = 4) -> SGLangTree:
    pool = DevicePool(KVLayout(layers=1, kv_heads=1, head_dim=1), slots, "cpu")
    return new_sglang_tree(core, page, pool)


def test_the_stand_ins_leave_torch_and_transformers_deciding_for_themselves() -> None:
    import torch.utils._triton as torch_triton
    import triton  # the stand-in: SGLang's modules import it
    from transformers.utils import import_utils

    assert not torch_triton.has_triton()  # torch never compiles with the stand-in
    assert not import_utils.is_torchvision_available()

    @triton.jit
    def kernel() -> int:
        return 7

    with pytest.raises(RuntimeError, match="kernel launched on a CPU"):
        kernel[(1,)]()
    assert isinstance(triton.Config, type)


@pytest.mark.parametrize("core", CORES)
def test_sglang_decides_match_split_lock_and_evict(core: str) -> None:
    tree = _tree(core)
    assert tree.cache._tree_core_backend == core
    pool = tree.pool
    slots = pool.alloc(16)
    assert slots is not None
    assert tree.insert(list(range(1, 17)), slots) == 0
    # SGLang splits its node at the diverging page and matches whole pages only
    match = tree.match_prefix([*range(1, 10), 99, 100, 101])
    assert match.length == 8 and torch.equal(match.device_indices, slots[:8])
    assert tree.evictable_size == 16 and tree.protected_size == 0
    assert tree.inc_lock_ref(match.last_node) == 8
    assert tree.protected_size == 8 and match.last_node.lock_ref == 1
    assert tree.evict(16) == 8  # the locked half stays: SGLang's LRU evicts the unlocked leaf
    assert match.last_node.attached and pool.available() == 64 - 8
    tree.dec_lock_ref(match.last_node)
    assert tree.evictable_size == 8
    tree.sanity_check()
    with pytest.raises(SGLangTreeError, match="without a matching inc"):
        tree.dec_lock_ref(match.last_node)
    # an insert over a held prefix: the held part stays the caller's, SGLang frees nothing of it
    more = pool.alloc(8)
    assert more is not None
    assert tree.insert(list(range(1, 17)), torch.cat([slots[:8], more])) == 8
    assert pool.available() == 64 - 16
    assert tree.total_tokens() == 16


@pytest.mark.parametrize("core", CORES)
def test_the_sglang_tree_answers_an_empty_prefix(core: str) -> None:
    """A root anchor's re-match asks for no tokens at all (issue 54: vLLM's adapter raised)."""
    tree = tree_factory(f"sglang-{core}")(4, DevicePool(KVLayout(1, 1, 1), 64, "cpu"), None)
    match = tree.match_prefix([])
    assert match.length == 0 and match.device_indices.numel() == 0


@pytest.mark.parametrize("core", CORES)
def test_bytes_spliced_onto_the_sglang_tree_equal_the_bytes_written(core: str) -> None:
    """A producer writes through; a consumer pipeline on SGLang's tree stages, trims and splices."""
    cfg = config(4)
    pair = make_pair(cfg)
    consumer = BufferPipeline(
        cfg, storage=pair.storage, tree_factory=tree_factory(f"sglang-{core}")
    )
    pair.consumer = consumer
    seq = seq_of(5, 4)
    pair.publish(seq, mark=9)
    consumer.prefetch_from_storage("r", seq, 0)
    settle(consumer)
    assert consumer.state("r") == "staged"
    head = pair.sibling_insert(seq[:4], mark=3)  # a sibling publishes the head: a trim
    prefix = consumer.tree.match_prefix(seq)
    assert consumer.plan_staged_splice("r", prefix.length) == (16, 0)
    tail = consumer.init_load_back("r", prefix.device_indices)
    settle(consumer)
    match = consumer.tree.match_prefix(seq)
    assert match.length == 20 and torch.equal(match.device_indices[:4], head)
    assert kv_marks(consumer, match.device_indices) == [3.0] * 4 + [9.0] * 16
    assert torch.equal(match.device_indices[4:], tail)
    assert consumer.stats.filled == 1 and consumer.stats.trimmed_tokens == 4
    assert_quiescent(consumer)


@pytest.mark.parametrize("core", CORES)
def test_the_stateful_fuzzer_holds_on_sglang_trees(core: str) -> None:
    calls: collections.Counter[str] = collections.Counter()

    class Counting(SGLangTree):
        def evict(self, num_tokens: int) -> int:
            calls["evict"] += 1
            return super().evict(num_tokens)

        def inc_lock_ref(self, node: Any) -> int:
            calls["lock"] += 1
            return super().inc_lock_ref(node)

    def counting_tree(page: int, pool: Any, _aux: Any) -> Counting:
        built = new_sglang_tree(core, page, pool)
        return Counting(built.cache, built.allocator, pool)

    on_sglang = configured(tree_factory=counting_tree, windows=(None,))
    run_state_machine_as_test(on_sglang, settings=fuzz_settings(examples=12, steps=60))
    assert calls["evict"] > 0 and calls["lock"] > 0


@pytest.mark.slow
def test_replay_runs_on_the_sglang_rust_tree_with_its_books_closed() -> None:
    trace = load_trace(limit=60)
    replay = make_replay("live", trace, ReplayOptions(tree="sglang-rust"))
    metrics = replay.run()
    books = replay.engine.books
    assert books.input_tokens == (
        books.device_hit_tokens + metrics.tokens_spliced + metrics.prefill_tokens_computed
    )
    tree, pool = replay.policy.tree, replay.policy.device_pool
    assert pool.available() + tree.total_tokens() == pool.capacity
    assert tree.protected_size == 0
    tree.sanity_check()


@pytest.mark.slow
def test_cli_takes_sglang_trees_and_rejects_unknown_ones() -> None:
    assert main(["fuzz", "--tree", "sglang-python", "--steps", "300", "--profile", "ci"]) == 0
    assert main(["replay", "--tree", "sglang-python", "--limit", "20", "--policy", "live"]) == 0
    assert main(["fuzz", "--tree", "sglang-go"]) == 2


def test_a_missing_target_names_make_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.setenv("STAGEFATE_TARGETS", "/nonexistent")  # no release environments either
    with pytest.raises(TargetUnavailable, match="run `make sglang`"):
        require()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.99")
    with pytest.raises(TargetUnavailable, match=r"0\.5\.99 is installed"):
        require()


@pytest.mark.slow
def test_the_tree_bench_runs_sglang_beside_stagefate() -> None:
    from stagefate.bench.tree import run_side_by_side

    section = run_side_by_side("sglang==0.5.23", nodes=300, repeats=2)
    header = section.body.split("\n")[0]
    assert "SGLang 0.5.23 Rust core" in header and "SGLang 0.5.23 Python core" in header
    assert "SGLang 0.5.23 RadixCache" in header
    assert "0.5.23 Rust core / stagefate" in header


def test_a_knob_the_release_never_reads_is_refused_with_the_nearest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--sglang-env`` once echoed any SGLANG_ name as applied (issue 54)."""
    knob = "SGLANG_ENABLE_HICACHE_BUFER_ANCHOR_LOCK=1"  # BUFER: a typo
    assert main(["replay", "--limit", "5", "--policy", "sglang", "--sglang-env", knob]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "reads no such knob" in err
    assert "did you mean SGLANG_ENABLE_HICACHE_BUFFER_ANCHOR_LOCK?" in err
