"""Many engines sharing one L3 behind a router, on one simulated clock (``--instances N``).

Production HiCache deployments are many engine instances over one shared store (Mooncake
Store, 3FS): most L3 hits were written by another instance, and a router decides where each
request lands. Here each instance is a whole :class:`~.replay.Replay` (engine, tree, pools,
pipeline, IO servers) and all of them read and write one L3. The clock is shared: the instance
that acts next is always the one whose next event is earliest, and an arrival is routed when
the clock reaches it, to an instance chosen by the router from what the instances hold and run
at that moment. An instance that is mid-step takes it when the step ends, as one engine takes
a request that arrived during its step.

Routers (``--router``):

* ``round_robin``: instance ``i mod N`` for the i-th request;
* ``random``: uniformly, seeded by ``--seed``;
* ``cache_aware``: SGLang's router (sgl-model-gateway, ``CacheAwarePolicy``): each instance has
  an approximate tree of the prompts routed to it; when the load is imbalanced (the busiest
  instance's requests exceed the idlest's by more than ``balance_abs_threshold`` 32 **and** by
  a factor of more than ``balance_rel_threshold`` 1.0001) the request goes to the least loaded
  instance; otherwise to the instance whose tree matches the longest prefix of the prompt when
  that match is more than ``cache_threshold`` 0.5 of it, else to the instance with the smallest
  tree. Those are the router's defaults; load is an instance's waiting and running requests;
  the tree is kept in whole pages of the cacheable key and is not evicted (the router's
  ``max_tree_size`` of 2**24 characters is far above any trace here).

Each instance's writes are recorded by key (the first writer owns a page), so the L3 pages an
instance read that another instance wrote are counted (``cross_instance_read_tokens``), and of
them the pages its admissions spliced (``cross_instance_hits``: each policy names the keys an
admission spliced, :meth:`~.policy.Policy.spliced_keys`); the rest of those reads are wasted
work another instance's writes invited. Every policy runs behind the router the same way:
stagefate's pipelines read the shared store directly, SGLang's through its backend interface
(``stagefate.targets.sglang.shared_l3``), under its own keys.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from ..runtime import Storage
from ..runtime.storage import open_storage
from .arrivals import Arrivals
from .bound import leading_pages, page_chain
from .conversations import infer_turns
from .engine_model import Percentiles
from .policy import PolicyFactory
from .prefetches import PrefetchCounts
from .replay import STALLED, Replay, ReplayMetrics, ReplayOptions, WastedReads, replay_config
from .trace import TraceRequest

ROUTERS = ("round_robin", "random", "cache_aware")
CACHE_THRESHOLD = 0.5
BALANCE_ABS_THRESHOLD = 32
BALANCE_REL_THRESHOLD = 1.0001


class Router(Protocol):
    def route(self, item: TraceRequest, loads: Sequence[int]) -> int: ...


class RoundRobin:
    def __init__(self, instances: int) -> None:
        self._instances, self._next = instances, 0

    def route(self, item: TraceRequest, loads: Sequence[int]) -> int:
        chosen, self._next = self._next, (self._next + 1) % self._instances
        return chosen


class RandomRouter:
    def __init__(self, instances: int, seed: int) -> None:
        self._instances, self._random = instances, random.Random(seed)

    def route(self, item: TraceRequest, loads: Sequence[int]) -> int:
        return self._random.randrange(self._instances)


class CacheAware:
    """SGLang's cache-aware routing over approximate per-instance trees (the module says how)."""

    def __init__(self, instances: int, page_size: int) -> None:
        self._trees: list[set[int]] = [set() for _ in range(instances)]
        self._page = page_size

    def route(self, item: TraceRequest, loads: Sequence[int]) -> int:
        pages = list(page_chain(item, self._page))
        most, least = max(loads), min(loads)
        if most - least > BALANCE_ABS_THRESHOLD and most > least * BALANCE_REL_THRESHOLD:
            chosen = loads.index(least)
        else:
            matched = [leading_pages(pages, tree) for tree in self._trees]
            best = max(range(len(matched)), key=lambda i: matched[i])
            if pages and matched[best] / len(pages) > CACHE_THRESHOLD:
                chosen = best
            else:
                chosen = min(range(len(self._trees)), key=lambda i: len(self._trees[i]))
        self._trees[chosen].update(pages)
        return chosen


def make_router(name: str, instances: int, seed: int, page_size: int) -> Router:
    if name == "round_robin":
        return RoundRobin(instances)
    if name == "random":
        return RandomRouter(instances, seed)
    if name == "cache_aware":
        return CacheAware(instances, page_size)
    raise ValueError(f"unknown router {name!r}: pick one of {', '.join(ROUTERS)}")


class WriterTracking:
    """One instance's face of the shared L3: its writes recorded by key (the first writer
    owns a page), its reads of pages another instance wrote counted."""

    def __init__(self, shared: Storage, instance: int, writers: dict[str, int]) -> None:
        self._shared, self._instance, self._writers = shared, instance, writers
        self.foreign_pages_read = 0
        self.foreign_pages_spliced = 0

    def batch_exists(self, keys: Sequence[str]) -> int:
        return self._shared.batch_exists(keys)

    def batch_get(self, keys: Sequence[str]) -> list[torch.Tensor | None]:
        pages = self._shared.batch_get(keys)
        self._count(keys[: sum(page is not None for page in pages)])
        return pages

    def batch_get_into(self, keys: Sequence[str], out: np.ndarray, dtype: torch.dtype) -> int:
        copied = self._shared.batch_get_into(keys, out, dtype)
        self._count(keys[:copied])
        return copied

    def batch_set(self, keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
        self._shared.batch_set(keys, tensors)
        for key in keys:
            self._writers.setdefault(key, self._instance)

    def delete(self, keys: Sequence[str]) -> None:
        self._shared.delete(keys)

    def spliced(self, keys: Sequence[str]) -> None:
        """An admission of this instance spliced the pages of ``keys``."""
        self.foreign_pages_spliced += self._foreign(keys)

    def _count(self, keys: Sequence[str]) -> None:
        self.foreign_pages_read += self._foreign(keys)

    def _foreign(self, keys: Sequence[str]) -> int:
        mine = self._instance
        return sum(self._writers.get(key, mine) != mine for key in keys)


class InstancesMetrics(BaseModel):
    """One policy behind the router: the total, each instance, and what crossed instances."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total: ReplayMetrics
    instances: list[ReplayMetrics]
    cross_instance_read_tokens: int
    """Tokens read from L3 pages another instance wrote."""
    cross_instance_hits: int
    """Of those, the tokens spliced: prompt tokens served from another instance's writes."""


class InstancesReplay:
    """``instances`` replays of ``policy`` behind ``router``, over one L3 and one clock."""

    def __init__(
        self,
        policy: PolicyFactory,
        trace: list[TraceRequest],
        options: ReplayOptions,
        instances: int,
        router: str,
    ) -> None:
        if instances < 1:
            raise ValueError(f"instances={instances}: at least one engine is needed")
        config = replay_config(options, trace)
        shared = open_storage(config.storage, config.layout, config.page_size)
        writers: dict[str, int] = {}
        self.storages = [WriterTracking(shared, i, writers) for i in range(instances)]
        self.arrivals = Arrivals(
            trace, options.speed, infer_turns(trace), options.arrivals == "causal"
        )
        self.replays = [
            Replay(
                policy,
                trace,
                options,
                storage,
                arrivals=self.arrivals,
                on_splice=functools.partial(self._spliced, instance),
            )
            for instance, storage in enumerate(self.storages)
        ]
        self.router = make_router(router, instances, options.seed, options.page_size)
        self.options = options
        self.page = options.page_size

    def _spliced(self, instance: int, request_id: str) -> None:
        keys = self.replays[instance].policy.spliced_keys(request_id)
        self.storages[instance].spliced(keys)

    def run(self, on_request: Callable[[], None] | None = None) -> InstancesMetrics:
        started = time.perf_counter()
        replays, arrivals = self.replays, self.arrivals
        clock = [0.0] * len(replays)
        inbox: list[list[TraceRequest]] = [[] for _ in replays]
        while True:
            active = [i for i, r in enumerate(replays) if inbox[i] or r.has_work()]
            upcoming = arrivals.next_ms()
            acting = min(active, key=lambda i: clock[i]) if active else None
            if upcoming is not None and (acting is None or upcoming <= clock[acting]):
                for item in arrivals.due(upcoming):
                    loads = [
                        len(r.engine.waiting) + len(r.engine.running) + len(box)
                        for r, box in zip(replays, inbox, strict=True)
                    ]
                    chosen = self.router.route(item, loads)
                    inbox[chosen].append(item)
                    # mid-step it takes the request when the step ends; waiting, at once
                    stepping = replays[chosen].stepped and replays[chosen].has_work()
                    clock[chosen] = max(clock[chosen], upcoming) if stepping else upcoming
                continue
            if acting is None:
                if arrivals:  # turns wait on turns that will never finish
                    raise RuntimeError(STALLED)
                break
            arrived, inbox[acting] = inbox[acting], []
            clock[acting] = replays[acting].advance(clock[acting], arrived, on_request)
            if clock[acting] == float("inf"):
                raise RuntimeError(STALLED)
        end = max(clock)
        wall = time.perf_counter() - started
        each = [replay.close(end, wall) for replay in replays]
        self.metrics = InstancesMetrics(
            total=self._total(each, end, wall),
            instances=each,
            cross_instance_read_tokens=sum(s.foreign_pages_read for s in self.storages) * self.page,
            cross_instance_hits=sum(s.foreign_pages_spliced for s in self.storages) * self.page,
        )
        return self.metrics

    def _total(self, each: list[ReplayMetrics], end_ms: float, wall: float) -> ReplayMetrics:
        """Every instance's figures added up; rates from the added books."""
        engines = [replay.engine for replay in self.replays]
        computed = sum(e.books.prompt_tokens_computed for e in engines)
        admitted = sum(e.books.input_tokens for e in engines)
        summed = {
            field: sum(getattr(m, field) for m in each)
            for field, info in ReplayMetrics.model_fields.items()
            if info.annotation is int
        }
        wasted: dict[str, WastedReads] = {}
        for metrics in each:
            for reason, reads in metrics.wasted_by_reason.items():
                before = wasted.get(reason, WastedReads(reads=0, tokens=0))
                wasted[reason] = WastedReads(
                    reads=before.reads + reads.reads, tokens=before.tokens + reads.tokens
                )
        blocks = [m.engine for m in each]
        engine = blocks[0].model_copy(
            update={
                "steps": sum(b.steps for b in blocks),
                "prefill_tokens": sum(b.prefill_tokens for b in blocks),
                "decode_tokens": sum(b.decode_tokens for b in blocks),
                "retractions": sum(b.retractions for b in blocks),
                "evicted_tokens": sum(b.evicted_tokens for b in blocks),
                "peak_running": max(b.peak_running for b in blocks),
                "busy_fraction": round(sum(b.busy_fraction for b in blocks) / len(blocks), 6),
                "queue_wait_ms": Percentiles.of([w for e in engines for w in e.queue_waits]),
            }
        )
        return ReplayMetrics(
            **summed,
            hit_rate=round(1 - computed / admitted, 6) if admitted else 0.0,
            wall_seconds=round(wall, 3),
            wasted_by_reason=dict(sorted(wasted.items())),
            engine=engine,
            arrivals=self.arrivals.metrics(),
            prefetches=PrefetchCounts.total([m.prefetches for m in each]),
        )
