"""The trace's hit-rate bound: a hand count, a brute force over synthesized tokens, never below a
policy's hit rate, and in the replay's table, story and JSON."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagefate.cli import main
from stagefate.registry import make_replay
from stagefate.runtime import TokenKey
from stagefate.sim.bound import hit_rate_bound
from stagefate.sim.trace import TraceRequest

from .test_replay import SMALL, siblings_trace


def _request(index: int, blocks: list[int], input_length: int) -> TraceRequest:
    return TraceRequest(index, float(index), input_length, 4, tuple(blocks))


def test_the_bound_is_a_hand_count_of_pages_an_earlier_request_wrote() -> None:
    trace = [
        _request(0, [1, 2], 1024),  # key: 1,023 tokens, 15 whole pages of 64; nothing before it
        # its first 16 pages are request 0's prompt (the 16th, past request 0's key, is cached
        # once request 0 ran): 1,024 tokens
        _request(1, [1, 2, 3], 1536),
        _request(2, [1, 9], 600),  # block 1's 8 pages: 512 (block 9 is new)
        _request(3, [1, 2, 3], 1536),  # request 1's prompt holds all 23 pages of its key: 1,472
        _request(4, [2], 512),  # block 2 at the start is another prefix: 0
    ]
    bound = hit_rate_bound(trace, 64)
    assert bound.reusable_tokens == 1024 + 512 + 1472
    assert bound.prompt_tokens == 1024 + 1536 + 600 + 1536 + 512
    assert bound.hit_rate == round(3008 / 5208, 6)


def _brute_force(trace: list[TraceRequest], page: int) -> int:
    """The same count over real tokens: a page of the key is reusable when the key up to its
    end is a prefix of an earlier request's prompt (whole pages)."""
    seen: set[tuple[int, ...]] = set()
    reusable = 0
    for request in trace:
        key = TokenKey.of(request.tokens()[: request.input_length - 1]).whole_pages(page)
        tokens = tuple(key.tolist())
        prefixes = [tokens[:end] for end in range(page, len(tokens) + 1, page)]
        leading = 0
        while leading < len(prefixes) and prefixes[leading] in seen:
            leading += 1
        reusable += leading * page
        prompt = tuple(TokenKey.of(request.tokens()).whole_pages(page).tolist())
        seen.update(prompt[:end] for end in range(page, len(prompt) + 1, page))
    return reusable


@pytest.mark.parametrize("page", [64, 96, 100, 512])
def test_the_bound_equals_a_brute_force_over_the_synthesized_tokens(page: int) -> None:
    chooser = random.Random(page)
    trace = []
    for index in range(40):
        blocks = [chooser.choice([1, 2, 3]) for _ in range(chooser.randint(1, 4))]
        last = chooser.choice([chooser.randint(1, 512), page % 512 or 512, 512])  # whole pages too
        trace.append(_request(index, blocks, 512 * (len(blocks) - 1) + last))
    assert hit_rate_bound(trace, page).reusable_tokens == _brute_force(trace, page) > 0


def test_no_policy_passes_the_bound(tmp_path_factory: pytest.TempPathFactory) -> None:
    siblings = siblings_trace(tmp_path_factory)
    bound = hit_rate_bound(siblings, SMALL.page_size)
    for policy in ("live", "blind"):
        metrics = make_replay(policy, siblings, SMALL).run()
        assert metrics.engine.retractions == 0  # a retracted re-run may reuse its own pages
        assert 0 < metrics.hit_rate <= bound.hit_rate


def test_the_replay_shows_the_bound_and_says_when_nothing_is_left_to_decide(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "replay.json"
    assert main(["replay", "--limit", "40", "--policy", "live", "--json", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    payload = json.loads(out.read_text())
    assert list(payload["policies"]) == ["live"]
    bound = payload["bound"]
    assert list(bound) == ["hit_rate", "reusable_tokens", "prompt_tokens", "store_tokens"]
    assert bound["hit_rate"] >= payload["policies"]["live"]["hit_rate"]
    assert f"{bound['reusable_tokens']:,} of {bound['prompt_tokens']:,} prompt tokens" in printed
    assert "every policy reaches the bound at 0.3x: this load leaves nothing to decide" in printed
    assert "--sweep 0.3,0.6,1.2" in printed


def test_a_turn_extending_a_prompt_of_whole_pages_reuses_its_last_page_within_the_bound() -> None:
    """A prompt of 71 whole pages leaves its 71st page (past its own key) in the cache once it
    ran; the next turn extends it and reuses all 71. The bound once counted 70, and every
    policy passed it by that page."""
    first = _request(0, list(range(1, 10)), 71 * 64)
    follow_up = TraceRequest(1, 60_000.0, 71 * 64 + 600, 4, tuple(range(1, 12)))
    bound = hit_rate_bound([first, follow_up], 64)
    assert bound.reusable_tokens == 71 * 64
    for policy in ("live", "blind"):
        metrics = make_replay(policy, [first, follow_up], SMALL).run()
        assert metrics.engine.retractions == 0
        assert metrics.prefill_tokens_computed == first.input_length + 600
        assert metrics.hit_rate == bound.hit_rate


BLOCKS = st.lists(st.integers(1, 6), min_size=1, max_size=3)


@st.composite
def traces(draw: st.DrawFn) -> list[TraceRequest]:
    """A few requests: fresh prompts, turns extending an earlier prompt whole, and prompts that
    share an earlier one's head; lengths whole pages, whole blocks, or anything."""
    requests: list[TraceRequest] = []
    for index in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["fresh", "turn", "shared"])) if requests else "fresh"
        if kind == "fresh":
            blocks = draw(BLOCKS)
        else:
            earlier = draw(st.sampled_from(requests))
            whole = -(-earlier.input_length // 512)
            kept = whole if kind == "turn" else draw(st.integers(1, whole))
            blocks = [*earlier.hash_ids[:kept], *draw(BLOCKS)]
        last = draw(st.sampled_from([512, 448, 64, 1]) | st.integers(1, 512))
        length = 512 * (len(blocks) - 1) + last
        gap = draw(st.sampled_from([1.0, 5_000.0, 60_000.0]))
        at = requests[-1].timestamp_ms + gap if requests else 0.0
        requests.append(TraceRequest(index, at, length, 4, tuple(blocks)))
    return requests


@settings(max_examples=25, deadline=None)
@given(trace=traces())
def test_no_policy_passes_the_bound_on_generated_traces(trace: list[TraceRequest]) -> None:
    bound = hit_rate_bound(trace, SMALL.page_size)
    for policy in ("live", "blind"):
        metrics = make_replay(policy, trace, SMALL).run()
        if metrics.engine.retractions == 0:  # a retracted re-run may reuse its own pages
            assert metrics.hit_rate <= bound.hit_rate, (policy, bound)


def test_a_replay_opens_with_each_policy_against_the_bound_and_how_they_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first lines after the runs: the run, the bound, one line a policy, how each other
    policy differs from the first; the tables come after them."""
    out = tmp_path / "replay.json"
    argv = ["replay", "--limit", "60", "--policy", "live,blind", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    payload = json.loads(out.read_text())
    live, blind = payload["policies"]["live"], payload["policies"]["blind"]
    start = printed.index("in short: 60 requests of the embedded Mooncake slice at 0.3x")
    assert start < printed.index("stagefate replay")  # before the table's title
    lines = printed[start:].splitlines()
    assert f"the trace's bound is a hit rate of {payload['bound']['hit_rate']:.3f}" in lines[0]
    for line, name, run in ((lines[1], "live", live), (lines[2], "blind", blind)):
        assert line.startswith(f"  {name}: hit rate {run['hit_rate']:.3f}, ")
        assert f"({run['l3_reads_wasted']:,} wasted)" in line
        assert f"{run['prefill_tokens_computed']:,} prompt tokens computed" in line
    more = blind["l3_reads_wasted"] - live["l3_reads_wasted"]
    computed = blind["prefill_tokens_computed"] - live["prefill_tokens_computed"]
    if more or computed:
        assert lines[3].startswith("  blind computes") and lines[3].endswith("than live")
    else:
        assert lines[3] == "  blind computes and wastes what live does"
    assert lines[4] == "the figures, and why each policy read what it read, follow"


def test_in_short_says_how_each_policy_differs_from_the_first(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from stagefate.sim.stories import in_short

    siblings = siblings_trace(tmp_path_factory)
    live = make_replay("live", siblings, SMALL).run()
    worse = live.model_copy(
        update={
            "l3_reads_wasted": live.l3_reads_wasted + 1,
            "prefill_tokens_computed": live.prefill_tokens_computed + 1_024,
        }
    )
    better = live.model_copy(update={"l3_reads_wasted": live.l3_reads_wasted + 2})
    bound = hit_rate_bound(siblings, SMALL.page_size)
    lines = in_short(
        {"live": live, "sglang": worse, "blind": better, "twin": live},
        bound,
        "a test",
        {"sglang": "0.5.23"},
    )
    assert lines[0] == f"in short: a test; the trace's bound is a hit rate of {bound.hit_rate:.3f}"
    assert lines[2].startswith("  sglang (SGLang 0.5.23): hit rate ")
    assert lines[5:8] == [
        "  sglang computes 1,024 more prompt tokens and wastes 1 more L3 read than live",
        "  blind computes as many prompt tokens and wastes 2 more L3 reads than live",
        "  twin computes and wastes what live does",
    ]
