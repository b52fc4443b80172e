"""The connector's worker side: bounce → vLLM's blocks, and vLLM's blocks → L3.

It decides nothing: the scheduler side's metadata says which bounce slots go to which blocks
and which blocks go to L3 under which keys. A synchronous load (vLLM scheduled its request in
this step, and calls ``start_load_kv`` before the forward) is copied and waited for there, and
reported only if it failed (its blocks as load errors). An asynchronous load is queued in
``start_load_kv`` and reported by the first ``get_finished`` that finds its copy done: the
same step on the CPU, where copies are synchronous; on CUDA once its event has fired (vLLM
schedules the request only after that, so its forward never reads a block still being
written). An asynchronous load that fails to start (or that the scheduler side could not make
after vLLM allocated for it) is reported finished at once, with its blocks in
``get_block_ids_with_load_errors`` in that step, as vLLM's contract asks. Saves are made in
``wait_for_save``, after the step's forward wrote the blocks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...runtime.copy import CopyHandle
from ...runtime.engine import SharedHostPool
from ...runtime.pools import KVLayout
from ...runtime.storage import Storage
from .kv_layout import PagedKV

if TYPE_CHECKING:  # the metadata's base class is vLLM's: imported where vLLM runs
    from .transfer import StagefateMetadata

logger = logging.getLogger(__name__)


class WorkerSide:
    """The connector on one of vLLM's workers: makes the copies the metadata orders (this
    module's docstring says when each is reported)."""

    def __init__(
        self, layout: KVLayout, block_size: int, storage: Storage, bounce: Path, host_slots: int
    ) -> None:
        self.layout, self.block_size = layout, block_size
        self.storage, self._bounce = storage, bounce
        self._host_slots = host_slots
        self._host: SharedHostPool | None = None
        self.paged: PagedKV | None = None
        self._finished: set[str] = set()
        self._errors: set[int] = set()
        self._copying: dict[str, CopyHandle] = {}
        """Loads queued and not yet reported, by request."""
        self._made: set[str] = set()
        """Synchronous loads made this step (copied, or failed with their blocks in error)."""
        self.failed_saves = 0
        """Pages the write-through could not store (each is a miss later, nothing worse)."""

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.paged = PagedKV(kv_caches, self.layout, self.block_size)

    def _kv(self) -> PagedKV:
        if self.paged is None:
            raise RuntimeError("vLLM did not register its KV caches with the connector")
        return self.paged

    def _host_pool(self) -> SharedHostPool:
        """The scheduler's bounce buffer, mapped at the first load (the scheduler side, built
        after the workers, creates it)."""
        if self._host is None:
            self._host = SharedHostPool.attach(self.layout, self._host_slots, self._bounce)
        return self._host

    def start_load_kv(self, meta: StagefateMetadata) -> None:
        for order in meta.loads:
            if order.synchronous:  # made in this step, or failed with its blocks in error
                self._made.add(order.request_id)
            try:
                copy = self._kv().write_from_host(
                    self._host_pool(), order.host_slots, order.block_ids
                )
                if order.synchronous:  # this step's forward reads the blocks
                    copy.wait()
                    if copy.error() is not None:
                        raise RuntimeError(copy.error())
                else:
                    self._copying[order.request_id] = copy
            except Exception:  # reported to vLLM, which recomputes or fails the request
                logger.exception("stagefate: load of %s failed", order.request_id)
                self._errors.update(order.block_ids)
                if not order.synchronous:  # vLLM waits to hear of an asynchronous load only
                    self._finished.add(order.request_id)
        for request_id, block_ids in meta.unloadable.items():
            self._errors.update(block_ids)
            self._finished.add(request_id)
        self._errors.update(meta.unloadable_blocks)

    def wait_for_save(self, meta: StagefateMetadata) -> None:
        for order in meta.saves:
            try:
                self.storage.batch_set(order.keys, self._kv().pages(order.block_ids))
            except Exception:  # a page L3 lacks is a later miss, not a reason to stop serving
                logger.exception("stagefate: storing %d pages in L3 failed", len(order.keys))
                self.failed_saves += len(order.keys)

    def get_finished(self) -> set[str]:
        done = [rid for rid, copy in self._copying.items() if copy.done()]
        for rid in done:
            del self._copying[rid]
        finished, self._finished = self._finished | set(done), set()
        return finished

    def synchronous_loads_made(self) -> frozenset[str]:
        """The synchronous loads of the step (once: the next step starts empty)."""
        made, self._made = frozenset(self._made), set()
        return made

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors
