"""The fuzzer drives any tree that follows the adapter protocol (runtime/prefix_tree.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis.stateful import run_state_machine_as_test

from stagefate.fuzz.fuzzer import configured
from stagefate.runtime import RadixTree, SlotPool

from .harness import fuzz_settings

CALLS: Counter[str] = Counter()


class DelegatingTree:
    """A stand-in for another implementation: it forwards every call and counts it."""

    def __init__(self, page_size: int, device_pool: SlotPool, aux_pool: SlotPool | None) -> None:
        self._inner = RadixTree(page_size, device_pool, aux_pool)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if callable(value):
            CALLS[name] += 1
        return value


def test_the_fuzzer_drives_a_tree_through_the_adapter() -> None:
    run_state_machine_as_test(
        configured(tree_factory=DelegatingTree),
        settings=fuzz_settings(examples=40, steps=40),
    )
    for name in (
        "match_prefix",
        "insert",
        "inc_lock_ref",
        "evict",
        "cached_page_key",
        "remember_page_keys",
        "sanity_check",
    ):
        assert CALLS[name] > 0, f"the pipeline or fuzzer never called {name}"
