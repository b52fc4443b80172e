"""Which guard and effect names have implementations (read by ``stagefate check``)."""

from __future__ import annotations


def implemented_names() -> tuple[frozenset[str], frozenset[str]]:
    from .pipeline import BufferPipeline

    return frozenset(BufferPipeline.GUARDS), frozenset(BufferPipeline.EFFECTS)
