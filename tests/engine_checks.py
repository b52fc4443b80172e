"""What every test through SGLang's engine checks and does: its books settled whole, a
conversation, a request's L3 pages."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from stagefate.targets.sglang.engine.client import SGLangEngine
from stagefate.targets.sglang.engine.findings import prompt

_PASSES = itertools.count(10_000)


def settled_books(engine: SGLangEngine, rids: list[str]) -> dict[str, Any]:
    """The scheduler's books once it and its pipeline are idle, checked whole. Where the bounce
    is short at idle, one more request runs first: SGLang (0.5.19-0.5.21 here) can report idle
    while an aborted read's bounce waits for its next pass, which an idle scheduler does not run;
    the next request's pass frees it (docs/sglang.md, "SGLang's engine")."""
    books = engine.wait_idle(rids)
    host = books["host"]
    if host is not None and host["available"] + host["queued_for_release"] != host["size"]:
        engine.generate([prompt(next(_PASSES), 8)], rids=[f"one-more-pass-{next(_PASSES)}"])
        books = engine.wait_idle(rids)
    pipeline = books["pipeline"]
    assert books["sglang_checks"]["problems"] == []
    assert set(books["sglang_checks"]["warnings"].values()) == {0}
    assert books["per_request"] == {}, "a structure still names a finished request"
    if pipeline is not None:
        assert pipeline["held"] == {}
        host = books["host"]
        assert host["available"] + host["queued_for_release"] == host["size"], host
        lifecycle = pipeline.get("lifecycle")
        if lifecycle is not None:  # stagefate's lifecycle is the pipeline
            assert lifecycle["live"] == {} and lifecycle["pinned_tokens"] == 0, lifecycle
            assert lifecycle["bounce"]["available"] == lifecycle["bounce"]["size"], lifecycle
    return books


def conversation(engine: SGLangEngine, seed: int, turns: int, flush: bool) -> list[dict[str, Any]]:
    """A multi-turn conversation: each turn's prompt is the history, the last answer and 24 new
    tokens; ``flush`` empties the device cache before each turn, once the last turn's
    write-through reached L3 (the history then comes from L3, split where the device would have
    split it: a prompt computed in other chunks may round a near tie the other way)."""
    history = prompt(seed, 40)
    answers = []
    for turn in range(turns):
        if flush:
            engine.flush()
        answer = engine.generate([history], rids=[f"conv{seed}-{turn}"])[0]
        answers.append(answer)
        history = history + answer["output_ids"] + prompt(seed + turn + 1, 24)
    return answers


def pages_written(engine: SGLangEngine, asked: list[int], rid: str) -> tuple[Any, list[Path]]:
    """One request's answer and the L3 pages its write-through added. The books are settled
    first and only waited on after, so the extra pass :func:`settled_books` may run (its own
    pages) falls outside the count; and L3 is read once it stops changing, since SGLang
    0.5.19 can report idle while its storage backups are still being written."""
    settled_books(engine, [])
    before = settled_l3_pages(engine)
    answer = engine.generate([asked], rids=[rid])[0]
    engine.wait_idle([rid])
    return answer, sorted(settled_l3_pages(engine) - before)


def overwrite(victim_pages: list[Path], donor_pages: list[Path]) -> None:
    """Every victim page gets a donor page's KV (donors reused when fewer: each side's count
    includes whatever of its answer the write-back reached)."""
    assert victim_pages and donor_pages
    for page, donor in zip(victim_pages, itertools.cycle(donor_pages)):
        page.write_bytes(donor.read_bytes())


def settled_l3_pages(
    engine: SGLangEngine, quiet_s: float = 1.0, limit_s: float = 60.0
) -> set[Path]:
    """The L3 pages once no page has appeared for ``quiet_s`` (at most ``limit_s``)."""
    deadline = time.monotonic() + limit_s
    pages = l3_pages(engine)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        again = l3_pages(engine)
        if again == pages:
            return pages
        pages = again
    raise AssertionError(f"L3 still changing after {limit_s:.0f} s: {len(pages)} pages")


def l3_pages(engine: SGLangEngine) -> set[Path]:
    """The page files in the engine's L3 folder (SGLang's lie in it, stagefate's one folder
    down)."""
    return {path for path in engine.l3.rglob("*") if path.is_file()}
