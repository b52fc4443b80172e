"""``stagefate fuzz --tp N``: N tensor-parallel ranks in lockstep under per-rank faults.

Each rank is a pipeline of its own (tree, pools, L3 keys with its rank) over one L3, and every
scheduler call goes to every rank, as SGLang's ranks each run the same scheduler. The world is
where ranks differ: one rank's shard of a page missing from L3, one rank's read short or failed,
one rank's completions late by passes, one rank's bounce pool fuller. After every step, on every
rank: the tree's own check, bounce and pin conservation, the read books; across ranks, lockstep
(the same records, counters, pins, bounce use and tree on every rank); and rank bytes (every cached
token's KV on a rank is that rank's producer's shard: no rank splices a span another dropped).
A :class:`Cluster` holds the ranks this process drives: all of them on threads agreeing through
:class:`~stagefate.statemachine.group.LocalGroup` (:class:`ThreadCluster`), or this process's
one rank agreeing with the other processes through
:class:`~stagefate.statemachine.group.TorchGroup` (:class:`ProcessCluster`, ``--processes``).
Every process runs the same program (same seed): whatever a rule or a precondition reads is
lockstep state, and a fault is applied by the process that holds the rank it names. The
``agreement`` class the ranks agree with can be swapped, for the planted bugs.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import hypothesis.core as hypothesis_core
import torch
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ..runtime import FileStorage, ManualClock, ManualIO, MemoryStorage, Storage
from ..runtime.hashing import ROOT_NAMESPACE, page_hashes, rank_storage_keys
from ..statemachine.config import PipelineConfig
from ..statemachine.group import Group, LocalGroup, TorchGroup
from ..statemachine.lockstep import RankAgreement
from ..statemachine.pipeline import BufferPipeline
from .campaign import reported_unless_interrupted
from .gloo import run_ranks_over_gloo
from .invariants import (
    assert_books_close,
    assert_pins_counted,
    bounce_owned,
    copies_in_flight,
    spec_invariant,
)
from .stepping import manual_io
from .world import measure

SEQUENCES = 2
PAGES = 6
TOKENS_PER_SEQUENCE = 100
RANK_MARK = 1000.0
"""A rank's shard of token t holds t + rank x RANK_MARK (float32: exact)."""


class RankTally:
    states = 0


TALLY = RankTally()


def rank_config(rank: int, size: int) -> PipelineConfig:
    return PipelineConfig(
        page_size=1,
        layers=1,
        kv_heads=size,
        head_dim=2,
        dtype=torch.float32,
        device_tokens=48,
        host_tokens=24,
        device="cpu",
        io="manual",
        max_context_len=8,
        retry_interval=2,
        retry_max_attempts=3,
        tp_size=size,
        tp_rank=rank,
    )


def _rank_pipeline(
    group: Group, size: int, storage: Storage, agreement: type[RankAgreement]
) -> BufferPipeline:
    # each rank times its reads by a clock of its own, which the fuzzer moves rank by rank
    io = ManualIO(ManualClock())
    pipe = BufferPipeline(rank_config(group.rank, size), storage=storage, io=io, group=group)
    pipe._agreement = agreement(group)  # the planted bugs' hook
    return pipe


Rank = tuple[int, BufferPipeline, BufferPipeline]
"""(rank, its consumer pipeline under test, its producer writing its shard through)."""


class Cluster(Protocol):
    size: int
    local: list[Rank]
    """The ranks this process drives."""

    def together(self, calls: Sequence[Callable[[], object]]) -> None:
        """One call per local rank, run so the ranks can meet at the agreement."""
        ...

    def gather(self, values: Sequence[object]) -> list[object]:
        """Every rank's value (the local ones given in ``local``'s order), in rank order."""
        ...


class ThreadCluster:
    """Every rank in this process, each agreeing on a thread of its own."""

    def __init__(self, size: int, agreement: type[RankAgreement]) -> None:
        self.size = size
        storage = MemoryStorage()
        producers, _ = self._build(storage, RankAgreement)
        consumers, self._group = self._build(storage, agreement)
        self.local = [(rank, consumers[rank], producers[rank]) for rank in range(size)]

    def _build(
        self, storage: Storage, agreement: type[RankAgreement]
    ) -> tuple[list[BufferPipeline], LocalGroup]:
        groups = LocalGroup.create(self.size, timeout=10.0)
        build = [
            functools.partial(_rank_pipeline, group, self.size, storage, agreement)
            for group in groups
        ]
        return groups[0].run(*build), groups[0]

    def together(self, calls: Sequence[Callable[[], object]]) -> None:
        self._group.run(*calls)

    def gather(self, values: Sequence[object]) -> list[object]:
        return list(values)


class ProcessCluster:
    """This process's one rank, agreeing with the others over ``torch.distributed``; each
    program's L3 is a directory of its own under ``l3``, named by the program's ordinal (the
    same in every process)."""

    programs = 0

    def __init__(self, size: int, agreement: type[RankAgreement], l3: Path) -> None:
        self.size = size
        ProcessCluster.programs += 1
        storage = FileStorage(l3 / f"program-{ProcessCluster.programs}")
        self._group = group = TorchGroup()  # this process's rank of the default group
        producer = _rank_pipeline(group, size, storage, RankAgreement)
        consumer = _rank_pipeline(group, size, storage, agreement)
        self.local = [(group.rank, consumer, producer)]

    def together(self, calls: Sequence[Callable[[], object]]) -> None:
        for call in calls:
            call()

    def gather(self, values: Sequence[object]) -> list[object]:
        (value,) = values
        return self._group.all_gather(value)


class RankFuzzer(RuleBasedStateMachine):
    tp = 2
    make_cluster: Callable[[int], Cluster] = functools.partial(
        ThreadCluster, agreement=RankAgreement
    )

    def __init__(self) -> None:
        super().__init__()
        self.cluster = self.make_cluster(self.tp)
        self.local = self.cluster.local
        self.lead = self.local[0][1]
        """A local rank's pipeline: what rules and preconditions read is lockstep state."""
        self.issued = 0
        self.tokens_of: dict[str, list[int]] = {}
        self.held: dict[int, torch.Tensor] = {}
        """Bounce slots the fuller-pool fault holds, by rank (on the rank's process)."""
        self.held_pages: dict[int, int] = {}
        """How many, by rank, on every process."""

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _tokens(sequence: int, pages: int) -> list[int]:
        start = 1 + sequence * TOKENS_PER_SEQUENCE
        return list(range(start, start + pages))

    def _each(self, call: Callable[[BufferPipeline], object]) -> list[object]:
        return [call(pipe) for _rank, pipe, _producer in self.local]

    def _here(self, rank: int) -> Rank | None:
        """The local rank ``rank`` names (a fault's rank, taken modulo the ranks), if here."""
        rank %= self.tp
        return next((entry for entry in self.local if entry[0] == rank), None)

    def _live(self, group: str) -> list[str]:
        states = self.lead.spec.group(group)
        return sorted(r for r, rec in self.lead.live_records.items() if rec.state in states)

    def _poll(self, late: int | None = None) -> None:
        for rank, pipe, _producer in self.local:
            if rank != late:
                manual_io(pipe).complete_all()
        self.cluster.together([pipe.poll for _rank, pipe, _producer in self.local])

    # ------------------------------------------------------------------ the scheduler's calls

    @rule(sequence=st.integers(0, SEQUENCES - 1), pages=st.integers(1, PAGES))
    def issue(self, sequence: int, pages: int) -> None:
        tokens = self._tokens(sequence, pages)
        request_id = f"r{self.issued}"
        self.issued += 1
        self.tokens_of[request_id] = tokens
        for _rank, pipe, _producer in self.local:
            pipe.prefetch_from_storage(request_id, tokens, pipe.tree.match_prefix(tokens).length)

    @rule()
    def poll(self) -> None:
        self._poll()

    @rule(late=st.integers(0, 3))
    def poll_with_one_rank_late(self, late: int) -> None:
        """One rank's IO completes nothing this pass (its completions arrive passes later)."""
        self._poll(late % self.tp)

    @rule()
    def reissue_due_retries(self) -> None:
        due = self._each(lambda pipe: pipe.due_retries(sorted(self.tokens_of)))
        assert all(d == due[0] for d in due), f"ranks disagree on the due retries: {due}"
        for request_id in due[0]:  # type: ignore[attr-defined]
            tokens = self.tokens_of[request_id]
            for _rank, pipe, _producer in self.local:
                matched = pipe.tree.match_prefix(tokens).length
                pipe.prefetch_from_storage(request_id, tokens, matched)

    @precondition(lambda self: bool(self._live("hold")))
    @rule(which=st.integers(0, 7))
    def admit(self, which: int) -> None:
        holds = self._live("hold")
        request_id = holds[which % len(holds)]
        tokens = self.tokens_of[request_id]
        for _rank, pipe, _producer in self.local:
            prefix = pipe.tree.match_prefix(tokens)
            kv_tokens, _aux = pipe.plan_staged_splice(request_id, prefix.length)
            if kv_tokens:
                pipe.init_load_back(request_id, prefix.device_indices)

    @precondition(lambda self: bool(self.lead.live_records))
    @rule(which=st.integers(0, 7))
    def abort(self, which: int) -> None:
        live = sorted(self.lead.live_records)
        request_id = live[which % len(live)]
        self._each(lambda pipe: pipe.release_aborted_request(request_id))

    @rule(tokens=st.integers(1, 24))
    def evict(self, tokens: int) -> None:
        self._each(lambda pipe: pipe.tree.evict(tokens))  # the same on every rank: lockstep

    # ------------------------------------------------------------------ the world

    @rule(sequence=st.integers(0, SEQUENCES - 1), pages=st.integers(1, PAGES))
    def publish(self, sequence: int, pages: int) -> None:
        """Each producer rank writes its shard of the prompt through to L3."""
        tokens = self._tokens(sequence, pages)
        for rank, _pipe, producer in self.local:
            slots = producer.device_pool.alloc(len(tokens))
            assert slots is not None
            values = torch.tensor(tokens, dtype=torch.float32) + rank * RANK_MARK
            producer.device_pool.kv[:, :, slots] = values.view(1, 1, -1, 1, 1)
            producer.write_through(tokens, slots)
            producer.device_pool.free(slots)

    @rule(
        sequence=st.integers(0, SEQUENCES - 1),
        rank=st.integers(0, 3),
        from_page=st.integers(0, PAGES - 1),
    )
    def one_rank_loses_pages(self, sequence: int, rank: int, from_page: int) -> None:
        here = self._here(rank)
        if here is None:
            return
        digests = page_hashes(self._tokens(sequence, PAGES), 1, ROOT_NAMESPACE)[from_page:]
        key, _aux_key = rank_storage_keys(here[0], self.tp)
        here[1].storage.delete([key(d) for d in digests])

    @rule(rank=st.integers(0, 3), which=st.integers(0, 7), short=st.integers(0, PAGES))
    def one_rank_completes_one_op(self, rank: int, which: int, short: int) -> None:
        """One rank's L3 operation (existence query or read) completes alone: fully, short, or
        failed. H2D copies are the rank's own device work and are not failed here."""
        here = self._here(rank)
        if here is None:
            return
        io = manual_io(here[1])
        queued = io.queued("exists") + io.queued("read")
        if not queued:
            return
        op_id = queued[which % len(queued)]
        if short == PAGES:
            io.fail(op_id)
        elif short:
            io.complete_short(op_id, short - 1)
        else:
            io.complete(op_id)

    @rule(
        rank=st.integers(0, 3),
        measured=st.sampled_from(["load", "forward"]),
        tokens=st.sampled_from([1, 4, 16]),
        seconds=st.sampled_from([1e-5, 1e-3, 0.1]),
    )
    def one_rank_measures_speeds(
        self, rank: int, measured: str, tokens: int, seconds: float
    ) -> None:
        """One rank's engine reports a load's or a forward's time (each rank times its own):
        the IO commits must decide on the estimate the ranks agreed."""
        here = self._here(rank)
        if here is not None:
            measure(here[1].speeds, measured, tokens, seconds)

    @rule(rank=st.integers(0, 3), seconds=st.sampled_from([1e-3, 0.1, 1.0]))
    def one_rank_clock_moves(self, rank: int, seconds: float) -> None:
        """Time passes on one rank alone (each rank's reads run their own time): a give-up
        must wait until every rank finds the read overdue."""
        here = self._here(rank)
        if here is not None:
            clock = manual_io(here[1]).clock
            assert isinstance(clock, ManualClock)
            clock.advance(seconds)

    @precondition(lambda self: bool(self._live("pending")))
    @rule()
    def give_up_slow_reads(self) -> None:
        """The scheduler asks, for every request waiting on a read, whether to compute."""
        for request_id in self._live("pending"):
            asked = [pipe.give_up_slow_read(request_id) for _rank, pipe, _ in self.local]
            gave_up = self.cluster.gather(asked)
            assert len(set(gave_up)) == 1, f"ranks disagree on giving up {request_id}: {gave_up}"

    @rule(rank=st.integers(0, 3), pages=st.integers(1, 20))
    def one_rank_bounce_fills(self, rank: int, pages: int) -> None:
        rank %= self.tp
        if rank in self.held_pages:
            return
        # the rank's free bounce, from any rank's: they differ only by what this fault holds
        free = self.lead.host_pool.available() + self.held_pages.get(self.local[0][0], 0)
        pages = min(pages, free)
        if not pages:
            return
        self.held_pages[rank] = pages
        here = self._here(rank)
        if here is not None:
            held = here[1].host_pool.alloc(pages)
            assert held is not None
            self.held[rank] = held

    @precondition(lambda self: bool(self.held_pages))
    @rule()
    def bounce_frees(self) -> None:
        for rank, held in self.held.items():
            self._here(rank)[1].host_pool.free(held)  # type: ignore[index]
        self.held.clear()
        self.held_pages.clear()

    def teardown(self) -> None:
        """Every request ends and every operation lands: each rank is quiescent, in lockstep."""
        for request_id in sorted(self.lead.live_records):
            for _rank, pipe, _producer in self.local:
                pipe.release_aborted_request(request_id)
        for _ in range(3):
            self._poll()
        for rank, pipe, _producer in self.local:
            assert pipe.is_idle(), f"rank {rank}: {list(pipe.live_records)} live"
            assert pipe.pinned_tokens == 0 and pipe.tree.protected_size == 0

    # ------------------------------------------------------------------ invariants

    @spec_invariant
    def lockstep(self) -> None:
        TALLY.states += 1
        views = self.cluster.gather([self._view(r, pipe) for r, pipe, _producer in self.local])
        for rank, view in enumerate(views[1:], start=1):
            assert view == views[0], f"rank {rank} differs from rank 0: {view} != {views[0]}"

    def _view(self, rank: int, pipe: BufferPipeline) -> tuple[object, ...]:
        records = {
            r: (rec.state, rec.matched_len, rec.span_end, rec.read_tokens, rec.plan_tokens)
            for r, rec in pipe.live_records.items()
        }
        stats = pipe.stats.model_dump()
        stats.pop("stale_completions")  # each rank's own timing
        tree = sorted((tuple(n.tokens()), n.lock_ref) for n in pipe.tree.nodes())
        free = pipe.host_pool.available() + self.held_pages.get(rank, 0)
        return records, stats, pipe.pinned_tokens, (free, pipe.device_pool.available()), tree

    @spec_invariant
    def rank_bytes(self) -> None:
        """Each rank's cached KV is its own producer's shard of exactly those tokens (slots whose
        H2D copy has not run yet excepted)."""
        for rank, pipe, _producer in self.local:
            nodes = pipe.tree.nodes()
            if not nodes:
                continue
            slots = torch.cat([node.value for node in nodes])
            held = pipe.device_pool.kv[0, 0, slots, 0, 0]
            tokens = [token for node in nodes for token in node.tokens()]
            expected = torch.tensor(tokens, dtype=torch.float32) + rank * RANK_MARK
            copying = copies_in_flight(pipe)
            pending = torch.tensor([int(slot) in copying for slot in slots.tolist()])
            wrong = (held != expected) & ~pending
            assert not bool(wrong.any()), (
                f"rank {rank}: the KV of token {tokens[int(wrong.nonzero()[0])]} is not its "
                "producer's shard (a span spliced that this rank never read whole)"
            )

    @spec_invariant
    def hold_release(self) -> None:
        for rank, pipe, _producer in self.local:
            held = self.held_pages.get(rank, 0)
            free = pipe.host_pool.available()
            assert free + bounce_owned(pipe) + held == pipe.host_pool.capacity, (
                f"rank {rank}: bounce leaked"
            )

    @spec_invariant
    def pin_balance(self) -> None:
        for _rank, pipe, _producer in self.local:
            pipe.tree.sanity_check()
            assert_pins_counted(pipe)

    @spec_invariant
    def exactly_once_end(self) -> None:
        for _rank, pipe, _producer in self.local:
            assert_books_close(pipe)


def configured(tp: int, agreement: type[RankAgreement] = RankAgreement) -> type[RankFuzzer]:
    """A RankFuzzer over ``tp`` ranks on threads, agreeing with ``agreement`` (its own class:
    nothing another caller sees changes)."""
    if tp < 2:
        raise ValueError(f"--tp takes 2 or more ranks, got {tp}")
    cluster = functools.partial(ThreadCluster, agreement=agreement)
    return type(f"RankFuzzer{tp}", (RankFuzzer,), {"tp": tp, "make_cluster": cluster})


BATCH_PROGRAMS = 10
STEPS_PER_PROGRAM = 40


def run_in_processes(
    tp: int,
    steps: int | None,
    budget: float | None,
    seed: int,
    l3: Path,
    agreement: type[RankAgreement] = RankAgreement,
) -> list[tuple[int, int, float, str | None]]:
    """The campaign with each rank in a process of its own over ``TorchGroup`` (gloo on
    127.0.0.1): ``(states, programs, seconds, failure)`` by rank. The processes run the same
    programs (one seed) and agree after every batch whether to stop; a rank that fails stops
    every rank (the others' next agreement times out), so the campaign always ends."""
    if tp < 2:
        raise ValueError(f"--tp takes 2 or more ranks, got {tp}")
    body = functools.partial(
        _campaign_rank, steps=steps, budget=budget, seed=seed, l3=l3, agreement=agreement
    )
    return run_ranks_over_gloo(body, tp, timeout=(budget or 600) + 120)


def _campaign_rank(
    rank: int,
    size: int,
    steps: int | None,
    budget: float | None,
    seed: int,
    l3: Path,
    agreement: type[RankAgreement],
) -> tuple[int, int, float, str | None]:
    cluster = functools.partial(ProcessCluster, agreement=agreement, l3=l3)
    machine = type(f"RankFuzzer{size}", (RankFuzzer,), {"tp": size, "make_cluster": cluster})
    group = TorchGroup()
    hypothesis_core.threadlocal._hypothesis_global_random = random.Random(seed)
    started, programs, failure = time.monotonic(), 0, None
    batch = settings(
        max_examples=BATCH_PROGRAMS,
        stateful_step_count=STEPS_PER_PROGRAM,
        derandomize=False,
        database=None,  # every process must run the same programs: nothing replayed
        deadline=None,
        phases=[Phase.generate],  # no shrinking: the ranks would shrink apart
    )
    while True:
        try:
            with reported_unless_interrupted():
                run_state_machine_as_test(machine, settings=batch)
        except Exception as error:  # the failing program has been printed by Hypothesis
            failure = f"{type(error).__name__}: {error}"
        programs += BATCH_PROGRAMS
        done = (steps is not None and TALLY.states >= steps) or (
            budget is not None and time.monotonic() - started >= budget
        )
        if failure is not None:
            break  # the other ranks' next agreement fails: they stop too
        if group.all_reduce_max([int(done)])[0]:
            break
    return TALLY.states, programs, time.monotonic() - started, failure
