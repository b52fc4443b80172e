"""``stagefate fuzz --tp N``: N tensor-parallel ranks in lockstep under per-rank faults.

Each rank is a pipeline of its own (tree, pools, L3 keys with its rank) over one L3, and every
scheduler call goes to every rank, as SGLang's ranks each run the same scheduler. The world is
where ranks differ: one rank's shard of a page missing from L3, one rank's read short or failed,
one rank's completions late by passes, one rank's bounce pool fuller. After every step, on every
rank: the tree's own check, bounce and pin conservation, the read books; across ranks, lockstep
(the same records, counters, pins, bounce use and tree on every rank); and bytes (every cached
token's KV on a rank is that rank's producer's shard: no rank splices a span another dropped).
The ranks agree through :class:`~stagefate.statemachine.group.LocalGroup`; ``agreement`` swaps
the class the ranks agree with, for the planted bugs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from ..runtime import MemoryStorage
from ..runtime.hashing import ROOT_NAMESPACE, page_hashes, rank_suffix, storage_key
from ..statemachine.config import PipelineConfig
from ..statemachine.group import Group, LocalGroup
from ..statemachine.lockstep import RankAgreement
from ..statemachine.pipeline import BufferPipeline
from ..testing import manual_io
from .invariants import spec_invariant

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


def build_ranks(
    storage: MemoryStorage, size: int, agreement: type[RankAgreement]
) -> tuple[list[BufferPipeline], LocalGroup]:
    """One pipeline per rank, built on the ranks' threads (they agree on their config)."""
    groups = LocalGroup.create(size, timeout=10.0)

    def builder(group: Group) -> Callable[[], BufferPipeline]:
        def build() -> BufferPipeline:
            pipe = BufferPipeline(rank_config(group.rank, size), storage=storage, group=group)
            pipe._agreement = agreement(group)
            return pipe

        return build

    return groups[0].run(*(builder(group) for group in groups)), groups[0]


class RankFuzzer(RuleBasedStateMachine):
    tp = 2
    agreement: type[RankAgreement] = RankAgreement

    def __init__(self) -> None:
        super().__init__()
        self.storage = MemoryStorage()
        self.producers, _ = build_ranks(self.storage, self.tp, RankAgreement)
        self.ranks, self.group = build_ranks(self.storage, self.tp, self.agreement)
        self.issued = 0
        self.tokens_of: dict[str, list[int]] = {}
        self.held: dict[int, torch.Tensor] = {}
        """Bounce slots the fuller-pool fault holds, by rank."""

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _tokens(sequence: int, pages: int) -> list[int]:
        start = 1 + sequence * TOKENS_PER_SEQUENCE
        return list(range(start, start + pages))

    def _all(self, call: Callable[[BufferPipeline], object]) -> list[object]:
        return [call(pipe) for pipe in self.ranks]

    def _live(self, groups: str) -> list[str]:
        states = self.ranks[0].spec.group(groups)
        return sorted(r for r, rec in self.ranks[0].records.items() if rec.state in states)

    def _poll(self, late: int | None = None) -> None:
        for rank, pipe in enumerate(self.ranks):
            if rank != late:
                manual_io(pipe).complete_all()
        self.group.run(*(pipe.poll for pipe in self.ranks))

    # ------------------------------------------------------------------ the scheduler's calls

    @rule(sequence=st.integers(0, SEQUENCES - 1), pages=st.integers(1, PAGES))
    def issue(self, sequence: int, pages: int) -> None:
        tokens = self._tokens(sequence, pages)
        request_id = f"r{self.issued}"
        self.issued += 1
        self.tokens_of[request_id] = tokens
        for pipe in self.ranks:
            matched = pipe.tree.match_prefix(tokens).length
            pipe.prefetch_from_storage(request_id, tokens, matched)

    @rule()
    def poll(self) -> None:
        self._poll()

    @rule(late=st.integers(0, 3))
    def poll_with_one_rank_late(self, late: int) -> None:
        """One rank's IO completes nothing this pass (its completions arrive passes later)."""
        self._poll(late % self.tp)

    @rule()
    def reissue_due_retries(self) -> None:
        waiting = sorted(self.tokens_of)
        for request_id in self.ranks[0].due_retries(waiting):
            for pipe in self.ranks[1:]:
                assert pipe.due_retries([request_id]) == [request_id]
            tokens = self.tokens_of[request_id]
            for pipe in self.ranks:
                matched = pipe.tree.match_prefix(tokens).length
                pipe.prefetch_from_storage(request_id, tokens, matched)

    @precondition(lambda self: bool(self._live("hold")))
    @rule(which=st.integers(0, 7))
    def admit(self, which: int) -> None:
        holds = self._live("hold")
        request_id = holds[which % len(holds)]
        tokens = self.tokens_of[request_id]
        for pipe in self.ranks:
            prefix = pipe.tree.match_prefix(tokens)
            kv_tokens, _aux = pipe.plan_staged_splice(request_id, prefix.length)
            if kv_tokens:
                pipe.init_load_back(request_id, prefix.device_indices)

    @precondition(lambda self: bool(self.ranks[0].records))
    @rule(which=st.integers(0, 7))
    def abort(self, which: int) -> None:
        live = sorted(self.ranks[0].records)
        request_id = live[which % len(live)]
        self._all(lambda pipe: pipe.release_aborted_request(request_id))

    @rule(tokens=st.integers(1, 24))
    def evict(self, tokens: int) -> None:
        evicted = self._all(lambda pipe: pipe.tree.evict(tokens))
        assert len(set(evicted)) == 1, f"ranks evicted different amounts: {evicted}"

    # ------------------------------------------------------------------ the world

    @rule(sequence=st.integers(0, SEQUENCES - 1), pages=st.integers(1, PAGES))
    def publish(self, sequence: int, pages: int) -> None:
        """Each producer rank writes its shard of the prompt through to L3."""
        tokens = self._tokens(sequence, pages)
        for rank, pipe in enumerate(self.producers):
            slots = pipe.device_pool.alloc(len(tokens))
            assert slots is not None
            values = torch.tensor(tokens, dtype=torch.float32) + rank * RANK_MARK
            pipe.device_pool.kv[:, :, slots] = values.view(1, 1, -1, 1, 1)
            pipe.write_through(tokens, slots)
            pipe.device_pool.free(slots)

    @rule(
        sequence=st.integers(0, SEQUENCES - 1),
        rank=st.integers(0, 3),
        from_page=st.integers(0, PAGES - 1),
    )
    def one_rank_loses_pages(self, sequence: int, rank: int, from_page: int) -> None:
        digests = page_hashes(self._tokens(sequence, PAGES), 1, ROOT_NAMESPACE)[from_page:]
        suffix = rank_suffix(rank % self.tp, self.tp)
        self.storage.delete([storage_key(d) + suffix for d in digests])

    @rule(rank=st.integers(0, 3), which=st.integers(0, 7), short=st.integers(0, PAGES))
    def one_rank_completes_one_op(self, rank: int, which: int, short: int) -> None:
        """One rank's L3 operation (existence query or read) completes alone: fully, short, or
        failed. H2D copies are the rank's own device work and are not failed here."""
        io = manual_io(self.ranks[rank % self.tp])
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

    @rule(rank=st.integers(0, 3), pages=st.integers(1, 20))
    def one_rank_bounce_fills(self, rank: int, pages: int) -> None:
        rank %= self.tp
        if rank in self.held:
            return
        held = self.ranks[rank].host_pool.alloc(min(pages, self.ranks[rank].host_pool.available()))
        if held is not None and held.numel():
            self.held[rank] = held

    @precondition(lambda self: bool(self.held))
    @rule()
    def bounce_frees(self) -> None:
        for rank, held in self.held.items():
            self.ranks[rank].host_pool.free(held)
        self.held.clear()

    def teardown(self) -> None:
        """Every request ends and every operation lands: each rank is quiescent, in lockstep."""
        for request_id in sorted(self.ranks[0].records):
            for pipe in self.ranks:
                pipe.release_aborted_request(request_id)
        for _ in range(3):
            self._poll()
        for pipe in self.ranks:
            assert pipe.is_idle(), f"rank {pipe.config.tp_rank}: {list(pipe.records)} live"
            assert pipe.pinned_tokens == 0 and pipe.tree.protected_size == 0

    # ------------------------------------------------------------------ invariants

    @spec_invariant
    def lockstep(self) -> None:
        TALLY.states += 1
        views = [self._view(rank, pipe) for rank, pipe in enumerate(self.ranks)]
        for rank, view in enumerate(views[1:], start=1):
            assert view == views[0], f"rank {rank} differs from rank 0: {view} != {views[0]}"

    def _view(self, rank: int, pipe: BufferPipeline) -> tuple[object, ...]:
        records = {
            r: (rec.state, rec.matched_len, rec.span_end, rec.read_tokens, rec.plan_tokens)
            for r, rec in pipe.records.items()
        }
        stats = pipe.stats.model_dump()
        stats.pop("stale_completions")  # each rank's own timing
        held = 0 if rank not in self.held else self.held[rank].numel()
        tree = sorted((tuple(n.tokens()), n.lock_ref) for n in pipe.tree.nodes())
        available = (pipe.host_pool.available() + held, pipe.device_pool.available())
        return records, stats, pipe.pinned_tokens, available, tree

    @spec_invariant
    def bytes(self) -> None:
        """Each rank's cached KV is its own producer's shard of exactly those tokens (slots whose
        H2D copy has not run yet excepted)."""
        for rank, pipe in enumerate(self.ranks):
            nodes = pipe.tree.nodes()
            if not nodes:
                continue
            slots = torch.cat([node.value for node in nodes])
            held = pipe.device_pool.kv[0, 0, slots, 0, 0]
            tokens = [token for node in nodes for token in node.tokens()]
            expected = torch.tensor(tokens, dtype=torch.float32) + rank * RANK_MARK
            copying = _copies_in_flight(pipe)
            pending = torch.tensor([int(slot) in copying for slot in slots.tolist()])
            wrong = (held != expected) & ~pending
            assert not bool(wrong.any()), (
                f"rank {rank}: the KV of token {tokens[int(wrong.nonzero()[0])]} is not its "
                "producer's shard (a span spliced that this rank never read whole)"
            )

    @spec_invariant
    def hold_release(self) -> None:
        for rank, pipe in enumerate(self.ranks):
            bounce = sum(
                len(r.host_indices) for r in pipe.records.values() if r.host_indices is not None
            )
            held = 0 if rank not in self.held else self.held[rank].numel()
            assert pipe.host_pool.available() + bounce + held == pipe.host_pool.capacity, (
                f"rank {rank}: bounce leaked"
            )

    @spec_invariant
    def pin_balance(self) -> None:
        for pipe in self.ranks:
            pipe.tree.sanity_check()
            pinned = [r for r in pipe.records.values() if r.pinned_node is not None]
            assert sum(r.pinned_tokens for r in pinned) == pipe.pinned_tokens
            assert pipe.pinned_tokens <= pipe.cap

    @spec_invariant
    def exactly_once_end(self) -> None:
        for pipe in self.ranks:
            stats, (reads, tokens) = pipe.stats, pipe.reads_in_flight()
            assert stats.l3_reads == stats.filled + stats.l3_reads_wasted + reads
            assert (
                stats.l3_read_tokens == stats.spliced_tokens + stats.l3_read_tokens_wasted + tokens
            )


def _copies_in_flight(pipe: BufferPipeline) -> set[int]:
    """Device slots whose H2D copy has not run yet."""
    queued = set(manual_io(pipe).queued("load"))
    return {
        int(slot)
        for r in pipe.records.values()
        if r.state == "consumed" and r.op_id in queued and r.device_indices is not None
        for slot in r.device_indices.tolist()
    }


def configured(tp: int, agreement: type[RankAgreement] = RankAgreement) -> type[RankFuzzer]:
    """A RankFuzzer over ``tp`` ranks agreeing with ``agreement`` (its own class: nothing another
    caller sees changes)."""
    if tp < 2:
        raise ValueError(f"--tp takes 2 or more ranks, got {tp}")
    return type(f"RankFuzzer{tp}", (RankFuzzer,), {"tp": tp, "agreement": agreement})
