"""``live``: this project, a :class:`~stagefate.BufferPipeline` as a replay policy (re-match the
live tree at every decision, pin before the read, decline before committing memory, trim at
consumption)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..runtime import ManualIO, TokenKey
from ..runtime.prefix_tree import PrefixMatch
from ..statemachine.books import replay_counters
from ..statemachine.pipeline import BufferPipeline
from .on_pipeline import OnPipeline
from .policy import EMPTY, MakeRoom
from .prefetches import declined_and_revoked


class LivePolicy(OnPipeline):
    name = "live"

    def __init__(self, pipe: BufferPipeline) -> None:
        super().__init__(pipe)
        assert isinstance(pipe.io, ManualIO), "the replay drives a ManualIO on its clock"
        self.io = pipe.io
        self.holds = pipe.spec.group("hold")
        self.spliced = pipe.spec.group("spliced")

    def issue(self, request_id: str, key: TokenKey, matched_len: int) -> None:
        self.pipe.prefetch_from_storage(request_id, key, matched_len)

    def op_tokens(self, op_id: int) -> int:
        for record in self.pipe.live_records.values():
            if record.op_id == op_id:
                return record.spliced_tokens if record.state in self.spliced else record.read_tokens
        return 0

    def poll(self) -> None:
        self.pipe.poll()

    def pending(self, request_id: str) -> bool:
        return self.pipe.prefetch_pending(request_id)

    def terminate(self, request_id: str) -> None:
        self.pipe.release_aborted_request(request_id)

    def admit(self, request_id: str, prefix: PrefixMatch, make_room: MakeRoom) -> torch.Tensor:
        pipe = self.pipe
        if pipe.state(request_id) not in self.holds:
            return EMPTY
        record = pipe.live_records[request_id]  # once consumed it leaves the records: kept here
        kv_tokens, _swa = pipe.plan_staged_splice(request_id, prefix.length)
        if not kv_tokens:
            return EMPTY  # released at the plan: shrunk or device_covered
        # the engine evicts (and counts it); if room cannot be made, the pipeline drops the
        # hold as device_capacity
        make_room(kv_tokens, prefix.last_node)
        slots = pipe.init_load_back(request_id, prefix.device_indices)
        if slots.numel():
            assert record.plan_prefix is not None
            page = pipe.config.page_size
            first = (record.plan_prefix - record.matched_len) // page  # the trimmed head
            self.last_splice = (
                request_id,
                list(record.span_keys[first : first + len(slots) // page]),
            )
        return slots

    def due_retries(self, waiting: Sequence[str]) -> list[str]:
        return self.pipe.due_retries(waiting)

    def counters(self) -> dict[str, int]:
        stats = self.pipe.stats
        return {
            **replay_counters(self.pipe.stats.model_dump()),
            "declined_anchor_lost": stats.declined_anchor_lost,
            "declined_device_covered": stats.declined_device_covered,
        }

    def wasted_by_reason(self) -> dict[str, tuple[int, int]]:
        return self.pipe.wasted_by_reason()

    def declines(self) -> dict[str, int]:
        return declined_and_revoked(self.pipe.stats.model_dump())
