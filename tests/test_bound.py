"""The trace's hit-rate bound: a hand count, a brute force over synthesized tokens, never below a
policy's hit rate, and in the replay's table, story and JSON."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

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
        _request(1, [1, 2, 3], 1536),  # its first 15 pages are request 0's key: 960 tokens
        _request(2, [1, 9], 600),  # block 1's 8 pages: 512 (block 9 is new)
        _request(3, [1, 2, 3], 1536),  # request 1's key, all 23 pages: 1,472
        _request(4, [2], 512),  # block 2 at the start is another prefix: 0
    ]
    bound = hit_rate_bound(trace, 64)
    assert bound.reusable_tokens == 960 + 512 + 1472
    assert bound.prompt_tokens == 1024 + 1536 + 600 + 1536 + 512
    assert bound.hit_rate == round(2944 / 5208, 6)


def _brute_force(trace: list[TraceRequest], page: int) -> int:
    """The same count over real tokens: a page is reusable when the key up to its end is the
    prefix of an earlier request's key (whole pages)."""
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
        seen.update(prefixes)
    return reusable


@pytest.mark.parametrize("page", [64, 96, 100, 512])
def test_the_bound_equals_a_brute_force_over_the_synthesized_tokens(page: int) -> None:
    chooser = random.Random(page)
    trace = []
    for index in range(40):
        blocks = [chooser.choice([1, 2, 3]) for _ in range(chooser.randint(1, 4))]
        length = 512 * (len(blocks) - 1) + chooser.randint(1, 512)
        trace.append(_request(index, blocks, length))
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
    assert list(payload) == ["live", "bounds"]
    bound = payload["bounds"]
    assert list(bound) == ["hit_rate", "reusable_tokens", "prompt_tokens"]
    assert bound["hit_rate"] >= payload["live"]["hit_rate"]
    assert f"{bound['reusable_tokens']:,} of {bound['prompt_tokens']:,} prompt tokens" in printed
    assert "every policy reaches the bound at 0.3x: this load leaves nothing to decide" in printed
    assert "--sweep 0.3,0.6,1.2" in printed
