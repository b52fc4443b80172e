"""``fuzz --target sglang --compare release=V``: a campaign's programs replayed on another
release, in that release's own process.

The campaign records each program's driver calls (:mod:`.waste`) with its configuration and
waste; once it ends, :func:`compare_with_release` ships them all to release V's worker in one
call (:func:`~.worker.call_in`), where :func:`replayed_in_this_release` replays each on a fresh
world of V under the same configuration, with the same findings' proposed fixes applied, and
returns each twin's waste.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack

from . import require
from .environments import resolve
from .findings import proposed_fixes
from .fuzz_config import FuzzConfig
from .fuzzer import replayed
from .waste import Call, Comparison, Waste
from .worker import call_in


def compare_with_release(
    waste: Comparison,
    version: str,
    namespaces: tuple[str | None, ...],
    core: str,
    fixes: tuple[str, ...],
) -> None:
    """Replay ``waste``'s recorded programs on release ``version`` and add each pair of
    wastes to it."""
    programs = [(config, calls) for config, calls, _drawn, _end in waste.pending]
    twins = call_in(resolve(version), replayed_in_this_release, programs, namespaces, core, fixes)
    for (config, calls, drawn, end), (twin, skipped) in zip(waste.pending, twins, strict=True):
        waste.skipped_calls += skipped
        waste.add(config, calls[:end], drawn, twin)


def replayed_in_this_release(
    programs: list[tuple[FuzzConfig, list[Call]]],
    namespaces: tuple[str | None, ...],
    core: str,
    fixes: tuple[str, ...],
) -> list[tuple[Waste, int]]:
    """In release V's process: each recorded program replayed on this release, with the
    findings named in ``fixes`` patched as in the campaign."""
    logging.getLogger("sglang").setLevel(logging.CRITICAL)
    with ExitStack() as patched:
        require()
        for fix in proposed_fixes(fixes):
            patched.enter_context(fix())
        return [replayed(config, calls, namespaces, core) for config, calls in programs]
