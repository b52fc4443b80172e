"""``blind``: the behaviour before SGLang PR #36834, run from its spec, ``spec/designs/blind.yaml``.

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

Every decision is a row of the spec, fired through the compiled machine like the pipeline's: the
``_guard_*`` and ``_effect_*`` methods below are bound by name (the machine refuses to build
unless they are exactly the spec's), and a fetch's end reason is one of the spec's ``reasons``;
fetches that end before a read are counted under it in :attr:`BlindPolicy.ended_unread`, reads
in the shared :class:`~stagefate.statemachine.books.ReadBooks`. The model checker explores the
same spec (``stagefate check --spec spec/designs/blind.yaml``).

It runs over the same runtime objects as ``live`` (a pipeline's tree, pools, copy engine and
storage) and a :class:`~stagefate.runtime.ManualIO` of its own.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..runtime import IOOp, IOResult, ManualIO, TokenKey, page_hashes
from ..runtime.hashing import ROOT_NAMESPACE, storage_key
from ..runtime.io import OpKind
from ..runtime.prefix_tree import Node, PrefixMatch
from ..spec import LifecycleSpec
from ..spec.load import DEFAULT_SPEC_PATH, load_spec
from ..spec.schema import ApiCall
from ..statemachine.books import ReadBooks
from ..statemachine.machine import CompiledMachine, Outcome, bind, named_methods
from ..statemachine.pipeline import BufferPipeline
from ..statemachine.retry import RetryBook
from .on_pipeline import OnPipeline
from .policy import EMPTY, MakeRoom

SPEC_PATH = DEFAULT_SPEC_PATH.parent / "designs" / "blind.yaml"


@functools.cache
def blind_spec() -> LifecycleSpec:
    """blind's spec, read once a process: one spec object, so its rows compile once (the
    machine caches them per spec object) however many replays build a policy."""
    return load_spec(SPEC_PATH)


@dataclass(eq=False)
class _BlindFetch:
    """One fetch: the machine's context (its ``state`` is the spec's) and what it holds."""

    request_id: str
    key: TokenKey
    matched_len: int
    state: str
    anchor: Node | None = None
    keys: tuple[str, ...] = ()
    op_id: int = 0
    hit_tokens: int = 0
    pinned: bool = False
    host: torch.Tensor | None = None
    read_tokens: int = 0
    # the arguments of the event being fired: the completion's tokens, the admission's prefix
    arg_tokens: int = 0
    arg_prefix: PrefixMatch | None = None
    arg_make_room: MakeRoom | None = None
    room_made: bool = False
    slots: torch.Tensor | None = None


class BlindPolicy(OnPipeline):
    name = "blind"
    GUARDS: ClassVar[frozenset[str]]
    EFFECTS: ClassVar[frozenset[str]]

    def __init__(self, pipe: BufferPipeline) -> None:
        super().__init__(pipe)
        self.io = ManualIO()
        self.spec = spec = blind_spec()
        self.machine: CompiledMachine[_BlindFetch] = CompiledMachine(
            spec,
            bind(self, "_guard_", self.GUARDS),
            bind(self, "_effect_", self.EFFECTS),
            exits={},
            end=self._end,
        )
        self._pending = spec.group("pending")
        self._hold = spec.group("hold")
        self._fetches: dict[str, _BlindFetch] = {}
        """Request id -> its live fetch (a terminated one leaves at once; its IO ends it)."""
        self._ops: dict[int, _BlindFetch] = {}
        self._next_op = 0
        self.books = ReadBooks()
        config = pipe.config
        self.retries = RetryBook(
            config.retry_interval, config.retry_max_attempts, head_due_at_once=False
        )
        self.retries_armed = 0
        self.ended_unread: Counter[str] = Counter()
        """Fetches ended before a read (and spans too short to fetch), by the spec's reason."""
        self._sweeps = 0  # scheduling passes the retry sweep has run

    # ------------------------------------------------------------------ the policy's calls

    def issue(self, request_id: str, key: TokenKey, matched_len: int) -> None:
        if self.fetch_in_flight(request_id):
            return  # the ownership pre-check
        aligned = key.whole_pages(self.pipe.config.page_size)
        fetch = _BlindFetch(request_id, aligned, matched_len, self.spec.initial)
        if not self.machine.fire(fetch, self.spec.issue_event).ended:
            self._fetches[request_id] = fetch

    def op_tokens(self, op_id: int) -> int:
        fetch = self._ops.get(op_id)
        return 0 if fetch is None else fetch.read_tokens

    def poll(self) -> None:
        for completion in self.io.drain():
            fetch = self._ops.pop(completion.op_id)
            fetch.arg_tokens = completion.tokens
            self.machine.fire(fetch, self.spec.completions[completion.kind])
            if self.machine.allows(fetch.state, self.spec.calls["poll"][0]):
                self._call(fetch, "poll")  # the commit follows a hit in its own pass

    def pending(self, request_id: str) -> bool:
        fetch = self._fetches.get(request_id)
        return fetch is not None and fetch.state in self._pending

    def fetch_in_flight(self, request_id: str) -> bool:
        """The request owns a fetch that has not ended (in flight, or staged and unconsumed)."""
        return request_id in self._fetches

    def terminate(self, request_id: str) -> None:
        fetch = self._fetches.pop(request_id, None)
        if fetch is not None:  # a query or read in flight: its completion ends it
            self._call(fetch, "release_aborted_request")

    def admit(self, request_id: str, prefix: PrefixMatch, make_room: MakeRoom) -> torch.Tensor:
        self.retries.forget(request_id)  # scheduled: a pending retry is moot
        fetch = self._fetches.pop(request_id, None)
        if fetch is None:
            return EMPTY
        if fetch.state not in self._hold:  # still on its way: its completion ends it
            self._call(fetch, "release_aborted_request")
            return EMPTY
        fetch.arg_prefix, fetch.arg_make_room = prefix, make_room
        if not self._call(fetch, "plan_staged_splice").ended:  # one admission: plan, splice
            self._call(fetch, "init_load_back")
        return EMPTY if fetch.slots is None else fetch.slots

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

    # ------------------------------------------------------------------ the machine's hooks

    def _call(self, fetch: _BlindFetch, call: ApiCall) -> Outcome:
        """Fire the events blind's spec binds to ``call``, in order, until one ends the fetch."""
        for event in self.spec.calls[call]:
            outcome = self.machine.fire(fetch, event)
            if outcome.ended:
                break
        return outcome

    def _end(self, fetch: _BlindFetch, reason: str) -> None:
        """Settle the fetch's read as spliced from or wasted (under ``reason`` when nothing of
        it was spliced); a fetch that read nothing counts under ``reason`` in ended_unread."""
        if self._fetches.get(fetch.request_id) is fetch:
            del self._fetches[fetch.request_id]
        if not fetch.read_tokens:
            self.ended_unread[reason] += 1
        elif fetch.slots is None:
            self.books.waste(reason, 1, fetch.read_tokens)

    def _submit(
        self, fetch: _BlindFetch, kind: OpKind, run: Callable[[int | None], IOResult]
    ) -> None:
        self._next_op += 1
        fetch.op_id = self._next_op
        self._ops[fetch.op_id] = fetch
        self.io.submit(IOOp(fetch.op_id, kind, run))

    # ------------------------------------------------------------------ guards (read only)

    def _guard_below_threshold(self, fetch: _BlindFetch) -> bool:
        # a fully matched prompt can still need L3 if its device prefix is evicted while it waits
        span = len(fetch.key) - fetch.matched_len
        return span <= 0 or span < self.pipe.config.prefetch_threshold

    def _guard_hit_below_threshold(self, fetch: _BlindFetch) -> bool:
        return fetch.arg_tokens < max(1, self.pipe.config.prefetch_threshold)

    def _guard_host_short(self, fetch: _BlindFetch) -> bool:
        return self.pipe.host_pool.available() < fetch.hit_tokens

    def _guard_read_empty(self, fetch: _BlindFetch) -> bool:
        return fetch.arg_tokens == 0

    def _guard_prefix_shrank(self, fetch: _BlindFetch) -> bool:
        return self._prefix(fetch).length < fetch.matched_len

    def _guard_span_device_resident(self, fetch: _BlindFetch) -> bool:
        return self._prefix(fetch).length >= fetch.matched_len + self._staged_tokens(fetch)

    def _guard_trim_positive(self, fetch: _BlindFetch) -> bool:
        return self._prefix(fetch).length != fetch.matched_len

    def _guard_device_short(self, fetch: _BlindFetch) -> bool:
        tokens = self._staged_tokens(fetch)
        return not fetch.room_made or self.pipe.device_pool.available() < tokens

    # ------------------------------------------------------------------ effects

    def _effect_arm_retry(self, fetch: _BlindFetch) -> None:
        if self.retries.arm(fetch.request_id, self._sweeps):
            self.retries_armed += 1

    def _effect_launch_query(self, fetch: _BlindFetch) -> None:
        pipe, page = self.pipe, self.pipe.config.page_size
        fetch.anchor = pipe.tree.match_prefix(fetch.key.prefix(fetch.matched_len)).last_node
        digests = page_hashes(fetch.key, page, ROOT_NAMESPACE)[fetch.matched_len // page :]
        fetch.keys = keys = tuple(storage_key(d) for d in digests)
        storage = pipe.storage
        self._submit(
            fetch, "exists", lambda _limit: IOResult(storage.batch_exists(list(keys)) * page)
        )

    def _effect_record_hit(self, fetch: _BlindFetch) -> None:
        fetch.hit_tokens = fetch.arg_tokens

    def _effect_pin_if_attached(self, fetch: _BlindFetch) -> None:
        anchor = fetch.anchor
        if fetch.matched_len and anchor is not None and anchor.attached:  # the id resolves
            self.pipe.tree.inc_lock_ref(anchor)
            fetch.pinned = True  # (a miss skips the pin silently and fetches anyway)

    def _effect_alloc_bounce(self, fetch: _BlindFetch) -> None:
        fetch.host = self.pipe.host_pool.alloc(fetch.hit_tokens)
        assert fetch.host is not None, "host_short was asked first"

    def _effect_launch_read(self, fetch: _BlindFetch) -> None:
        pipe, page = self.pipe, self.pipe.config.page_size
        fetch.read_tokens = fetch.hit_tokens
        self.books.read(fetch.hit_tokens)
        storage, copy, host_pool, host = pipe.storage, pipe.copy, pipe.host_pool, fetch.host
        keys = list(fetch.keys[: fetch.hit_tokens // page])
        assert host is not None

        def run(_limit: int | None) -> IOResult:
            return IOResult(copy.read_into_host(storage, keys, host_pool, host, page))

        self._submit(fetch, "read", run)

    def _effect_stage_read(self, fetch: _BlindFetch) -> None:
        assert fetch.host is not None
        read = fetch.arg_tokens
        if read < fetch.host.numel():
            self.pipe.host_pool.free(fetch.host[read:])
            fetch.host = fetch.host[:read]

    def _effect_record_plan(self, fetch: _BlindFetch) -> None:
        """Nothing to keep: blind splices at the prefix its admission saw, in the same call."""

    def _effect_evict_for_splice(self, fetch: _BlindFetch) -> None:
        assert fetch.arg_make_room is not None
        fetch.room_made = fetch.arg_make_room(
            self._staged_tokens(fetch), self._prefix(fetch).last_node
        )

    def _effect_alloc_device(self, fetch: _BlindFetch) -> None:
        fetch.slots = self.pipe.device_pool.alloc(self._staged_tokens(fetch))
        assert fetch.slots is not None, "device_short was asked first"

    def _effect_queue_h2d(self, fetch: _BlindFetch) -> None:
        pipe = self.pipe
        assert fetch.host is not None and fetch.slots is not None
        pipe.copy.h2d(pipe.host_pool, fetch.host, pipe.device_pool, fetch.slots).wait()

    def _effect_insert_tail(self, fetch: _BlindFetch) -> None:
        pipe, prefix, slots = self.pipe, self._prefix(fetch), fetch.slots
        assert slots is not None
        tokens = slots.numel()
        end = fetch.matched_len + tokens
        present = pipe.tree.insert(fetch.key.prefix(end), torch.cat([prefix.device_indices, slots]))
        assert present == prefix.length, "the match and the insert run back to back"
        self.books.spliced(tokens, 0)
        self.last_splice = (fetch.request_id, list(fetch.keys[: tokens // pipe.config.page_size]))

    def _effect_lock_request_prefix(self, fetch: _BlindFetch) -> None:
        """The engine locks the request's prefix as it admits it, the span included; the
        stored anchor's pin (an ancestor) is given up with the fetch's end (``unpin``)."""

    def _effect_unpin(self, fetch: _BlindFetch) -> None:
        if fetch.pinned and fetch.anchor is not None:
            self.pipe.tree.dec_lock_ref(fetch.anchor)
            fetch.pinned = False

    def _effect_free_bounce(self, fetch: _BlindFetch) -> None:
        if fetch.host is not None:
            self.pipe.host_pool.free(fetch.host)
            fetch.host = None

    def _prefix(self, fetch: _BlindFetch) -> PrefixMatch:
        assert fetch.arg_prefix is not None, "an admission's event"
        return fetch.arg_prefix

    def _staged_tokens(self, fetch: _BlindFetch) -> int:
        assert fetch.host is not None
        return int(fetch.host.numel())


BlindPolicy.GUARDS = named_methods(BlindPolicy, "_guard_")
BlindPolicy.EFFECTS = named_methods(BlindPolicy, "_effect_")
