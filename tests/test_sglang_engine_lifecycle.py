"""stagefate's lifecycle as SGLang's buffer-mode pipeline, in SGLang's own engine (slow;
docs/sglang.md, "stagefate in SGLang's engine").

Each release of the ``prepare`` API whose engine serves here starts three engines per module on
the same device pool: no HiCache (the reference every output is held to), SGLang's own buffer
mode, and buffer mode with stagefate's lifecycle (``STAGEFATE_SGLANG``). The same requests go
to each; greedy decoding of the tiny model with random weights, so an output tells right KV
from wrong. After each test the engine's books are settled whole (:func:`.engine_checks.
settled_books`: SGLang's idle and leak checks, no structure naming a finished request, and for
stagefate no live record, no pin, the bounce whole).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stagefate.spec import load_spec
from stagefate.targets.sglang.engine.client import SGLangEngine
from stagefate.targets.sglang.engine.findings import SCRIPTS, from_l3, prompt
from stagefate.targets.sglang.engine.server import free_port
from stagefate.targets.sglang.engine.settings import EngineSettings
from stagefate.targets.sglang.environments import Installed
from stagefate.targets.sglang.releases import RELEASES
from stagefate.transition_log import validate_log

from .engine_checks import conversation, overwrite, pages_written, settled_books
from .harness import engine_target

pytestmark = pytest.mark.slow

POOL = EngineSettings(max_total_tokens=512, chunked_prefill_size=128)
"""A device pool of 512 tokens: a burst of eight 256-token requests evicts."""


def _with(**change: Any) -> EngineSettings:
    return EngineSettings(**(POOL.as_json() | change))


OURS = _with(lifecycle="stagefate")


@pytest.fixture(
    scope="module",
    params=[version for version, held in RELEASES.items() if held.generation == "prepare"],
)
def release(request: pytest.FixtureRequest) -> Installed:
    return engine_target(request.param)


@pytest.fixture(scope="module")
def plain(release: Installed) -> Iterator[SGLangEngine]:
    with SGLangEngine(release, _with(buffer_mode=False)) as engine:
        yield engine


@pytest.fixture(scope="module")
def theirs(release: Installed) -> Iterator[SGLangEngine]:
    with SGLangEngine(release, POOL) as engine:
        yield engine


@pytest.fixture(scope="module")
def ours(release: Installed) -> Iterator[SGLangEngine]:
    with SGLangEngine(release, OURS) as engine:
        yield engine


def test_a_conversation_is_answered_alike_with_either_pipeline(
    plain: SGLangEngine, theirs: SGLangEngine, ours: SGLangEngine
) -> None:
    """Each turn after a flush: the history comes from L3, through SGLang's pipeline and
    through stagefate's, the same tokens from each and the same answers as without HiCache."""
    reference = conversation(plain, seed=1, turns=3, flush=False)
    sglangs = conversation(theirs, seed=1, turns=3, flush=True)
    stagefates = conversation(ours, seed=1, turns=3, flush=True)
    expected = [answer["output_ids"] for answer in reference]
    assert [answer["output_ids"] for answer in sglangs] == expected
    assert [answer["output_ids"] for answer in stagefates] == expected
    assert [from_l3(a) for a in stagefates] == [from_l3(a) for a in sglangs]
    assert all(from_l3(answer) > 0 for answer in stagefates[1:]), stagefates
    settled_books(theirs, [a["rid"] for a in sglangs])
    settled_books(ours, [a["rid"] for a in stagefates])


def test_a_prompt_repeated_after_a_flush_is_served_from_stagefates_l3(
    ours: SGLangEngine,
) -> None:
    asked = prompt(2, 64)
    first = ours.generate([asked], rids=["repeat-first"])[0]
    ours.flush()
    second = ours.generate([asked], rids=["repeat-second"])[0]
    assert from_l3(second) == 60  # whole pages of 4, one token left to compute
    assert second["cached"]["device"] == 0
    assert second["output_ids"] == first["output_ids"]
    assert second["logprobs"] == first["logprobs"]
    books = settled_books(ours, ["repeat-first", "repeat-second"])
    stats = books["pipeline"]["lifecycle"]["stats"]
    assert stats["spliced_tokens"] >= 60 and stats["l3_read_tokens_wasted"] == 0, stats


def test_other_kv_in_stagefates_l3_changes_the_output(ours: SGLangEngine) -> None:
    """Control: stagefate's pages of one prompt overwritten with another's (whole, valid
    pages: their checksums hold), the prompt after a flush still reads them, and answers
    otherwise. So the KV really comes from stagefate's L3."""
    victim = prompt(3, 64)
    honest, victim_pages = pages_written(ours, victim, "victim")
    _, donor_pages = pages_written(ours, prompt(4, 64), "donor")
    overwrite(victim_pages, donor_pages)
    ours.flush()
    lied_to = ours.generate([victim], rids=["victim-again"])[0]
    assert from_l3(lied_to) == 60
    assert lied_to["output_ids"] != honest["output_ids"]
    settled_books(ours, ["victim", "donor", "victim-again"])


def test_a_burst_sharing_a_prefix_under_eviction(
    plain: SGLangEngine, theirs: SGLangEngine, ours: SGLangEngine
) -> None:
    """Eight requests sharing a 192-token prefix, each with a 64-token tail of its own, all in
    L3, sent together at a device pool of 512 tokens: reads in flight while siblings publish
    the same prefix and the tree evicts to admit them. Both pipelines answer as no HiCache."""
    shared = prompt(6, 192)
    prompts = [shared + prompt(100 + i, 64) for i in range(8)]
    rids = [f"burst-{i}" for i in range(8)]
    warm = [f"warm-{i}" for i in range(8)]
    expected = [a["output_ids"] for a in plain.generate(prompts, rids=rids)]
    for engine in (theirs, ours):
        engine.generate(prompts, rids=warm)
        engine.flush()
        answers = engine.generate(prompts, rids=rids)
        assert [a["output_ids"] for a in answers] == expected
        assert sum(from_l3(a) for a in answers) > 0
        settled_books(engine, rids + warm)


def test_an_abort_while_a_read_is_in_flight(plain: SGLangEngine, ours: SGLangEngine) -> None:
    asked = prompt(7, 400)
    reference = plain.generate([asked], rids=["long"])[0]
    ours.generate([asked], rids=["long-warm"])
    ours.flush()
    aborted = ours.generate([asked], rids=["long-aborted"], abort_after_s={"long-aborted": 0.05})
    assert aborted[0]["finish_reason"]["type"] == "abort", aborted
    settled_books(ours, ["long-warm", "long-aborted"])
    again = ours.generate([asked], rids=["long-again"])[0]
    assert again["output_ids"] == reference["output_ids"]  # from L3, or spliced before the abort
    settled_books(ours, ["long-again"])


def test_the_engines_transition_log_and_metrics(release: Installed, tmp_path: Path) -> None:
    """The log stagefate's lifecycle wrote inside the engine's scheduler: every line a
    transition of the spec, closed when the engine shut down; and its Prometheus metrics,
    served from the scheduler's process, count what the log shows."""
    log = tmp_path / "transitions.jsonl"
    port = free_port()
    with SGLangEngine(
        release, _with(lifecycle="stagefate", metrics_port=port), transitions=log
    ) as engine:
        conversation(engine, seed=11, turns=3, flush=True)
        asked = prompt(12, 400)
        engine.generate([asked], rids=["warm"])
        engine.flush()
        engine.generate([asked], rids=["aborted"], abort_after_s={"aborted": 0.05})
        books = settled_books(engine, ["warm", "aborted"])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            exposition = answer.read().decode()
    summary = validate_log(log.read_text(encoding="utf-8").splitlines(), load_spec())
    assert summary.violation is None, summary.violation
    assert summary.closed and not summary.live, summary
    assert summary.ended["filled"] >= 2, summary.ended
    reads = books["pipeline"]["lifecycle"]["stats"]["l3_reads"]
    assert f'stagefate:l3_reads_total{{engine="sglang"}} {float(reads)}' in exposition


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_sglangs_findings_do_not_occur_with_stagefates_lifecycle(
    release: Installed, name: str
) -> None:
    """Each finding the engine reproduces, its script run with stagefate's lifecycle as the
    pipeline: what it observes must not happen, whether or not this release's own pipeline
    still holds the finding (docs/sglang-findings.md)."""
    script = SCRIPTS[name]
    settings = EngineSettings(**(script.settings.as_json() | {"lifecycle": "stagefate"}))
    with SGLangEngine(release, settings) as engine:
        seen = script.run(engine)
        settled_books(engine, [])
    assert not seen.present, seen.seen
