"""The stateful fuzzer over the real pipeline, at the active Hypothesis profile (``ci``: fast)."""

from __future__ import annotations

from stagefate.fuzz.machine import PipelineFuzzer

TestPipelineFuzz = PipelineFuzzer.TestCase
