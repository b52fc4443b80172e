"""The hit-rate bound of a trace: what any design could reuse, with infinite device memory and L3.

A prompt token can be served from cache only if an earlier request's prompt held the same
token at the same place with the same prefix before it, and only in whole pages of the
cacheable key (the prompt without its last token, which is always computed: the engine's
``EngineRequest.key``). What an earlier request leaves in the cache is every whole page of its
*prompt*, the last token included (its KV exists once the request ran, and the engine
publishes it when the request finishes; its output's pages are its own). So the bound counts,
request by request in arrival order, the leading pages of its key that some earlier request's
prompt already holds, as a radix tree that never evicts would match them. (The two differ when
a prompt is a whole number of pages: its last page is in no key of its own, yet a later turn
that extends it reuses that page.) It reads the trace alone: no timing, no memory, no policy;
a policy's hit rate divided by it says how much of what was there to reuse the design reused.

The one way a replay can pass it is a retraction: a request retracted mid-prefill re-runs over
its own pages (the engine block counts retractions); without one, no policy exceeds the bound.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from ..runtime.hashing import ROOT_NAMESPACE, page_hashes, rank_storage_keys
from ..runtime.storage import Storage
from .trace import BLOCK_TOKENS, TraceRequest


class TraceBound(BaseModel):
    """The JSON's ``bounds``: the reusable share of the trace's prompt tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hit_rate: float
    reusable_tokens: int
    """Tokens in pages of a key an earlier request's key already holds (page-aligned)."""
    prompt_tokens: int
    store_tokens: int = 0
    """Of the reusable tokens, those only a persistent L3 holding them before the run makes
    reusable (0 for an L3 that starts empty)."""


def hit_rate_bound(
    trace: list[TraceRequest], page_size: int, stored: Mapping[int, int] | None = None
) -> TraceBound:
    """The bound of ``trace`` (in arrival order) at ``page_size`` tokens a page. ``stored``:
    by request index, the leading pages of its prompt L3 held before the run
    (:func:`stored_pages`): a request may reuse those as if an earlier request had left them."""
    seen: set[int] = set()
    reusable = prompt = from_store = 0
    for request in sorted(trace, key=lambda r: (r.timestamp_ms, r.index)):
        prompt += request.input_length
        pages = list(page_chain(request, page_size))  # the whole prompt's pages
        key_pages = (request.input_length - 1) // page_size
        own = leading_pages(pages[:key_pages], seen)
        held = stored.get(request.index, 0) if stored else 0
        reused = max(own, min(held, key_pages))
        reusable += reused * page_size
        from_store += (reused - own) * page_size
        seen.update(pages)
    return TraceBound(
        hit_rate=round(reusable / prompt, 6) if prompt else 0.0,
        reusable_tokens=reusable,
        prompt_tokens=prompt,
        store_tokens=from_store,
    )


def stored_pages(
    trace: list[TraceRequest], page_size: int, storage: Storage, tp_size: int = 1
) -> dict[int, int]:
    """By request index, the leading whole pages of its prompt ``storage`` holds now (rank
    0's keys under tensor parallelism), for requests it holds any of."""
    key_of, _ = rank_storage_keys(0, tp_size)
    held = {}
    for request in trace:
        digests = page_hashes(request.tokens(), page_size, ROOT_NAMESPACE)
        count = storage.batch_exists([key_of(digest) for digest in digests])
        if count:
            held[request.index] = count
    return held


def leading_pages(pages: Sequence[int], held: Container[int]) -> int:
    """How many of ``pages`` (a :func:`page_chain`), from the first, ``held`` holds: the pages
    a tree of them would match."""
    count = 0
    for page in pages:
        if page not in held:
            break
        count += 1
    return count


def page_chain(request: TraceRequest, page_size: int) -> Iterator[int]:
    """One id per whole page of the request's prompt, each naming its page and every page
    before it (so equal ids mean equal prefixes). Token ``j`` of block ``h`` is ``h * 512 + j``
    (:meth:`TraceRequest.tokens`), so a page is named by the blocks and offsets it covers,
    without synthesizing a token."""
    whole_tokens = request.input_length // page_size * page_size
    chain = 0
    for start in range(0, whole_tokens, page_size):
        pieces = []
        position, end = start, start + page_size
        while position < end:
            block = position // BLOCK_TOKENS
            stop = min((block + 1) * BLOCK_TOKENS, end)
            offset = block * BLOCK_TOKENS
            pieces.append((request.hash_ids[block], position - offset, stop - offset))
            position = stop
        chain = hash((chain, tuple(pieces)))
        yield chain
