"""The §9.1 tree workload: the same keys for every tree, and a side-by-side table from them."""

from __future__ import annotations

import pytest

from stagefate.bench.tree import StagefateDriver, run_side_by_side
from stagefate.bench.tree_workload import BRANCH_EVERY, DOC_TOKENS, build_keys, measure


@pytest.mark.parametrize("page", [1, 64])
def test_the_workload_has_the_documents_their_branches_and_the_families(page: int) -> None:
    keys, doc = build_keys(page, target_nodes=600)
    assert len(doc) == DOC_TOKENS and keys[0] == doc
    branches = len(range(BRANCH_EVERY, DOC_TOKENS, BRANCH_EVERY))  # one every 512 tokens
    assert all(keys[i][: BRANCH_EVERY * i] == doc[: BRANCH_EVERY * i] for i in range(1, branches))
    families = keys[2 * (1 + branches) :]
    assert len(families) % 9 == 0 and families
    assert all(len(key) % page == 0 for key in families)
    assert build_keys(page, 600) == (keys, doc)  # deterministic: every tree gets the same keys


def test_measure_times_every_operation_and_the_bulk_eviction_frees_a_tenth() -> None:
    keys, _ = build_keys(1, 400)
    driver = StagefateDriver(1, sum(len(k) for k in keys) + 64 * 1024)
    figures = measure(driver, 1, 400, repeats=3)
    assert list(figures) == [
        "match 1k",
        "match 32k",
        "insert 32k + 256",
        "inc + dec, 32k path",
        "evict(num_tokens=1)",
        "evict 10 % in one call (ms)",
    ]
    assert all(value > 0 for value in figures.values())
    tree = driver.tree
    assert tree.device_pool.available() + tree.total_tokens() == tree.device_pool.capacity
    tree.sanity_check()


def test_side_by_side_without_a_peer_is_stagefate_alone() -> None:
    section = run_side_by_side(None, nodes=300, repeats=2)
    assert section.name == "tree-side-by-side" and "SGLang" not in section.body.split("\n")[0]
    with pytest.raises(ValueError, match="unknown peer"):
        run_side_by_side("vllm", nodes=300, repeats=2)
