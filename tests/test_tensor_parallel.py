"""Tensor parallelism: ranks agree on every rank-local fact and are checked in lockstep each pass.

Two ranks over one L3, each its own pipeline (tree, pools, keys with its rank) stepped on a thread
of its own through :class:`LocalGroup`. After every step the test compares the ranks' whole
lifecycle state, and each rank's spliced KV with its own producer's shard.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Sequence, Set

import pytest
import torch
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from stagefate import BufferPipeline, LocalGroup, LockstepError, MemoryStorage, PipelineConfig
from stagefate.fuzz.invariants import violated_invariant
from stagefate.fuzz.rank_fuzzer import TALLY, configured, run_in_processes
from stagefate.runtime import Completion
from stagefate.runtime.hashing import ROOT_NAMESPACE, page_hashes, rank_storage_keys, storage_key
from stagefate.statemachine.group import Group
from stagefate.statemachine.lockstep import RankAgreement
from stagefate.statemachine.speeds import SpeedEstimate
from stagefate.testing import assert_quiescent, manual_io, run_ranks_over_gloo

from .harness import config, kv_marks, seq_of

TP = 2
PAGES = 5


def tp_config(rank: int, **overrides: object) -> PipelineConfig:
    return config(kv_heads=TP, tp_size=TP, tp_rank=rank, **overrides)


def build(
    storage: MemoryStorage, make_config: Callable[[int], PipelineConfig] = tp_config
) -> tuple[list[BufferPipeline], LocalGroup]:
    """One pipeline per rank; built on the ranks' threads (they agree on the config)."""
    groups = LocalGroup.create(TP, timeout=5.0)

    def builder(group: Group) -> Callable[[], BufferPipeline]:
        return lambda: BufferPipeline(make_config(group.rank), storage=storage, group=group)

    return groups[0].run(*(builder(g) for g in groups)), groups[0]


class Ranks:
    """A producer and a consumer set of ranks over one L3."""

    def __init__(self, **overrides: object) -> None:
        self.storage = MemoryStorage()
        self.producers, _ = build(self.storage, lambda r: tp_config(r, **overrides))
        self.consumers, self.group = build(self.storage, lambda r: tp_config(r, **overrides))

    def publish(self, tokens: Sequence[int]) -> None:
        """Each producer rank computes its shard of ``tokens`` (marked 10 + rank) and writes it."""
        for rank, pipe in enumerate(self.producers):
            slots = pipe.device_pool.alloc(len(tokens))
            assert slots is not None
            pipe.device_pool.kv[:, :, slots] = 10.0 + rank
            pipe.write_through(tokens, slots)
            pipe.device_pool.free(slots)

    def poll(self, rounds: int = 1) -> None:
        """Every rank's IO completes, then every rank polls (each on its own thread)."""
        for _ in range(rounds):
            for pipe in self.consumers:
                manual_io(pipe).complete_all()
            self.group.run(*(pipe.poll for pipe in self.consumers))

    def each(self, call: Callable[[BufferPipeline], object]) -> list[object]:
        return [call(pipe) for pipe in self.consumers]

    def issue(self, tokens: Sequence[int]) -> list[object]:
        return self.each(lambda pipe: pipe.prefetch_from_storage("r", tokens, 0))

    def states(self) -> list[object]:
        return self.each(lambda pipe: pipe.state("r"))

    def assert_quiescent(self) -> None:
        for pipe in self.consumers:
            assert_quiescent(pipe)

    def assert_lockstep(self) -> None:
        """The ranks' whole lifecycle state is the same: records, stats, pins, pools, tree."""
        views = [_view(pipe) for pipe in self.consumers]
        assert views[0] == views[1], f"rank 0 {views[0]} != rank 1 {views[1]}"


def _view(pipe: BufferPipeline) -> tuple[object, ...]:
    records = {
        rid: (r.state, r.matched_len, r.span_end, r.read_tokens, r.plan_tokens)
        for rid, r in pipe.live_records.items()
    }
    stats = pipe.stats.model_dump()
    stats.pop("stale_completions")  # when a late completion arrives is each rank's own
    tree = sorted((tuple(n.tokens()), n.lock_ref) for n in pipe.tree.nodes())
    return (
        records,
        stats,
        pipe.pinned_tokens,
        pipe.host_pool.available(),
        pipe.device_pool.available(),
        tree,
    )


def _delete_on_rank(
    storage: MemoryStorage, tokens: Sequence[int], rank: int, from_page: int
) -> None:
    """Drop one rank's shard of the pages of ``tokens`` from ``from_page`` on."""
    digests = page_hashes(tokens, 1, ROOT_NAMESPACE)[from_page:]
    key, _aux_key = rank_storage_keys(rank, TP)
    storage.delete([key(d) for d in digests])


def _published() -> tuple[Ranks, list[int]]:
    """Two ranks whose producers have written their shards of a five-page prompt."""
    ranks = Ranks()
    seq = seq_of(PAGES, 1)
    ranks.publish(seq)
    return ranks, seq


def _splice(ranks: Ranks) -> list[object]:
    """Every rank admits ``r`` with no device prefix: plan, splice, and the copies' acks."""

    def splice(pipe: BufferPipeline) -> int:
        kv_tokens, _aux = pipe.plan_staged_splice("r", 0)
        tail = pipe.init_load_back("r", torch.empty(0, dtype=torch.int64))
        assert tail.numel() == kv_tokens
        return kv_tokens

    spliced = ranks.each(splice)
    ranks.assert_lockstep()
    ranks.poll(2)
    ranks.assert_lockstep()
    return spliced


@pytest.mark.invariant("lockstep", "rank_bytes")
def test_each_rank_splices_its_own_shard_in_lockstep() -> None:
    ranks, seq = _published()
    assert ranks.issue(seq) == ["no_anchor"] * TP
    ranks.assert_lockstep()
    ranks.poll()  # the hit, then the commit
    assert ranks.states() == ["reading"] * TP
    ranks.assert_lockstep()
    ranks.poll()
    assert ranks.states() == ["staged"] * TP
    assert _splice(ranks) == [PAGES] * TP
    for rank, pipe in enumerate(ranks.consumers):
        assert pipe.layout.kv_heads == 1  # its shard: kv_heads / tp_size
        indices = pipe.tree.match_prefix(seq).device_indices
        assert kv_marks(pipe, indices) == [10.0 + rank] * PAGES
        assert_quiescent(pipe)


@pytest.mark.invariant("lockstep", "rank_bytes")
def test_a_page_one_rank_lacks_is_missing_for_every_rank() -> None:
    ranks, seq = _published()
    _delete_on_rank(ranks.storage, seq, rank=1, from_page=3)  # rank 1's L3 holds 3 pages
    ranks.issue(seq)
    ranks.poll(2)
    assert ranks.states() == ["staged"] * TP
    assert ranks.each(lambda p: p.live_records["r"].span_end) == [3] * TP  # the MIN of 5 and 3
    ranks.assert_lockstep()
    assert _splice(ranks) == [3] * TP
    ranks.assert_quiescent()


@pytest.mark.invariant("lockstep")
def test_a_read_late_on_one_rank_holds_every_rank() -> None:
    ranks, seq = _published()
    ranks.issue(seq)
    ranks.poll()
    assert ranks.states() == ["reading"] * TP
    early, late = ranks.consumers
    for _ in range(3):  # rank 0's read lands; rank 1's does not, for three passes
        manual_io(early).complete_all()
        ranks.group.run(early.poll, late.poll)
        assert ranks.states() == ["reading"] * TP
        ranks.assert_lockstep()
    ranks.poll()
    assert ranks.states() == ["staged"] * TP
    assert _splice(ranks) == [PAGES] * TP


@pytest.mark.invariant("lockstep")
def test_a_read_that_fails_on_one_rank_is_discarded_on_every_rank() -> None:
    ranks, seq = _published()
    ranks.issue(seq)
    ranks.poll()  # committed: the reads are queued
    _delete_on_rank(ranks.storage, seq, rank=1, from_page=0)  # gone before rank 1's read runs
    ranks.poll()
    assert ranks.each(lambda p: p.live_records.get("r")) == [None] * TP
    assert ranks.each(lambda p: p.stats.discarded) == [1] * TP
    ranks.assert_lockstep()
    ranks.assert_quiescent()


@pytest.mark.invariant("lockstep")
def test_a_fuller_host_pool_on_one_rank_parks_every_rank() -> None:
    ranks, seq = _published()
    fuller = ranks.consumers[1]
    held = fuller.host_pool.alloc(fuller.host_pool.capacity - 2)  # room for 2 of the 5 pages
    assert held is not None
    ranks.issue(seq)
    ranks.poll()
    assert ranks.states() == ["parked"] * TP
    fuller.host_pool.free(held)
    ranks.poll(2)
    assert ranks.states() == ["staged"] * TP
    ranks.assert_lockstep()
    assert _splice(ranks) == [PAGES] * TP


@pytest.mark.invariant("lockstep")
def test_ranks_that_measured_different_speeds_decide_the_commit_alike() -> None:
    """Each rank times its own loads and forwards; the IO commit reads what they agreed: no
    decision while one rank has measured nothing, then the smallest cost of each kind."""
    ranks, seq = _published()
    slow, fast = ranks.consumers
    slow.speeds.observe_load(PAGES, 1.0)  # rank 0: loads take a second, forwards a microsecond
    slow.speeds.observe_forward(PAGES, 1e-6)
    ranks.issue(seq)
    ranks.poll()  # rank 1 has measured nothing: nothing is declined anywhere
    assert ranks.states() == ["reading"] * TP
    ranks.assert_lockstep()
    ranks.each(lambda p: p.release_aborted_request("r"))
    ranks.poll()
    fast.speeds.observe_load(PAGES, 2.0)  # rank 1's loads are slower still: agreed, slow
    fast.speeds.observe_forward(PAGES, 1e-3)
    ranks.issue(seq)
    ranks.poll()
    assert ranks.each(lambda p: p.stats.declined_slower_than_compute) == [1] * TP
    ranks.assert_lockstep()
    ranks.assert_quiescent()


@pytest.mark.invariant("lockstep")
def test_a_rank_acting_on_its_own_hit_count_is_named_at_the_next_pass() -> None:
    """The planted bug: rank 1 skips the agreement on hits and acts on its local count."""
    ranks, seq = _published()
    _delete_on_rank(ranks.storage, seq, rank=0, from_page=0)  # rank 0's L3 has nothing
    rogue = ranks.consumers[1]  # rank 1's has all five pages, and it trusts them
    agreement = rogue._agreement
    assert agreement is not None
    agreed = agreement.completions

    def trusting_itself(drained, in_flight, room, estimate, overdue):  # type: ignore[no-untyped-def]
        mine = {c.op_id: c for c in drained}
        return [mine.get(c.op_id, c) for c in agreed(drained, in_flight, room, estimate, overdue)]

    agreement.completions = trusting_itself  # type: ignore[method-assign]
    ranks.issue(seq)
    ranks.poll()  # rank 0 released the agreed full miss; rank 1 holds its own 5-page hit
    with pytest.raises(LockstepError) as raised:
        ranks.poll()
    message = str(raised.value)
    assert "rank 0: r hit -> released" in message
    assert "rank 1: r hit -> no_anchor" in message


def test_a_rank_that_skips_a_pass_is_named_instead_of_hanging() -> None:
    storage = MemoryStorage()
    groups = LocalGroup.create(TP, timeout=0.3)
    pipes = groups[0].run(
        *((lambda g=g: BufferPipeline(tp_config(g.rank), storage=storage, group=g)) for g in groups)
    )
    with pytest.raises(LockstepError, match="not every rank arrived"):
        groups[0].run(pipes[0].poll, lambda: None)


def test_completions_fire_only_at_a_pass_every_rank_makes() -> None:
    ranks, seq = _published()
    ranks.issue(seq)
    with pytest.raises(RuntimeError, match=r"refused under tensor parallelism.*call poll\(\)"):
        ranks.consumers[0].fire_completions()
    assert ranks.states() == ["no_anchor"] * TP  # nothing fired on either rank
    ranks.poll(2)
    ranks.assert_lockstep()


def test_l3_keys_carry_the_rank() -> None:
    ranks, seq = _published()
    digest = page_hashes(seq, 1, ROOT_NAMESPACE)[0]
    for rank in range(TP):
        assert ranks.storage.batch_exists([storage_key(digest) + f"_{rank}_{TP}"]) == 1
    assert ranks.storage.batch_exists([storage_key(digest)]) == 0


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (dict(kv_heads=2, tp_size=2, tp_rank=2), "tp_rank=2 must lie in"),
        (dict(kv_heads=3, tp_size=2, tp_rank=0), "kv_heads=3 is not divisible by tp_size=2"),
    ],
)
def test_a_bad_rank_config_names_the_fix(overrides: dict[str, int], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        config(**overrides)


def test_a_group_that_does_not_match_the_config_is_refused_before_anything_is_built() -> None:
    with pytest.raises(ValueError, match="needs a group the ranks agree through"):
        BufferPipeline(tp_config(0))
    with pytest.raises(ValueError, match="the group has 3 ranks but tp_size=2"):
        BufferPipeline(tp_config(0), group=LocalGroup.create(3)[0])
    with pytest.raises(ValueError, match="the group's rank is 1 but tp_rank=0"):
        BufferPipeline(tp_config(0), group=LocalGroup.create(TP)[1])


def test_ranks_built_from_different_configs_are_refused() -> None:
    storage = MemoryStorage()
    with pytest.raises(ValueError, match="built with different PipelineConfigs"):
        build(storage, lambda r: tp_config(r, page_size=1, retry_interval=8 + r))


def test_one_rank_costs_nothing_it_does_not_use() -> None:
    pipe = BufferPipeline(config())
    assert pipe._agreement is None


def _rank_over_gloo(rank: int, size: int) -> list[float]:
    """One rank of a two-process run over torch.distributed: its spliced shard's marks."""
    import torch.distributed as dist

    from stagefate import FileStorage, TorchGroup

    storage = FileStorage(os.environ["STAGEFATE_TP_TEST_L3"])
    producer = BufferPipeline(tp_config(rank), storage=storage, group=TorchGroup())
    consumer = BufferPipeline(tp_config(rank), storage=storage, group=TorchGroup())
    seq = seq_of(PAGES, 1)
    slots = producer.device_pool.alloc(PAGES)
    assert slots is not None
    producer.device_pool.kv[:, :, slots] = 10.0 + rank
    producer.write_through(seq, slots)
    dist.barrier()  # both shards are in L3 before either rank asks
    consumer.prefetch_from_storage("r", seq, 0)
    for _ in range(2):
        manual_io(consumer).complete_all()
        consumer.poll()
    assert consumer.state("r") == "staged"
    consumer.plan_staged_splice("r", 0)
    consumer.init_load_back("r", torch.empty(0, dtype=torch.int64))
    for _ in range(2):
        manual_io(consumer).complete_all()
        consumer.poll()
    assert_quiescent(consumer)
    return kv_marks(consumer, consumer.tree.match_prefix(seq).device_indices)


@pytest.mark.slow
def test_two_processes_agree_over_gloo(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGEFATE_TP_TEST_L3", str(tmp_path))  # the spawned ranks inherit it
    marks = run_ranks_over_gloo(_rank_over_gloo, TP)
    assert marks == [[10.0 + rank] * PAGES for rank in range(TP)]


# ---------------------------------------------------------------------- the fuzzer, and its teeth


class _KeepsItsOwn(RankAgreement):
    """A planted bug's base: it remembers each completion as this rank saw it, then
    :meth:`misagree` changes what the ranks agreed."""

    def __init__(self, group: Group) -> None:
        super().__init__(group)
        self.mine: dict[int, Completion] = {}

    def completions(
        self,
        drained: Sequence[Completion],
        in_flight: Sequence[int],
        room: Sequence[int],
        estimate: SpeedEstimate,
        overdue: Set[int] = frozenset(),
    ) -> list[Completion]:
        self.mine.update((c.op_id, c) for c in drained)
        agreed = super().completions(drained, in_flight, room, estimate, overdue)
        return self.misagree(agreed, set(in_flight))

    def misagree(self, agreed: list[Completion], live: set[int]) -> list[Completion]:
        raise NotImplementedError


class TrustsItsOwnHits(_KeepsItsOwn):
    """Planted: every rank but 0 acts on its own L3 hit count instead of the agreed one."""

    def misagree(self, agreed: list[Completion], live: set[int]) -> list[Completion]:
        if self.lockstep.group.rank == 0:
            return agreed
        return [self.mine.pop(c.op_id, c) if c.kind == "exists" else c for c in agreed]


class MaxWhereMinIsDue(_KeepsItsOwn):
    """Planted: the ranks agree the tokens an operation brought with MAX, not MIN."""

    def misagree(self, agreed: list[Completion], live: set[int]) -> list[Completion]:
        fresh = [c for c in agreed if c.op_id in live]  # stale ones are each rank's own
        mine = [self.mine.pop(c.op_id, c) for c in fresh]
        most = self.lockstep.group.all_reduce_max([c.tokens for c in mine]) if fresh else []
        by_op = {c.op_id: tokens for c, tokens in zip(fresh, most, strict=True)}
        return [c._replace(tokens=by_op.get(c.op_id, c.tokens)) for c in agreed]


class _TrustsItsOwnFacts(RankAgreement):
    """Planted: every rank but 0 replaces a fact the ranks agreed with its own
    (:meth:`keep_own`)."""

    def completions(
        self,
        drained: Sequence[Completion],
        in_flight: Sequence[int],
        room: Sequence[int],
        estimate: SpeedEstimate,
        overdue: Set[int] = frozenset(),
    ) -> list[Completion]:
        agreed = super().completions(drained, in_flight, room, estimate, overdue)
        if self.lockstep.group.rank != 0:
            self.keep_own(estimate, overdue)
        return agreed

    def keep_own(self, estimate: SpeedEstimate, overdue: Set[int]) -> None:
        raise NotImplementedError


class TrustsItsOwnSpeeds(_TrustsItsOwnFacts):
    """Planted: every rank but 0 decides its IO commits on the speeds it measured itself."""

    def keep_own(self, estimate: SpeedEstimate, overdue: Set[int]) -> None:
        self.estimate = estimate


class TrustsItsOwnClock(_TrustsItsOwnFacts):
    """Planted: every rank but 0 gives up on the reads its own clock finds overdue."""

    def keep_own(self, estimate: SpeedEstimate, overdue: Set[int]) -> None:
        self.overdue = frozenset(overdue)


def _fuzz(tp: int, agreement: type[RankAgreement], examples: int) -> None:
    run_state_machine_as_test(
        configured(tp, agreement),
        settings=settings(
            max_examples=examples,
            stateful_step_count=40,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.generate],
        ),
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_the_rank_fuzzer_finds_nothing_in_the_clean_pipeline(tp: int) -> None:
    TALLY.states = 0
    _fuzz(tp, RankAgreement, examples=20)
    assert TALLY.states > 300


@pytest.mark.slow
@pytest.mark.parametrize(
    ("bug", "caught_by", "examples"),
    [
        # found after ~700 states (0.5 s): LockstepError at the next pass, or the invariant
        (TrustsItsOwnHits, {"lockstep"}, 300),
        # found in about 40 s (since the fuzzer also draws speeds, which decline some reads):
        # the rank short of pages splices what it never read
        (MaxWhereMinIsDue, {"rank_bytes"}, 2000),
        # found in about 7 s: a rank that measured slower loads declines what the others read
        (TrustsItsOwnSpeeds, {"lockstep"}, 300),
        # a rank whose clock ran further gives up a read the others still wait for
        (TrustsItsOwnClock, {"lockstep"}, 300),
    ],
)
def test_the_rank_fuzzer_catches_a_planted_agreement_bug(
    bug: type[RankAgreement], caught_by: set[str], examples: int
) -> None:
    with pytest.raises(Exception) as failure:
        _fuzz(2, bug, examples)
    error = failure.value
    invariant = violated_invariant(error)
    assert invariant in caught_by or isinstance(error, LockstepError), repr(error)


def test_the_tp_bench_workload_splices_every_prefetch_on_every_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stagefate.bench import tensor_parallel as bench

    monkeypatch.setattr(bench, "IDLE_PASSES", 5)
    monkeypatch.setattr(bench, "PREFETCHES", 3)
    idle, prefetch = bench._local(2)  # asserts each rank filled every prefetch
    assert idle > 0 and prefetch > 0


@pytest.mark.slow
def test_a_campaign_with_each_rank_in_its_own_process(tmp_path: pathlib.Path) -> None:
    ranks = run_in_processes(2, steps=1000, budget=None, seed=0, l3=tmp_path)
    assert [failure for *_, failure in ranks] == [None, None]
    assert ranks[0][:2] == ranks[1][:2] and ranks[0][0] >= 1000  # the same programs, both


@pytest.mark.slow
def test_the_process_campaign_catches_a_rank_trusting_its_own_hits(tmp_path: pathlib.Path) -> None:
    ranks = run_in_processes(
        2, steps=5000, budget=None, seed=0, l3=tmp_path, agreement=TrustsItsOwnHits
    )
    failures = [failure for *_, failure in ranks]
    assert all(f is not None and "lockstep" in f for f in failures), failures
