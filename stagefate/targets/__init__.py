"""Drivers for implementations other than stagefate's own (docs/design.md, "Targets").

A *target* is another implementation stagefate can drive with its fuzzer, its invariants and its
replay. Each lives in a package of its own behind an optional install, and nothing below the
public face imports this package: only :mod:`stagefate.registry`, the CLI, the benchmarks and the
tests do (tests/test_imports.py holds it).

* ``sglang`` (SGLang 0.5.23, ``make sglang``): its ``UnifiedRadixCache`` with the Python or the
  Rust tree core as a :class:`~stagefate.runtime.prefix_tree.PrefixTree`, its buffer-mode
  pipeline as a fuzz target and a replay policy.
"""

from __future__ import annotations


class TargetUnavailable(RuntimeError):
    """A target is not installed here; the message names the command that installs it."""
