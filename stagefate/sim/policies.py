"""The prefetch policies a replay compares, behind one small interface.

* ``live``: this project: a :class:`~stagefate.BufferPipeline` (re-match the live tree at every
  decision, pin before the read, decline before committing memory, trim at consumption).
* ``blind``: the behaviour before SGLang PR #36834, as its description states it: the anchor is
  the node found at issue and carried (as its id was); at the IO commit it is pinned if it is still
  in the tree, and when it is not the pin is silently skipped and the read goes ahead anyway; at
  admission the staged span is spliced only if the live device prefix ends exactly where the span
  starts, otherwise the whole span is discarded (all-or-nothing), even when its tail could be used.

Both run over the same runtime objects (a pipeline's tree, pools, copy engine and storage) and a
:class:`~stagefate.runtime.ManualIO` whose operations the replay completes on its clock.

* ``sglang``: SGLang 0.5.23's own buffer-mode pipeline and tree
  (:mod:`stagefate.targets.sglang.policy`, ``make sglang``).

A policy hands the engine the tree it decides over, the device pool and the write-through, and
the replay an ``io`` with ManualIO's face (``queued``, ``complete``, ``pending``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..runtime import IOOp, IOResult, ManualIO, Storage, TokenKey, page_hashes
from ..runtime.hashing import ROOT_NAMESPACE, storage_key
from ..runtime.io import OpKind
from ..runtime.pools import SlotPool
from ..runtime.prefix_tree import Node, PrefixMatch, PrefixTree
from ..statemachine.config import PipelineConfig
from ..statemachine.pipeline import BufferPipeline
from ..targets import tree_factory

_EMPTY = torch.empty(0, dtype=torch.int64)


MakeRoom = Callable[[int, Node], bool]
"""The engine's evict-before-alloc: ``make_room(tokens, keep)`` frees LRU leaves (never
``keep``'s path) until ``tokens`` slots are free; False when they cannot be."""


READ_BOOKS = (
    "l3_reads",
    "l3_read_tokens",
    "l3_reads_wasted",
    "l3_read_tokens_wasted",
    "tokens_spliced",
    "tokens_trimmed",
)
"""The counters every policy keeps of its L3 reads (read tokens = spliced + wasted)."""


class ReadBooks:
    """A policy's books of its L3 reads: the :data:`READ_BOOKS` counters and the wasted reads
    and tokens by reason (they add up to the two wasted totals)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._wasted: dict[str, tuple[int, int]] = {}

    def read(self, tokens: int) -> None:
        self.counts["l3_reads"] += 1
        self.counts["l3_read_tokens"] += tokens

    def waste(self, reason: str, reads: int, tokens: int) -> None:
        if not reads and not tokens:
            return
        self.counts["l3_reads_wasted"] += reads
        self.counts["l3_read_tokens_wasted"] += tokens
        old_reads, old_tokens = self._wasted.get(reason, (0, 0))
        self._wasted[reason] = (old_reads + reads, old_tokens + tokens)

    def counters(self) -> dict[str, int]:
        return {name: self.counts[name] for name in READ_BOOKS}

    def wasted_by_reason(self) -> dict[str, tuple[int, int]]:
        return dict(self._wasted)


@dataclass(frozen=True)
class PolicyInputs:
    """What a replay builds every policy from."""

    config: PipelineConfig
    storage: Storage | None
    tree: str
    """``stagefate``, ``sglang-python`` or ``sglang-rust``."""
    prefetch_policy: str
    """The engine's ``best_effort`` / ``wait_complete`` / ``timeout``."""


class ReplayIO(Protocol):
    """The IO a replay completes on its clock (:class:`~stagefate.runtime.ManualIO`'s face)."""

    def queued(self, kind: OpKind | None = None) -> list[int]: ...

    def complete(self, op_id: int) -> None: ...

    def pending(self) -> int:
        """How many operations wait to be completed."""
        ...


class Policy(Protocol):
    name: str

    @property
    def io(self) -> ReplayIO: ...

    @property
    def tree(self) -> PrefixTree:
        """The tree the engine matches, inserts into and evicts from."""
        ...

    @property
    def device_pool(self) -> SlotPool: ...

    def write_through(self, key: TokenKey, device_indices: torch.Tensor) -> None:
        """A finished request's prompt pages go to L3 (the producer side)."""
        ...

    def issue(self, request_id: str, key: TokenKey, matched_len: int) -> None: ...

    def op_tokens(self, op_id: int) -> int:
        """Tokens a queued IO operation moves (for the time model)."""
        ...

    def poll(self) -> None: ...

    def pending(self, request_id: str) -> bool:
        """A prefetch is still on its way (admission may wait for it)."""
        ...

    def terminate(self, request_id: str) -> None:
        """The request is admitted without its prefetch: let go of it (a read in flight is
        abandoned and its bounce freed when it lands)."""
        ...

    def admit(self, request_id: str, prefix: PrefixMatch, make_room: MakeRoom) -> torch.Tensor:
        """Use what the prefetch staged; return the device slots spliced after ``prefix``."""
        ...

    def due_retries(self, waiting: Sequence[str]) -> list[str]: ...

    def counters(self) -> dict[str, int]:
        """``l3_reads`` … ``declined_device_covered`` for the replay's metrics."""
        ...

    def wasted_by_reason(self) -> dict[str, tuple[int, int]]:
        """``{reason: (reads, tokens)}`` of wasted L3 reads; sums to the wasted totals."""
        ...

    def finish(self) -> None:
        """The trace is done and the engine idle: let background work (write acks) land."""
        ...


class _OnPipeline:
    """A policy over a stagefate :class:`BufferPipeline`'s tree, pools and storage."""

    def __init__(self, pipe: BufferPipeline) -> None:
        self.pipe, self.tree, self.device_pool = pipe, pipe.tree, pipe.device_pool

    def write_through(self, key: TokenKey, device_indices: torch.Tensor) -> None:
        self.pipe.write_through(key, device_indices)

    def finish(self) -> None:
        """Writes through are synchronous here: nothing is left in the background."""


class LivePolicy(_OnPipeline):
    name = "live"

    def __init__(self, pipe: BufferPipeline) -> None:
        super().__init__(pipe)
        assert isinstance(pipe.io, ManualIO), "the replay drives a ManualIO on its clock"
        self.io = pipe.io

    def issue(self, request_id: str, key: TokenKey, matched_len: int) -> None:
        self.pipe.prefetch_from_storage(request_id, key, matched_len)

    def op_tokens(self, op_id: int) -> int:
        for record in self.pipe.records.values():
            if record.op_id == op_id:
                return record.spliced_tokens if record.state == "consumed" else record.read_tokens
        return 0

    def poll(self) -> None:
        self.pipe.poll()

    def pending(self, request_id: str) -> bool:
        return self.pipe.prefetch_pending(request_id)

    def terminate(self, request_id: str) -> None:
        self.pipe.release_aborted_request(request_id)

    def admit(self, request_id: str, prefix: PrefixMatch, make_room: MakeRoom) -> torch.Tensor:
        if self.pipe.state(request_id) not in ("staged", "trimmed"):
            return _EMPTY
        kv_tokens, _swa = self.pipe.plan_staged_splice(request_id, prefix.length)
        if not kv_tokens:
            return _EMPTY  # released at the plan: shrunk or device_covered
        # the engine evicts (and counts it); if room cannot be made, the pipeline drops the
        # hold as device_capacity
        make_room(kv_tokens, prefix.last_node)
        return self.pipe.init_load_back(request_id, prefix.device_indices)

    def due_retries(self, waiting: Sequence[str]) -> list[str]:
        return self.pipe.due_retries(waiting)

    def counters(self) -> dict[str, int]:
        stats = self.pipe.stats
        return {
            "l3_reads": stats.l3_reads,
            "l3_read_tokens": stats.l3_read_tokens,
            "l3_reads_wasted": stats.l3_reads_wasted,
            "l3_read_tokens_wasted": stats.l3_read_tokens_wasted,
            "tokens_spliced": stats.spliced_tokens,
            "tokens_trimmed": stats.trimmed_tokens,
            "declined_anchor_lost": stats.declined_anchor_lost,
            "declined_device_covered": stats.declined_device_covered,
        }

    def wasted_by_reason(self) -> dict[str, tuple[int, int]]:
        return self.pipe.wasted_by_reason()


@dataclass(eq=False)
class _BlindFetch:
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


class BlindPolicy(_OnPipeline):
    name = "blind"

    def __init__(self, pipe: BufferPipeline) -> None:
        super().__init__(pipe)
        self.io = ManualIO()
        self._fetches: dict[str, _BlindFetch] = {}
        self._ops: dict[int, _BlindFetch] = {}
        self._next_op = 0
        self.books = ReadBooks()

    def issue(self, request_id: str, key: TokenKey, matched_len: int) -> None:
        page = self.pipe.config.page_size
        aligned = key.whole_pages(page)
        span = len(aligned) - matched_len
        if request_id in self._fetches or span <= 0 or span < self.pipe.config.prefetch_threshold:
            return
        anchor = self.pipe.tree.match_prefix(aligned.prefix(matched_len)).last_node
        digests = page_hashes(aligned, page, ROOT_NAMESPACE)[matched_len // page :]
        fetch = _BlindFetch(aligned, matched_len, anchor, [storage_key(d) for d in digests])
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
        if fetch.read_tokens and not spliced:
            self.books.waste(reason, 1, fetch.read_tokens)

    def pending(self, request_id: str) -> bool:
        fetch = self._fetches.get(request_id)
        return fetch is not None and fetch.stage in ("exists", "reading")

    def terminate(self, request_id: str) -> None:
        fetch = self._fetches.pop(request_id, None)
        if fetch is not None:
            fetch.abandoned = True  # its IO completion ends it

    def admit(self, request_id: str, prefix: PrefixMatch, make_room: MakeRoom) -> torch.Tensor:
        fetch = self._fetches.pop(request_id, None)
        if fetch is None:
            return _EMPTY
        if fetch.stage != "staged":
            fetch.abandoned = True  # its IO completion ends it
            return _EMPTY
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
            return _EMPTY
        slots = pipe.device_pool.alloc(tokens) if make_room(tokens, prefix.last_node) else None
        if slots is None:
            self._drop(fetch, "device_capacity")
            return _EMPTY
        pipe.copy.h2d(pipe.host_pool, fetch.host, pipe.device_pool, slots).wait()
        present = pipe.tree.insert(fetch.key.prefix(end), torch.cat([prefix.device_indices, slots]))
        assert present == prefix.length, "the match and the insert run back to back"
        self.books.counts["tokens_spliced"] += tokens
        self._drop(fetch, "filled", spliced=tokens)
        return slots

    def due_retries(self, waiting: Sequence[str]) -> list[str]:
        return []  # the old path had no paced retry

    def counters(self) -> dict[str, int]:
        return {**self.books.counters(), "declined_anchor_lost": 0, "declined_device_covered": 0}

    def wasted_by_reason(self) -> dict[str, tuple[int, int]]:
        return self.books.wasted_by_reason()


def _pipeline(inputs: PolicyInputs) -> BufferPipeline:
    return BufferPipeline(
        inputs.config, storage=inputs.storage, tree_factory=tree_factory(inputs.tree)
    )


def _sglang(inputs: PolicyInputs) -> Policy:
    from ..targets.sglang.policy import SGLangPolicy  # imports SGLang: only when asked for

    return SGLangPolicy(inputs)


POLICIES: dict[str, Callable[[PolicyInputs], Policy]] = {
    "live": lambda inputs: LivePolicy(_pipeline(inputs)),
    "blind": lambda inputs: BlindPolicy(_pipeline(inputs)),
    "sglang": _sglang,
}


def policies_for_all(storage: str = "memory") -> tuple[list[str], str | None]:
    """What ``--policy all`` runs here, and why ``sglang`` is left out (None when it is not)."""
    from ..targets import TargetUnavailable
    from ..targets.sglang import require

    try:
        require()
    except TargetUnavailable as missing:
        return ["live", "blind"], f"{missing} to add sglang"
    if storage != "memory":
        return ["live", "blind"], "sglang reads its own L3, not --storage"
    return ["live", "blind", "sglang"], None
