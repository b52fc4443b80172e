"""A pipeline's IO stepped by hand: the fuzzers and :mod:`stagefate.testing` complete each
storage read, existence query and copy when they choose."""

from __future__ import annotations

from ..runtime import ManualIO
from ..statemachine.pipeline import BufferPipeline


def manual_io(pipe: BufferPipeline) -> ManualIO:
    """The pipeline's :class:`ManualIO` (build it with ``PipelineConfig(io="manual")``)."""
    if not isinstance(pipe.io, ManualIO):
        raise TypeError(
            f"the pipeline runs {type(pipe.io).__name__}; stepping it needs "
            f"PipelineConfig(io='manual')"
        )
    return pipe.io
