"""SGLang's buffer mode proven end to end in SGLang's own engine (slow; docs/sglang.md,
"SGLang's engine").

Each release whose engine serves here (its install recorded so: ``stagefate targets``) starts
four engines per module, shared by its tests: buffer mode under each prefetch stop policy and
one without HiCache, the reference every output is held to. Greedy decoding of the tiny model
(random weights: its tokens depend on the KV it reads). After each test, SGLang's own idle and
leak checks and stagefate's look at its books (every per-request structure empty, the bounce
buffer whole) pass, read inside the scheduler's process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stagefate.targets.sglang.engine.client import SGLangEngine
from stagefate.targets.sglang.engine.findings import from_l3, prompt
from stagefate.targets.sglang.engine.server import SGLangServer
from stagefate.targets.sglang.engine.serving import recorded
from stagefate.targets.sglang.engine.settings import EngineSettings, PrefetchPolicy
from stagefate.targets.sglang.environments import Installed, installed
from stagefate.targets.sglang.releases import NEWEST, RELEASES

from .engine_checks import conversation, overwrite, pages_written, settled_books
from .harness import engine_target

pytestmark = pytest.mark.slow


POOL = EngineSettings(max_total_tokens=512, chunked_prefill_size=128)
"""A device pool of 512 tokens: a burst of eight 256-token requests does not fit, so the tree
evicts while reads are in flight."""


@pytest.fixture(scope="module", params=list(RELEASES))
def release(request: pytest.FixtureRequest) -> Installed:
    return engine_target(request.param)


@pytest.fixture(scope="module")
def plain(release: Installed) -> Iterator[SGLangEngine]:
    with SGLangEngine(release, _with(buffer_mode=False)) as engine:
        yield engine


@pytest.fixture(scope="module")
def buffered(release: Installed) -> Iterator[SGLangEngine]:
    with SGLangEngine(release, POOL) as engine:
        yield engine


def _with(**change: Any) -> EngineSettings:
    return EngineSettings(**(POOL.as_json() | change))


def test_the_newest_release_serves_here() -> None:
    """``make sglang`` installs 0.5.23 and records whether its engine serves: it must."""
    target = installed().get(NEWEST)
    if target is None:
        pytest.skip(f"SGLang {NEWEST} is not installed: make sglang")
    check = recorded(target)
    assert check is not None and check.serves, check


def test_a_conversation_is_answered_the_same_with_buffer_mode_on_and_off(
    plain: SGLangEngine, buffered: SGLangEngine
) -> None:
    reference = conversation(plain, seed=1, turns=3, flush=False)
    answers = conversation(buffered, seed=1, turns=3, flush=True)
    assert [a["output_ids"] for a in answers] == [a["output_ids"] for a in reference]
    assert from_l3(answers[0]) == 0
    assert all(from_l3(answer) > 0 for answer in answers[1:]), answers
    settled_books(buffered, [a["rid"] for a in answers])


def test_a_prompt_repeated_after_a_flush_is_served_from_l3(buffered: SGLangEngine) -> None:
    asked = prompt(2, 64)
    first = buffered.generate([asked], rids=["repeat-first"])[0]
    buffered.flush()
    second = buffered.generate([asked], rids=["repeat-second"])[0]
    assert second["cached"] == {
        "device": 0,
        "host": 0,
        "storage": 60,  # whole pages of 4, one token left to compute
        "storage_backend": "HiCacheFile",
    }
    assert second["output_ids"] == first["output_ids"]
    assert second["logprobs"] == first["logprobs"]
    settled_books(buffered, ["repeat-first", "repeat-second"])


def test_other_kv_in_l3_changes_the_output(buffered: SGLangEngine) -> None:
    """Control: the pages of one prompt overwritten with another's, the same prompt after a
    flush still takes its hit from L3, and answers otherwise."""
    victim = prompt(3, 64)
    honest, victim_pages = pages_written(buffered, victim, "victim")
    _, donor_pages = pages_written(buffered, prompt(4, 64), "donor")
    overwrite(victim_pages, donor_pages)
    buffered.flush()
    lied_to = buffered.generate([victim], rids=["victim-again"])[0]
    assert from_l3(lied_to) == 60
    assert lied_to["output_ids"] != honest["output_ids"]
    settled_books(buffered, ["victim", "donor", "victim-again"])


@pytest.mark.parametrize("policy", ["best_effort", "timeout"])
def test_each_prefetch_stop_policy_serves_the_same_prompt(
    release: Installed, plain: SGLangEngine, buffered: SGLangEngine, policy: PrefetchPolicy
) -> None:
    """(``wait_complete`` is the shared engine's policy, above.) A policy that lets a request
    go before its prefetch landed serves it with the rest of its history computed again, in
    other chunks than the first time, which on a CPU in bf16 with dummy weights can round a
    near tie the other way: first seen on a machine fast enough to admit before the prefetch,
    on both releases (2026-12-07). So an answer equals no HiCache's where it took as much from
    L3 as under ``wait_complete``, and is whole where it took less."""
    reference = conversation(plain, seed=5, turns=2, flush=False)
    waited = conversation(buffered, seed=5, turns=2, flush=True)
    with SGLangEngine(release, _with(prefetch_policy=policy)) as engine:
        answers = conversation(engine, seed=5, turns=2, flush=True)
        for answer, plain_answer, waited_answer in zip(answers, reference, waited, strict=True):
            if from_l3(answer) >= from_l3(waited_answer):
                assert answer["output_ids"] == plain_answer["output_ids"]
            else:
                assert len(answer["output_ids"]) == len(plain_answer["output_ids"])
        settled_books(engine, [a["rid"] for a in answers])


def test_a_burst_sharing_a_prefix_under_eviction(
    plain: SGLangEngine, buffered: SGLangEngine
) -> None:
    """Eight requests sharing a 192-token prefix, each with its own 64-token tail, all in L3,
    sent together at a device pool of 512 tokens: reads in flight while siblings publish the
    same prefix and the tree evicts to admit them."""
    shared = prompt(6, 192)
    prompts = [shared + prompt(100 + i, 64) for i in range(8)]
    rids = [f"burst-{i}" for i in range(8)]
    reference = plain.generate(prompts, rids=rids)
    buffered.generate(prompts, rids=[f"warm-{i}" for i in range(8)])
    buffered.flush()
    answers = buffered.generate(prompts, rids=rids)
    assert [a["output_ids"] for a in answers] == [a["output_ids"] for a in reference]
    assert sum(from_l3(a) for a in answers) > 0
    early = conversation(buffered, seed=1, turns=1, flush=False)[0]
    assert (early["cached"] or {}).get("device", 0) < 36, "the burst evicted nothing"
    settled_books(buffered, rids + [f"warm-{i}" for i in range(8)])


def test_an_abort_while_a_prefetch_is_in_flight(
    plain: SGLangEngine, buffered: SGLangEngine
) -> None:
    asked = prompt(7, 400)
    reference = plain.generate([asked], rids=["long"])[0]
    buffered.generate([asked], rids=["long-warm"])
    buffered.flush()
    aborted = buffered.generate(
        [asked], rids=["long-aborted"], abort_after_s={"long-aborted": 0.05}
    )
    assert aborted[0]["finish_reason"]["type"] == "abort", aborted
    settled_books(buffered, ["long-warm", "long-aborted"])
    again = buffered.generate([asked], rids=["long-again"])[0]
    assert again["output_ids"] == reference["output_ids"]
    settled_books(buffered, ["long-again"])


def test_a_conversation_through_sglangs_http_server(
    release: Installed, plain: SGLangEngine
) -> None:
    reference = conversation(plain, seed=8, turns=3, flush=False)
    with SGLangServer(release, POOL) as server:
        history = prompt(8, 40)
        for turn, expected in enumerate(reference):
            server.flush()
            answer = server.generate(history)
            assert answer["output_ids"] == expected["output_ids"]
            if turn:
                assert answer["meta_info"]["cached_tokens_details"]["storage"] > 0
            history = history + answer["output_ids"] + prompt(8 + turn + 1, 24)
        assert server.alive(), "SGLang's idle leak check (strict here) ended the server"


def test_l3_given_to_a_second_engine_serves_it_warm(release: Installed, tmp_path: Path) -> None:
    asked = prompt(9, 64)
    with SGLangEngine(release, POOL, l3=tmp_path / "l3") as first:
        written = first.generate([asked], rids=["writer"])[0]
        settled_books(first, ["writer"])
    with SGLangEngine(release, POOL, l3=tmp_path / "l3") as second:
        read = second.generate([asked], rids=["reader"])[0]
        assert from_l3(read) == 60 and read["output_ids"] == written["output_ids"]
        settled_books(second, ["reader"])
