"""What the scheduler side tells the worker each step, and the loads it hands over.

The pipeline runs on vLLM's scheduler; the KV lives on its worker. An L3 read lands in the
shared bounce buffer on the scheduler's IO threads; the copy bounce → vLLM's blocks is the
worker's. :class:`HandedLoads` is the pipeline's copy engine for that copy: its ``h2d`` records
the copy for the worker and returns a handle that is done when vLLM reports the request's load
finished (``get_finished`` → ``update_connector_output``), so the spec's ``ack`` fires on the
worker's word, never before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from ...runtime.copy import CopyEngine, CopyHandle
from ...runtime.pools import Indices, SlotPool, as_array


@dataclass(frozen=True)
class LoadOrder:
    """Copy bounce slots into a request's blocks (``block_size`` slots per block, in order)."""

    request_id: str
    host_slots: np.ndarray
    block_ids: list[int]
    synchronous: bool = False
    """vLLM scheduled the request in this step (``load_kv_async=False``): the copy is done
    before the forward, and reported only if it failed (its blocks as load errors)."""


@dataclass(frozen=True)
class SaveOrder:
    """Store blocks in L3 under stagefate's page keys (one key per block)."""

    keys: list[str]
    block_ids: list[int]


@dataclass
class StagefateMetadata(KVConnectorMetadata):
    """One step's orders from the scheduler side to the workers: loads (bounce slots to
    blocks), saves (blocks to L3 keys) and loads that could not be made."""

    loads: list[LoadOrder] = field(default_factory=list)
    saves: list[SaveOrder] = field(default_factory=list)
    unloadable: dict[str, list[int]] = field(default_factory=dict)
    """Requests offered an asynchronous load the scheduler side could not make after all (the
    plan or the splice refused it once vLLM had allocated): the worker reports their blocks as
    load errors and the requests as finished, so vLLM recomputes them (or fails them, by its
    policy)."""
    unloadable_blocks: list[int] = field(default_factory=list)
    """The same for synchronous loads: their blocks are reported as load errors only (vLLM
    scheduled those requests in this step and recomputes the blocks after it)."""


@dataclass
class SynchronousLoadsMade(KVConnectorWorkerMetadata):
    """The worker's word on one step: the synchronous loads it made before the forward (a
    failed one's blocks are among the step's load errors). vLLM hands it to the scheduler side
    with that step's output, whatever order its steps are scheduled in."""

    request_ids: frozenset[str]

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, SynchronousLoadsMade)
        return SynchronousLoadsMade(self.request_ids | other.request_ids)


class LoadHandle:
    """Done once vLLM reported the request's load finished, or failed."""

    def __init__(self) -> None:
        self._done = False
        self._error: str | None = None

    def finish(self, error: str | None = None) -> None:
        self._done, self._error = True, error

    def done(self) -> bool:
        return self._done

    def error(self) -> str | None:
        return self._error

    def wait(self) -> None:
        if not self._done:
            raise RuntimeError(
                "a load handed to vLLM's worker completes when the worker reports it "
                "(get_finished); it cannot be waited for on the scheduler"
            )


@dataclass(frozen=True)
class HandedLoad:
    """A load the scheduler side planned and the worker copies: its slots, and the handle the
    scheduler side finishes when the worker reports it."""

    host_slots: np.ndarray
    device_slots: np.ndarray
    handle: LoadHandle


class HandedLoads(CopyEngine):
    """The pipeline's copy engine on vLLM's scheduler: bounce → device copies go to the worker."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self._unclaimed: list[HandedLoad] = []

    def h2d(
        self,
        src_pool: SlotPool,
        src_indices: Indices,
        dst_pool: SlotPool,
        dst_indices: Indices,
    ) -> CopyHandle:
        load = HandedLoad(as_array(src_indices).copy(), as_array(dst_indices).copy(), LoadHandle())
        if len(load.host_slots) != len(load.device_slots):
            raise ValueError(
                f"h2d: {len(load.host_slots)} source slots but {len(load.device_slots)} targets"
            )
        self._unclaimed.append(load)
        return load.handle

    def claim(self) -> HandedLoad:
        """The load the splice just made (the one ``init_load_back`` queued)."""
        if len(self._unclaimed) != 1:
            raise RuntimeError(
                f"{len(self._unclaimed)} loads wait to be claimed; each splice makes exactly one"
            )
        return self._unclaimed.pop()
