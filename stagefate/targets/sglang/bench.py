"""SGLang as the peer of stagefate's benchmarks.

* :class:`SGLangDriver`: its ``UnifiedRadixCache`` (Python and Rust cores) driven directly on the
  docs/design.md §9.1 workload. Tree cost only, as measured there: keys are SGLang
  ``RadixKey``s built once, values are fresh slot numbers, and the allocator only counts what
  the tree frees (stagefate's tree, beside it, frees into its real pool).
* :class:`SGLangPrefetcher`: one prefetch after another through its ``BufferModePipeline``
  (:mod:`.pipeline_driver`), for ``bench lifecycle --peer sglang``.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable

import torch

from .cache import build_unified_cache


def _counting_class() -> type:
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

    class Counting(TokenToKVPoolAllocator):  # type: ignore[misc]
        """Only counts what the tree frees: the figures are tree cost alone."""

        freed = 0

        def free(self, free_index: torch.Tensor) -> None:
            self.freed += free_index.numel()

    return Counting


class SGLangDriver:
    """A :class:`~stagefate.bench.tree_workload.TreeDriver` over SGLang's unified cache."""

    def __init__(self, core: str, page: int, slots: int) -> None:
        from . import require

        require()
        self.core = core
        self.name = "SGLang RadixCache" if core == "radix" else f"SGLang {core} core"
        self.cache, self.allocator = build_unified_cache(core, page, slots, _counting_class())
        self.next_slot = 1  # slot 0 is SGLang's padding slot

    def key(self, tokens: list[int]) -> object:
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(array("q", tokens))

    def prepare_insert(self, key: object, length: int) -> Callable[[], object]:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        value = torch.arange(self.next_slot, self.next_slot + length, dtype=torch.int64)
        self.next_slot += length
        params = InsertParams(key=key, value=value)
        return lambda: self.cache.insert(params)

    def match(self, key: object) -> object:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        return self.cache.match_prefix(MatchPrefixParams(key=key))

    def node(self, key: object) -> object:
        return self.match(key).last_device_node  # type: ignore[attr-defined]

    def lock(self, node: object) -> object:
        return node, self.cache.inc_lock_ref(node)

    def unlock(self, handle: object) -> None:
        assert isinstance(handle, tuple)
        node, receipt = handle
        if self.core == "radix":  # the legacy tree takes no receipt
            self.cache.dec_lock_ref(node)
        else:
            self.cache.dec_lock_ref(node, receipt.to_dec_params())

    def evict(self, tokens: int) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        return int(self.cache.evict(EvictParams(num_tokens=tokens)).num_tokens_evicted)

    def total_tokens(self) -> int:
        if self.core == "radix":
            return int(self.cache.total_size())
        return int(self.cache.tree_core.total_size()[0])


class SGLangPrefetcher:
    """``bench lifecycle``'s prefetcher over SGLang's buffer-mode pipeline (python tree core)."""

    name = "sglang"

    def __init__(self, page: int, prefix: int) -> None:
        from .generations import stepped_sglang

        self.driver = stepped_sglang(page_size=page, device_tokens=8192)
        self.prefix = prefix

    def prepare(self, tokens: list[int]) -> None:
        """Untimed: L3 holds ``tokens`` (written by the producer); the consumer's device holds
        their first ``prefix``."""
        self.driver.produce(tokens, None)
        self.driver.publish(tokens[: self.prefix], None)

    def prefetch(self, request: str, tokens: list[int], marks: list[float]) -> None:
        """Issue → ack in the scheduler's order (clock readings at the start and the end)."""
        driver, clock = self.driver, time.perf_counter
        marks.append(clock())
        driver.issue(request, tokens, None)
        driver.run_existence_queries()
        driver.tick()  # the IO commit: anchor lock, bounce, the read queued
        driver.run_reads()
        driver.tick()  # the read's ack: staged
        loaded = driver.admit(request)
        driver.tick()  # the H2D's ack: the load back finishes
        marks.append(clock())
        if loaded != len(tokens) - self.prefix or driver.live(request):
            raise RuntimeError(f"SGLang's prefetch {request} did not complete: loaded {loaded}")

    def clean(self) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        for side in self.driver.sides():
            side.cache.evict(EvictParams(num_tokens=self.driver.device_tokens))

    def close(self) -> None:
        self.driver.close()
