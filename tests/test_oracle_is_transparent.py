"""Verification runs the production path: the ``transitions`` oracle in lockstep changes nothing.

The same seeded program of scheduler calls and world moves runs on a pipeline with the oracle
and on one without; they must leave byte-identical trees (shape, slots, locks, LRU stamps),
records, pools and stats after every step. Guards read the tree once per firing (the firing's
Lookups), so a checked run evicts in production's order.
"""

from __future__ import annotations

import random

import pytest
import torch

from stagefate import BufferPipeline, ManualIO, MemoryStorage
from stagefate.fuzz.world import NAMESPACES, PAGE, SEQUENCES, fuzz_config, l3_contents, mark
from stagefate.runtime.prefix_tree import alloc_evicting
from stagefate.testing import manual_io, tree_snapshot

REQUESTS = ("a", "b", "c", "d")


def _build(window: int | None, check_oracle: bool) -> BufferPipeline:
    cfg = fuzz_config(window).model_copy(update={"check_oracle": check_oracle})
    storage = MemoryStorage()
    keys, pages = l3_contents(window)
    storage.batch_set(keys, pages)
    return BufferPipeline(cfg, storage=storage)


def _publish(pipe: BufferPipeline, tokens: list[int], salt: str | None) -> None:
    present = pipe.tree.match_prefix(tokens, cache_salt=salt)
    slots = alloc_evicting(
        pipe.tree, pipe.device_pool, len(tokens) - present.length, present.last_node
    )
    if slots is None:
        return
    values = mark(tokens[present.length :], salt)
    pipe.device_pool.kv[:, :, slots] = values[None, None, :, None, None]
    pipe.tree.insert(tokens, torch.cat([present.device_indices, slots]), cache_salt=salt)


def _issue(
    pipe: BufferPipeline, rng: random.Random, asked: dict[str, tuple[list[int], str | None]]
) -> None:
    """A request issues (its prompt kept while it lives), sometimes with a stale match."""
    request = rng.choice(REQUESTS)
    tokens = SEQUENCES[rng.randrange(len(SEQUENCES))][: rng.randint(1, 8) * PAGE]
    salt = rng.choice(NAMESPACES)
    if request not in pipe.live_records:  # a live request keeps its prompt
        asked[request] = (tokens, salt)
    tokens, salt = asked[request]
    matched = pipe.tree.match_prefix(tokens, cache_salt=salt).length
    if rng.random() < 0.2:
        matched = min(matched + PAGE, len(tokens))
    pipe.prefetch_from_storage(request, tokens, matched, cache_salt=salt)


def _complete(io: ManualIO, rng: random.Random) -> None:
    """A queued operation completes: whole, short or failed (a load only whole)."""
    op_id = rng.choice(io.queued())
    is_load = op_id in io.queued("load")
    mode = "full" if is_load else rng.choice(("full", "full", "short", "fail"))
    if mode == "fail":
        io.fail(op_id)
    elif mode == "short":
        io.complete_short(op_id, rng.randint(0, 6) * PAGE)
    else:
        io.complete(op_id)


def _step(
    pipe: BufferPipeline, rng: random.Random, asked: dict[str, tuple[list[int], str | None]]
) -> None:
    """One move, chosen and parameterised by ``rng`` alone (never by the pipeline's state
    beyond what both pipelines share)."""
    move = rng.choices(range(9), weights=(3, 3, 5, 4, 1, 1, 1, 1, 1))[0]
    io = manual_io(pipe)
    holds = sorted(r for r, rec in pipe.live_records.items() if rec.state in ("staged", "trimmed"))
    if move == 0:
        _issue(pipe, rng, asked)
    elif move == 1:
        pipe.poll()
    elif move == 2 and io.queued():
        _complete(io, rng)
    elif move == 3 and holds:
        request = rng.choice(holds)
        tokens, salt = asked[request]
        prefix = pipe.tree.match_prefix(tokens, cache_salt=salt)
        if pipe.plan_staged_splice(request, prefix.length)[0]:
            pipe.init_load_back(request, prefix.device_indices)
    elif move == 4:
        pipe.release_aborted_request(rng.choice(REQUESTS))
    elif move == 5:
        sequence = SEQUENCES[rng.randrange(len(SEQUENCES))]
        _publish(pipe, sequence[: rng.randint(1, 8) * PAGE], rng.choice(NAMESPACES))
    elif move == 6:
        pipe.tree.evict(rng.randint(0, 24))
    elif move == 7:
        for request in pipe.due_retries(sorted(asked)):
            tokens, salt = asked[request]
            matched = pipe.tree.match_prefix(tokens, cache_salt=salt).length
            pipe.prefetch_from_storage(request, tokens, matched, cache_salt=salt)
    elif move == 8 and holds and rng.random() < 0.3:
        pipe.release_staged_hold(rng.choice(holds))


def _state(pipe: BufferPipeline) -> tuple[object, ...]:
    records = sorted(
        (r.request_id, r.state, r.pinned_tokens, r.span_end, r.read_tokens, r.plan_prefix)
        for r in pipe.live_records.values()
    )
    return (
        tree_snapshot(pipe.tree),
        records,
        pipe.stats.model_dump(),
        pipe.host_pool.available(),
        pipe.device_pool.available(),
        pipe.pinned_tokens,
        manual_io(pipe).queued(),
    )


@pytest.mark.parametrize("window", [None, 2 * PAGE], ids=["full", "swa"])
# seed 1 draws a long program (about 11 s): the slow tier runs it
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), 2, 3])
def test_the_oracle_in_lockstep_changes_no_tree_lru_order_or_counter(
    seed: int, window: int | None
) -> None:
    checked, plain = _build(window, True), _build(window, False)
    asked_checked: dict[str, tuple[list[int], str | None]] = {}
    asked_plain: dict[str, tuple[list[int], str | None]] = {}
    rng_checked, rng_plain = random.Random(seed), random.Random(seed)
    for step in range(500):
        _step(checked, rng_checked, asked_checked)
        _step(plain, rng_plain, asked_plain)
        assert _state(checked) == _state(plain), f"seed {seed}: they part at step {step}"
    assert checked.stats.filled > 0 and checked.stats.l3_reads > 0  # the program did something
