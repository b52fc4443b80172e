"""``blind``: the behaviour before SGLang PR #36834, as its description states it.

The anchor is the node found at issue and carried (as its id was); at the IO commit it is pinned
if it is still in the tree, and when it is not the pin is silently skipped and the read goes
ahead anyway; at admission the staged span is spliced only if the live device prefix ends
exactly where the span starts, otherwise the whole span is discarded (all-or-nothing), even
when its tail could be used.

It has what SGLang already had four days before #36834: PR #35769's ownership pre-check (a
request whose fetch is in flight or staged is not issued again, which would leak its bounce) and
PR #36227's paced retry, as SGLang 0.5.19's wheel has it (``_storage_prefetch_missed_rids`` in
``unified_radix_cache.py``, swept by ``Scheduler._retry_missed_storage_prefetches``): a span too
short to fetch at issue, or whose L3 query found too little, marks the request; each scheduling
pass counts for every marked waiting request, the queue head included, and ``retry_interval``
passes later the request is matched and issued again, at most ``retry_max_attempts`` times. 0.5.19
ships the retry off (``hicache_storage_prefetch_retry_poll_interval`` 0); blind runs it on, with
live's pacing, so that what separates the two is #36834's decisions and not a default. A host
pool too full for the read drops it without a retry, as SGLang's cache mode does.

It runs over the same runtime objects as ``live`` (a pipeline's tree, pools, copy engine and
storage) and a :class:`~stagefate.runtime.ManualIO` of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..runtime import IOOp, IOResult, ManualIO, TokenKey, page_hashes
from ..runtime.hashing import ROOT_NAMESPACE, storage_key
from ..runtime.io import OpKind
from ..runtime.prefix_tree import Node, PrefixMatch
from ..statemachine.books import ReadBooks
from ..statemachine.pipeline import BufferPipeline
from ..statemachine.retry import RetryBook
from .on_pipeline import OnPipeline
from .policy import EMPTY, MakeRoom


@dataclass(eq=False)
class _BlindFetch:
    request_id: str
    key: TokenKey
    matched_len: int
    anchor: Node
    keys: list[str]
    stage: str = "exists"  # exists -> reading -> staged, or ended from any of them
    op_id: int = 0
    pinned: bool = False
    host: torch.Tensor | None = None
    read_tokens: int = 0
    abandoned: bool = False


class BlindPolicy(OnPipeline):
    name = "blind"

    def __init__(self, pipe: BufferPipeline) -> None:
        super().__init__(pipe)
        self.io = ManualIO()
        self._fetches: dict[str, _BlindFetch] = {}
        self._ops: dict[int, _BlindFetch] = {}
        self._next_op = 0
        self.books = ReadBooks()
        config = pipe.config
        self.retries = RetryBook(
            config.retry_interval, config.retry_max_attempts, head_due_at_once=False
        )
        self.retries_armed = 0
        self.ended_unread: Counter[str] = Counter()
        """Fetches ended before a read (and spans too short to fetch), by reason."""
        self._sweeps = 0  # scheduling passes the retry sweep has run

    def issue(self, request_id: str, key: TokenKey, matched_len: int) -> None:
        page = self.pipe.config.page_size
        aligned = key.whole_pages(page)
        span = len(aligned) - matched_len
        if self.fetch_in_flight(request_id):
            return  # the ownership pre-check
        if span <= 0 or span < self.pipe.config.prefetch_threshold:
            # a fully matched prompt can still need L3 if its device prefix is evicted while
            # it waits
            self.ended_unread["too_short"] += 1
            self._arm_retry(request_id)
            return
        anchor = self.pipe.tree.match_prefix(aligned.prefix(matched_len)).last_node
        digests = page_hashes(aligned, page, ROOT_NAMESPACE)[matched_len // page :]
        fetch = _BlindFetch(
            request_id, aligned, matched_len, anchor, [storage_key(d) for d in digests]
        )
        self._fetches[request_id] = fetch
        storage, keys = self.pipe.storage, fetch.keys
        self._submit(fetch, "exists", lambda _limit: IOResult(storage.batch_exists(keys) * page))

    def _submit(
        self, fetch: _BlindFetch, kind: OpKind, run: Callable[[int | None], IOResult]
    ) -> None:
        self._next_op += 1
        fetch.op_id = self._next_op
        self._ops[fetch.op_id] = fetch
        self.io.submit(IOOp(fetch.op_id, kind, run))

    def op_tokens(self, op_id: int) -> int:
        fetch = self._ops.get(op_id)
        return 0 if fetch is None else fetch.read_tokens

    def poll(self) -> None:
        for completion in self.io.drain():
            fetch = self._ops.pop(completion.op_id)
            if completion.kind == "exists":
                self._commit(fetch, completion.tokens)
            else:
                self._staged(fetch, completion.tokens)

    def _commit(self, fetch: _BlindFetch, hit_tokens: int) -> None:
        pipe = self.pipe
        if fetch.abandoned or hit_tokens < max(1, pipe.config.prefetch_threshold):
            self._drop(fetch, "revoked")
            if not fetch.abandoned:
                self._arm_retry(fetch.request_id)
            return
        if fetch.matched_len and fetch.anchor.attached:  # the stored id still resolves: pin
            pipe.tree.inc_lock_ref(fetch.anchor)
            fetch.pinned = True  # (a miss skips the pin silently and fetches anyway)
        fetch.host = pipe.host_pool.alloc(hit_tokens)
        if fetch.host is None:
            self._drop(fetch, "host_capacity")
            return
        fetch.stage, fetch.read_tokens = "reading", hit_tokens
        self.books.read(hit_tokens)
        storage, copy, host_pool, host = pipe.storage, pipe.copy, pipe.host_pool, fetch.host
        keys, page = fetch.keys[: hit_tokens // pipe.config.page_size], pipe.config.page_size

        def run(_limit: int | None) -> IOResult:
            return IOResult(copy.read_into_host(storage, keys, host_pool, host, page))

        self._submit(fetch, "read", run)

    def _staged(self, fetch: _BlindFetch, read: int) -> None:
        assert fetch.host is not None
        if read < fetch.host.numel():
            self.pipe.host_pool.free(fetch.host[read:])
            fetch.host = fetch.host[:read]
        fetch.stage = "staged"
        if fetch.abandoned:
            self._drop(fetch, "aborted")
        elif read == 0:
            self._drop(fetch, "discarded")

    def _drop(self, fetch: _BlindFetch, reason: str, spliced: int = 0) -> None:
        """End a fetch: unpin, free its bounce, settle its read as spliced from or wasted
        (under ``reason`` when nothing of it was spliced)."""
        fetch.stage = "ended"
        if fetch.pinned:
            self.pipe.tree.dec_lock_ref(fetch.anchor)
            fetch.pinned = False
        if fetch.host is not None:
            self.pipe.host_pool.free(fetch.host)
            fetch.host = None
        if not fetch.read_tokens:
            self.ended_unread[reason] += 1
        elif not spliced:
            self.books.waste(reason, 1, fetch.read_tokens)

    def pending(self, request_id: str) -> bool:
        fetch = self._fetches.get(request_id)
        return fetch is not None and fetch.stage in ("exists", "reading")

    def fetch_in_flight(self, request_id: str) -> bool:
        """The request owns a fetch that has not ended (in flight, or staged and unconsumed)."""
        fetch = self._fetches.get(request_id)
        return fetch is not None and fetch.stage != "ended"

    def _arm_retry(self, request_id: str) -> None:
        if self.retries.arm(request_id, self._sweeps):
            self.retries_armed += 1

    def terminate(self, request_id: str) -> None:
        fetch = self._fetches.pop(request_id, None)
        if fetch is not None:
            fetch.abandoned = True  # its IO completion ends it

    def admit(self, request_id: str, prefix: PrefixMatch, make_room: MakeRoom) -> torch.Tensor:
        self.retries.forget(request_id)  # scheduled: a pending retry is moot
        fetch = self._fetches.pop(request_id, None)
        if fetch is None:
            return EMPTY
        if fetch.stage != "staged":
            fetch.abandoned = True  # its IO completion ends it
            return EMPTY
        assert fetch.host is not None
        pipe, tokens = self.pipe, fetch.host.numel()
        end = fetch.matched_len + tokens
        # all-or-nothing: the splice base must be exactly where the span starts
        if prefix.length != fetch.matched_len:
            if prefix.length < fetch.matched_len:
                reason = "shrunk"  # the base was evicted while the fetch was unpinned
            elif prefix.length >= end:
                reason = "device_covered"
            else:
                reason = "not_trimmed"  # a sibling published the head; the tail is unusable
            self._drop(fetch, reason)
            return EMPTY
        slots = pipe.device_pool.alloc(tokens) if make_room(tokens, prefix.last_node) else None
        if slots is None:
            self._drop(fetch, "device_capacity")
            return EMPTY
        pipe.copy.h2d(pipe.host_pool, fetch.host, pipe.device_pool, slots).wait()
        present = pipe.tree.insert(fetch.key.prefix(end), torch.cat([prefix.device_indices, slots]))
        assert present == prefix.length, "the match and the insert run back to back"
        self.books.spliced(tokens, 0)
        self.last_splice = (request_id, fetch.keys[: tokens // pipe.config.page_size])
        self._drop(fetch, "filled", spliced=tokens)
        return slots

    def due_retries(self, waiting: Sequence[str]) -> list[str]:
        """The pass's sweep over the waiting queue: the requests whose retry is due."""
        due = self.retries.due(waiting, self._sweeps)
        self._sweeps += 1
        return due

    def counters(self) -> dict[str, int]:
        books = self.books.replay_counters()
        return {**books, "declined_anchor_lost": 0, "declined_device_covered": 0}

    def wasted_by_reason(self) -> dict[str, tuple[int, int]]:
        return self.books.wasted_by_reason()

    def declines(self) -> dict[str, int]:
        return dict(self.ended_unread)
