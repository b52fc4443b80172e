"""The IO operations the pipeline's effects submit, and the page keys they read.

Each operation is a closure over what it needs (keys, slots, pools), built on the scheduler's
thread by an effect and run by the IO executor (on an IO thread with :class:`ThreadedIO`): it
only moves bytes into or out of slots its record owns and reports what it did as an
:class:`IOResult`; every state change happens later, on the scheduler's thread, when ``poll``
drains the completion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..runtime import CopyEngine, IOResult, Storage, TokenKey, page_hashes
from ..runtime.hashing import Namespace, aux_storage_key, chain_digests
from ..runtime.pools import Indices, SlotPool
from ..runtime.prefix_tree import Node, PrefixTree
from ..runtime.tokens import TOKEN_BYTES

Run = Callable[[int | None], IOResult]
"""An operation: called with a token limit (a short completion) or None."""


def span_digests(
    tree: PrefixTree,
    tokens: TokenKey,
    matched: int,
    namespace: Namespace,
    page: int,
    anchor: Node | None,
) -> list[bytes]:
    """The page keys of ``tokens[matched:]``, hashed once per request.

    The chain continues from the page key the tree remembers at ``anchor`` (a write-through or
    an earlier prefetch left it there), so only the span's pages are hashed; a cold prefix is
    hashed whole once and offered to the tree for the next one. ``anchor`` is None when the
    prefix has none intact (an anchor the lock found short seeds nothing)."""
    if not matched:
        return page_hashes(tokens, page, namespace)
    seed = None if anchor is None else tree.cached_page_key(anchor)
    if seed is not None:
        return chain_digests(tokens.data[matched * TOKEN_BYTES :], page * TOKEN_BYTES, seed)
    chain = page_hashes(tokens, page, namespace)
    first = matched // page
    if anchor is not None:
        tree.remember_page_keys(tokens.prefix(matched), chain[:first], *namespace)
    return chain[first:]


class IOOperations:
    """Builds the three kinds of operation over one pipeline's storage, copy engine and pools."""

    def __init__(
        self,
        storage: Storage,
        copy: CopyEngine,
        host_pool: SlotPool,
        host_aux_pool: SlotPool | None,
        device_pool: SlotPool,
        aux_pool: SlotPool | None,
        page: int,
        aux_key: Callable[[bytes], str] = aux_storage_key,
    ) -> None:
        self.storage, self.copy, self.page = storage, copy, page
        self.aux_key = aux_key
        self.host_pool, self.host_aux_pool = host_pool, host_aux_pool
        self.device_pool, self.aux_pool = device_pool, aux_pool

    def exists(self, keys: Sequence[str]) -> Run:
        """How many tokens of ``keys``' pages L3 holds, consecutively from the first."""
        storage, page = self.storage, self.page

        def run(_limit: int | None) -> IOResult:
            return IOResult(tokens=storage.batch_exists(keys) * page)

        return run

    def read(
        self,
        keys: Sequence[str],
        digests: Sequence[bytes],
        tokens: int,
        host_indices: np.ndarray,
        aux_tokens: int,
        aux_indices: np.ndarray | None,
    ) -> Run:
        """Read ``tokens`` of the span (``keys``, their ``digests``) into the bounce slots, and
        the aux window of its last ``aux_tokens`` tokens into the aux bounce."""
        page = self.page
        end_page = tokens // page
        wanted_keys = keys[:end_page]
        aux_pages = aux_tokens // page
        aux_keys = (
            [self.aux_key(d) for d in digests[end_page - aux_pages : end_page]] if aux_pages else ()
        )
        storage, copy = self.storage, self.copy
        host_pool, host_aux_pool = self.host_pool, self.host_aux_pool

        def run(limit: int | None) -> IOResult:
            asked = wanted_keys if limit is None else wanted_keys[: max(0, limit) // page]
            read = copy.read_into_host(storage, asked, host_pool, host_indices, page)
            if not aux_keys:
                return IOResult(tokens=read)
            if read < tokens or host_aux_pool is None or aux_indices is None:
                return IOResult(tokens=read, aux_complete=False)
            aux_read = copy.read_into_host(storage, aux_keys, host_aux_pool, aux_indices, page)
            return IOResult(tokens=read, aux_complete=aux_read == len(aux_keys) * page)

        return run

    def h2d(
        self,
        source: Indices,
        target: Indices,
        aux_source: Indices | None,
        aux_target: Indices | None,
    ) -> Run:
        """Copy bounce slots ``source`` to device slots ``target`` (and the aux window)."""
        copy, host, device = self.copy, self.host_pool, self.device_pool
        host_aux, aux_pool = self.host_aux_pool, self.aux_pool

        def run(_limit: int | None) -> IOResult:
            handle = copy.h2d(host, source, device, target)
            if aux_target is not None and host_aux is not None and aux_pool is not None:
                assert aux_source is not None
                handle = copy.h2d(host_aux, aux_source, aux_pool, aux_target)
            return IOResult(handle=handle)

        return run
