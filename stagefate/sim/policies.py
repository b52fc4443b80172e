"""The two prefetch policies a replay compares, behind one small interface.

* ``live``: this project: a :class:`~stagefate.BufferPipeline` (re-match the live tree at every
  decision, pin before the read, decline before committing memory, trim at consumption).
* ``blind``: the behaviour before SGLang PR #36834, as its description states it: the anchor is
  the node found at issue and carried (as its id was); at the IO commit it is pinned if it is still
  in the tree, and when it is not the pin is silently skipped and the read goes ahead anyway; at
  admission the staged span is spliced only if the live device prefix ends exactly where the span
  starts, otherwise the whole span is discarded (all-or-nothing), even when its tail could be used.

Both run over the same runtime objects (a pipeline's tree, pools, copy engine and storage) and a
:class:`~stagefate.runtime.ManualIO` whose operations the replay completes on its clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..runtime import IOOp, IOResult, ManualIO, TokenKey, page_hashes
from ..runtime.hashing import ROOT_NAMESPACE, storage_key
from ..runtime.io import OpKind
from ..runtime.prefix_tree import Node, PrefixMatch, alloc_evicting
from ..statemachine.pipeline import BufferPipeline

_EMPTY = torch.empty(0, dtype=torch.int64)
_PENDING_STATES = frozenset(
    {"issued", "locked", "no_anchor", "cap_skip", "anchor_lost", "parked", "reading"}
)


class Policy(Protocol):
    name: str
    pipe: BufferPipeline
    io: ManualIO

    def issue(self, request_id: str, key: TokenKey, matched_len: int) -> None: ...

    def op_tokens(self, op_id: int) -> int:
        """Tokens a queued IO operation moves (for the time model)."""
        ...

    def poll(self) -> None: ...

    def pending(self, request_id: str) -> bool:
        """A prefetch is still on its way (admission may wait for it)."""
        ...

    def admit(self, request_id: str, prefix: PrefixMatch) -> torch.Tensor:
        """Use what the prefetch staged; return the device slots spliced after ``prefix``."""
        ...

    def due_retries(self, waiting: Sequence[str]) -> list[str]: ...

    def counters(self) -> dict[str, int]:
        """``l3_reads`` … ``declined_device_covered`` for the replay's metrics."""
        ...


class LivePolicy:
    name = "live"

    def __init__(self, pipe: BufferPipeline) -> None:
        assert isinstance(pipe.io, ManualIO), "the replay drives a ManualIO on its clock"
        self.pipe, self.io = pipe, pipe.io

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
        return self.pipe.state(request_id) in _PENDING_STATES

    def admit(self, request_id: str, prefix: PrefixMatch) -> torch.Tensor:
        state = self.pipe.state(request_id)
        if state in ("staged", "trimmed"):
            kv_tokens, _swa = self.pipe.plan_staged_splice(request_id, prefix.length)
            if kv_tokens:
                return self.pipe.init_load_back(request_id, prefix.device_indices)
        elif state in _PENDING_STATES:
            self.pipe.release_aborted_request(request_id)
        return _EMPTY

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


@dataclass(eq=False)
class _BlindFetch:
    key: TokenKey
    matched_len: int
    anchor: Node
    keys: list[str]
    stage: str = "exists"  # exists -> reading -> staged
    op_id: int = 0
    pinned: bool = False
    host: torch.Tensor | None = None
    read_tokens: int = 0
    abandoned: bool = False


class BlindPolicy:
    name = "blind"

    def __init__(self, pipe: BufferPipeline) -> None:
        self.pipe, self.io = pipe, ManualIO()
        self._fetches: dict[str, _BlindFetch] = {}
        self._ops: dict[int, _BlindFetch] = {}
        self._next_op = 0
        self._counts = dict.fromkeys(
            ("l3_reads", "l3_read_tokens", "l3_reads_wasted", "l3_read_tokens_wasted"), 0
        )
        self._spliced = 0

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
            self._drop(fetch)
            return
        if fetch.matched_len and fetch.anchor.attached:  # the stored id still resolves: pin
            pipe.tree.inc_lock_ref(fetch.anchor)
            fetch.pinned = True  # (a miss skips the pin silently and fetches anyway)
        fetch.host = pipe.host_pool.alloc(hit_tokens)
        if fetch.host is None:
            self._drop(fetch)
            return
        fetch.stage, fetch.read_tokens = "reading", hit_tokens
        self._counts["l3_reads"] += 1
        self._counts["l3_read_tokens"] += hit_tokens
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
        if fetch.abandoned or read == 0:
            self._drop(fetch)

    def _drop(self, fetch: _BlindFetch, spliced: int = 0) -> None:
        """End a fetch: unpin, free its bounce, settle its read as spliced from or wasted."""
        if fetch.pinned:
            self.pipe.tree.dec_lock_ref(fetch.anchor)
            fetch.pinned = False
        if fetch.host is not None:
            self.pipe.host_pool.free(fetch.host)
            fetch.host = None
        if fetch.read_tokens:
            self._counts["l3_read_tokens_wasted"] += fetch.read_tokens - spliced
            self._counts["l3_reads_wasted"] += 0 if spliced else 1

    def pending(self, request_id: str) -> bool:
        fetch = self._fetches.get(request_id)
        return fetch is not None and fetch.stage != "staged"

    def admit(self, request_id: str, prefix: PrefixMatch) -> torch.Tensor:
        fetch = self._fetches.pop(request_id, None)
        if fetch is None:
            return _EMPTY
        if fetch.stage != "staged":
            fetch.abandoned = True  # its IO completion ends it
            return _EMPTY
        assert fetch.host is not None
        pipe, tokens, slots = self.pipe, fetch.host.numel(), None
        if prefix.length == fetch.matched_len:  # all-or-nothing: the base must be exactly there
            slots = alloc_evicting(pipe.tree, pipe.device_pool, tokens, prefix.last_node)
        if slots is None:
            self._drop(fetch)
            return _EMPTY
        pipe.copy.h2d(pipe.host_pool, fetch.host, pipe.device_pool, slots).wait()
        end = fetch.matched_len + tokens
        present = pipe.tree.insert(fetch.key.prefix(end), torch.cat([prefix.device_indices, slots]))
        assert present == prefix.length, "the engine admits one request at a time"
        self._spliced += tokens
        self._drop(fetch, spliced=tokens)
        return slots

    def due_retries(self, waiting: Sequence[str]) -> list[str]:
        return []  # the old path had no paced retry

    def counters(self) -> dict[str, int]:
        return {
            **self._counts,
            "tokens_spliced": self._spliced,
            "tokens_trimmed": 0,
            "declined_anchor_lost": 0,
            "declined_device_covered": 0,
        }
