"""SGLang's decisions written as a transition log in its own design's vocabulary.

Theory of operation
-------------------
``spec/designs/`` writes each of SGLang's buffer-mode lifecycles in the spec language: 0.5.19
with its anchor lock off (its default) and on, and the rework 0.5.20 to 0.5.23. A design log
watches a stepped SGLang pipeline (:mod:`..pipeline_driver`) and writes one line per transition
SGLang's code makes, in the words of the design its release and knobs follow
(:func:`design_path`), in ``stagefate/transition_log.py``'s format; ``stagefate validate --spec
DESIGN LOG`` then checks what SGLang did against what its design says it may do, as TLA+ trace
validation checks an implementation's log against its spec.

The log is observation, not re-computation: every line comes from a value SGLang's own call
returned, or a call SGLang's own code made, each wrapped where it is made; nothing evaluates a
guard. :mod:`.observer` watches what both API generations do alike; :mod:`.prepare` (0.5.20 on)
and :mod:`.plan` (0.5.19) what each spells its own way, each with its table of calls and lines.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ....spec import load_spec
from ....spec.load import DEFAULT_SPEC_PATH
from ....spec.schema import LifecycleSpec
from ....transition_log import TransitionLog
from ..pipeline_driver import SteppedSGLang
from .observer import DesignObserver
from .plan import PlanDesignLog
from .prepare import PrepareDesignLog

DESIGNS = DEFAULT_SPEC_PATH.parent / "designs"


def _prepares(pipeline: Any) -> bool:
    """Whether ``pipeline`` is of the ``prepare`` generation (0.5.20 on), not 0.5.19's."""
    return hasattr(pipeline, "prepare_staged_prefetch")


def design_path(pipeline: Any) -> Path:
    """The design ``pipeline``'s release follows, as its knobs set it."""
    if _prepares(pipeline):
        return DESIGNS / "sglang-0.5.23.yaml"
    if pipeline.anchor_lock_enabled:
        return DESIGNS / "sglang-0.5.19-anchor-lock.yaml"
    return DESIGNS / "sglang-0.5.19.yaml"


@functools.cache
def load_design(path: Path) -> LifecycleSpec:
    """A design, read once (a campaign checks every program's log against it)."""
    return load_spec(path)


def watch_design(driver: SteppedSGLang, log: TransitionLog) -> DesignObserver:
    """Writes ``driver``'s SGLang's transitions to ``log`` from now on, in its design's words."""
    pipeline = driver.consumer.cache.buffer_pipeline
    design = load_design(design_path(pipeline))
    watch = PrepareDesignLog if _prepares(pipeline) else PlanDesignLog
    return watch(driver, log, design)


__all__ = ["DESIGNS", "DesignObserver", "design_path", "load_design", "watch_design"]
