"""docs/sglang-findings.md's findings through SGLang's engine, by its public calls alone.

Each finding the fuzzer found in SGLang's pipeline under stagefate's stand-in scheduler is tried
here as a client of the real engine would meet it: generate, abort, a request id reused, a
flush, a tenant's ``cache_salt``, a deployment's pool sizes. A script returns what it saw and
whether that is the finding's symptom; ``tests/test_sglang_engine_findings.py`` holds the
answer to each release's status in :data:`..findings.FINDINGS` (present from ``found_in`` until
``fixed_in``). A finding the engine cannot reach is in :data:`STAND_IN_ONLY` with the reason.

The engine's storage threads run live: where a script needs an event inside a window (an abort
while a query is outstanding), it says so and tries :data:`TRIES` times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..environments import Installed
from ..findings import FINDINGS
from ..releases import RELEASES
from .client import EngineFailed, SGLangEngine
from .settings import EngineSettings

TRIES = 3
WAIT_FOR_EVER_S = 30.0
"""How long a request that should be answered in well under a second is given before it counts
as waiting for ever."""


@dataclass(frozen=True)
class Observation:
    present: bool
    """The finding's symptom was seen."""
    seen: str


@dataclass(frozen=True)
class EngineScript:
    settings: EngineSettings
    run: Callable[[SGLangEngine], Observation]


def prompt(seed: int, length: int) -> list[int]:
    """``length`` token ids drawn from ``seed`` (within the tiny model's vocabulary)."""
    return [(seed * 7919 + position * 104_729) % 997 + 3 for position in range(length)]


def from_l3(answer: dict[str, Any]) -> int:
    """The tokens SGLang's cache report says came from L3 (0: none, or no report)."""
    return int((answer.get("cached") or {}).get("storage", 0))


def _namespace(engine: SGLangEngine) -> Observation:
    """A prompt served to tenant A (``cache_salt``), the device cache flushed, the same prompt
    for tenant B: B must not read A's pages from L3."""
    tokens = prompt(21, 64)
    engine.generate([tokens], rids=["tenant-a"], salts=["tenant-a"])
    engine.flush()
    crossed = from_l3(engine.generate([tokens], rids=["tenant-b"], salts=["tenant-b"])[0])
    engine.flush()
    own = from_l3(engine.generate([tokens], rids=["tenant-a-2"], salts=["tenant-a"])[0])
    return Observation(
        crossed > 0,
        f"tenant B read {crossed} tokens of tenant A's pages from L3 (tenant A again: {own})",
    )


def _host_pool(engine: SGLangEngine) -> Observation:
    """A 400-token prompt in L3 and a bounce buffer of 260 tokens: after a flush the prompt's
    hit (396 tokens) can never be staged. The request must still be answered (by computing)."""
    tokens = prompt(22, 400)
    engine.generate([tokens], rids=["fits-on-device"])
    engine.flush()
    answer = engine.generate([tokens], rids=["larger-than-host"], timeout_s=WAIT_FOR_EVER_S)[0]
    if answer.get("timed_out"):
        return Observation(
            True, f"not answered in {WAIT_FOR_EVER_S:.0f} s (then aborted): its hit waits for ever"
        )
    return Observation(False, f"answered, {from_l3(answer)} tokens from L3")


def _retry_under_aborted_id(engine: SGLangEngine) -> Observation:
    """A 400-token prompt in L3, sent, aborted at once, and sent again under the same rid as
    soon as SGLang's tokenizer accepts the id (the first answer is back); a control under a new
    id after a flush. The retry must read what the control reads."""
    tokens = prompt(12, 400)
    engine.generate([tokens], rids=["retry-warm"])
    seen = []
    for attempt in range(TRIES):
        engine.flush()
        rid = f"retry-{attempt}"
        try:
            _, retried = engine.generate(
                [tokens, tokens], rids=[rid, rid], abort_after_s={rid: 0.0}, start_after=[None, 0]
            )
        except EngineFailed as failed:
            if not _died_of_the_reused_ids_double_free(engine, failed):
                raise
            seen.append(
                "the scheduler died: SGLang's host pool raised a double free when the aborted "
                f"attempt's bounce was released (the crash of {_ID_REUSE_CRASH}, which this "
                "release holds, met by the same reused id)"
            )
            return Observation(True, "; ".join(seen))
        engine.flush()
        control = from_l3(engine.generate([tokens], rids=[f"control-{attempt}"])[0])
        if retried.get("timed_out"):
            seen.append(f"retry never answered (control {control})")
        else:
            seen.append(f"retry {from_l3(retried)} from L3 (control {control})")
        if control and (retried.get("timed_out") or from_l3(retried) < control):
            return Observation(True, "; ".join(seen))
    return Observation(False, "; ".join(seen))


_ID_REUSE_CRASH = "id_reused_while_its_read_lands_crashes_the_pass"


def _died_of_the_reused_ids_double_free(engine: SGLangEngine, failed: EngineFailed) -> bool:
    """The engine died of SGLang's host-pool double free on a release that holds the crash of a
    reused id (0.5.19): the window that finding needs is met by chance on a loaded machine
    (seen once, 2026-12-07), and the retry then never answers."""
    held = affected(_ID_REUSE_CRASH, engine.target.version)
    return held and "Double-free detected" in str(failed)


_SMALL = EngineSettings(max_total_tokens=512, chunked_prefill_size=128)

SCRIPTS: dict[str, EngineScript] = {
    "l3_keys_ignore_the_namespace": EngineScript(EngineSettings(), _namespace),
    "hit_larger_than_the_host_pool_waits_for_ever": EngineScript(
        EngineSettings(max_total_tokens=512, chunked_prefill_size=128, host_ratio=0.5),
        _host_pool,
    ),
    "aborted_query_revokes_its_ids_next_prefetch": EngineScript(_SMALL, _retry_under_aborted_id),
}
"""The findings reproduced through the engine, each with the deployment it needs."""

STAND_IN_ONLY: dict[str, str] = {
    "sanity_check_with_a_write_in_flight": (
        "the engine calls the tree's sanity_check only for hybrid (SWA or SSM) models, under "
        "SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK (invariant_checker._check_tree_cache); the engine "
        "target serves a full-attention Llama"
    ),
    "abort_after_staging_leaves_the_loaded_span": (
        "the abort must land after the prefetch is staged and before admission; the engine "
        "stages and admits in one scheduler pass unless admission is refused, and no script "
        "here yet holds admission back (device memory held by running requests would)"
    ),
    "id_reused_while_its_read_lands_crashes_the_pass": (
        "the reused id's request must arrive while the aborted attempt's L3 read is still "
        "landing; aborts 0.05-0.4 s into a 1,500-token read on 0.5.19 found the read not yet "
        "begun or already landed (the retry then lost its hit, the id-reuse finding); the window "
        "is the IO thread's, which the engine does not expose. Met once by chance on a loaded "
        "machine (the retry script, 2026-12-07: the scheduler died of a host-pool double free), "
        "never on demand"
    ),
    "aborted_parked_hit_revokes_its_ids_next_prefetch": (
        "the aborted attempt's hit must be parked (the bounce full with another read) when the "
        "id comes back; the same root as the id-reuse finding, which the engine reproduces"
    ),
    "unusable_fetch_leaves_its_trimmed_head_unexported": (
        "the L3 objects must vanish between the existence query and the read, with a sibling "
        "publishing the first page in the same window; the engine's threads run live and expose "
        "neither window"
    ),
}


def affected(name: str, version: str) -> bool:
    """Whether release ``version`` holds finding ``name`` (from its ``found_in`` release until
    its ``fixed_in`` one)."""
    finding = FINDINGS[name]
    order = list(RELEASES)
    found = order.index(finding.found_in)
    fixed = len(order) if finding.fixed_in is None else order.index(finding.fixed_in)
    return found <= order.index(version) < fixed


def reproduce(target: Installed, name: str) -> Observation:
    """Run finding ``name``'s script on a fresh engine of ``target``."""
    script = SCRIPTS[name]
    with SGLangEngine(target, script.settings) as engine:
        return script.run(engine)
