"""Whether a release's engine serves here: one check, recorded in its environment.

:func:`check_engine` starts the release's engine with buffer mode on, serves a 64-token prompt,
flushes the device cache and serves it again; the engine serves when the second answer came from
L3 (SGLang's own cache split: 60 tokens from storage, the match cut to whole pages with one
token left to compute) with the same greedy tokens. The outcome, or the exact failure, is written
to :data:`RECORD` in the environment (``stagefate targets`` shows it; the engine's tests run on
the releases whose record says it serves). An install runs it last; ``stagefate targets engine
sglang==V`` runs it again.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from ..environments import Installed
from .client import SGLangEngine
from .settings import EngineSettings

RECORD = "stagefate-engine.json"
PROMPT = list(range(10, 74))
FROM_L3 = 60


@dataclass(frozen=True)
class EngineCheck:
    version: str
    serves: bool
    detail: str
    """What was seen: the L3 hit, or the failure and where."""


def check_command(version: str) -> str:
    return f"stagefate targets engine sglang=={version}"


def record_path(target: Installed) -> Path:
    return target.python.parent.parent / RECORD


def recorded(target: Installed) -> EngineCheck | None:
    """The last check of ``target``'s engine (None: never checked)."""
    try:
        found = json.loads(record_path(target).read_text(encoding="utf-8"))
        return EngineCheck(**found)
    except (OSError, ValueError, TypeError):
        return None


def _serve_from_l3(target: Installed) -> str:
    with SGLangEngine(target, EngineSettings()) as engine:
        first = engine.generate([PROMPT], rids=["check-first"])[0]
        engine.flush()
        second = engine.generate([PROMPT], rids=["check-second"])[0]
    storage = (second["cached"] or {}).get("storage", 0)
    if storage != FROM_L3 or second["output_ids"] != first["output_ids"]:
        raise AssertionError(
            f"the repeated prompt took {storage} tokens from L3 (expected {FROM_L3}); outputs "
            f"{'equal' if second['output_ids'] == first['output_ids'] else 'differ'}"
        )
    return f"a repeated prompt served from L3 after a flush ({storage} tokens), same output"


def check_engine(target: Installed) -> EngineCheck:
    """Start ``target``'s engine, serve from L3, record the outcome (see the module)."""
    try:
        check = EngineCheck(target.version, True, _serve_from_l3(target))
    except Exception as failure:
        lines = traceback.format_exception_only(type(failure), failure)
        check = EngineCheck(target.version, False, "".join(lines).strip())
    record_path(target).write_text(json.dumps(asdict(check)) + "\n", encoding="utf-8")
    return check
