"""``stagefate trace synth``: multi-turn traces in the Mooncake format, and the turn rule on them
(docs/replay.md, "Causal turns"). The committed trace ``tests/data/multiturn_40.jsonl`` is
``stagefate trace synth --out tests/data/multiturn_40.jsonl`` with :data:`COMMITTED_FLAGS` (a
light trace of short prompts, kept as it was written when the defaults were these)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.registry import make_replay
from stagefate.sim.conversations import infer_turns
from stagefate.sim.synth import SynthOptions, SynthRequest, as_read, synthesize, write_jsonl
from stagefate.sim.trace import BLOCK_TOKENS, TraceRequest, load_trace

from .test_replay import SMALL

COMMITTED = Path(__file__).parent / "data" / "multiturn_40.jsonl"
COMMITTED_OPTIONS = SynthOptions(
    conversations=40,
    seed=0,
    start_rate=0.5,
    first_message_tokens=1_500,
    message_tokens=300,
    answer_tokens=400,
    mean_think_s=60.0,
    context_tokens=32_768,
)
COMMITTED_FLAGS = [
    f"--{name.replace('_', '-')}={value}"
    for name, value in COMMITTED_OPTIONS.model_dump().items()
    if value != SynthOptions.model_fields[name].default
]


def _truth(requests: list[SynthRequest]) -> dict[int, int]:
    """Each follow-up's index → its conversation's turn before (what the file cannot say)."""
    where = {(r.conversation, r.turn): index for index, r in enumerate(requests)}
    return {i: where[(r.conversation, r.turn - 1)] for i, r in enumerate(requests) if r.turn}


def _kept_blocks(request: SynthRequest | TraceRequest) -> int:
    return len(request.hash_ids) - (request.input_length % BLOCK_TOKENS != 0)


def test_the_committed_trace_is_what_its_seed_writes_and_reads_back_as_written() -> None:
    requests = synthesize(COMMITTED_OPTIONS)
    assert COMMITTED.read_text(encoding="utf-8") == write_jsonl(requests)
    loaded = load_trace(COMMITTED)
    assert [(r.input_length, r.output_length, r.hash_ids) for r in loaded] == [
        (r.input_length, r.output_length, r.hash_ids) for r in requests
    ]
    assert synthesize(COMMITTED_OPTIONS.model_copy(update={"seed": 1})) != requests


def test_each_turn_keeps_the_turn_befores_blocks_less_a_partial_last_one_and_re_hashes_it() -> None:
    requests = synthesize(COMMITTED_OPTIONS.model_copy(update={"conversations": 60, "seed": 3}))
    truth = _truth(requests)
    assert len(truth) > 30
    system_ids = {r.hash_ids[0] for r in requests}
    assert len(system_ids) == 1  # one system prompt, the same block id in every conversation
    for turn, before in truth.items():
        later, earlier = requests[turn], requests[before]
        kept = _kept_blocks(earlier)
        assert later.hash_ids[:kept] == earlier.hash_ids[:kept]
        assert later.input_length > earlier.input_length
        assert later.timestamp_ms > earlier.timestamp_ms
        if kept < len(earlier.hash_ids):  # the partial block grew: its id changed
            assert later.hash_ids[kept] != earlier.hash_ids[kept]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_turn_rule_finds_every_turn_the_hash_ids_can_tell(seed: int) -> None:
    """What the rule gets wrong is what the hash ids cannot say: a turn whose turn before kept
    only the shared system block (a first message under a block long) is missed, or, when that
    short prompt was the only one keeping the system block then, a new conversation is taken for
    its turn."""
    requests = synthesize(SynthOptions(conversations=150, seed=seed))
    assert len(requests) > 300
    truth = _truth(requests)
    found = infer_turns(as_read(requests)).predecessor
    for turn, before in found.items():
        if truth.get(turn) != before:
            assert requests[turn].turn == 0 and _kept_blocks(requests[before]) == 1
    missed = [turn for turn in truth if turn not in found]
    assert all(_kept_blocks(requests[truth[turn]]) <= 1 for turn in missed)
    assert len(found) >= 0.9 * len(truth)


def test_trace_synth_from_the_command_line_and_the_replay_finds_its_turns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "chat.jsonl"
    assert main(["trace", "synth", *COMMITTED_FLAGS, "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == COMMITTED.read_text(encoding="utf-8")
    printed = " ".join(capsys.readouterr().out.split())
    assert "105 requests of 40 conversations, 65 of them follow-ups; the turn rule finds 61" in (
        printed
    )
    assert main(["trace", "synth", "--conversations", "0", "--out", str(out)]) == 2
    assert "conversations" in capsys.readouterr().err
    options = SMALL.model_copy(update={"arrivals": "causal", "speed": 4.0})
    metrics = make_replay("live", load_trace(COMMITTED), options).run()
    assert metrics.arrivals.turns == 61 == metrics.arrivals.turns_less_partial_block
