"""Drivers for implementations other than stagefate's own (DESIGN §10).

A *target* is another implementation stagefate can drive with its fuzzer, its invariants and its
replay. Each lives in a package of its own behind an optional install, and nothing below the
public face imports this package: only the CLI and the tests do.

* ``sglang`` (SGLang 0.5.23, ``make sglang``): its ``UnifiedRadixCache`` with the Python or the
  Rust tree core as a :class:`~stagefate.runtime.prefix_tree.PrefixTree`.
"""

from __future__ import annotations

from ..runtime import RadixTree
from ..runtime.prefix_tree import TreeFactory

TREES = ("stagefate", "sglang-python", "sglang-rust")
"""Tree names ``--tree`` accepts: stagefate's own, or SGLang's with either tree core."""


class TargetUnavailable(RuntimeError):
    """A target is not installed here; the message names the command that installs it."""


def tree_factory(name: str) -> TreeFactory:
    """The tree ``name`` as a factory the pipeline, the replay and the fuzzer take."""
    if name == "stagefate":
        return RadixTree
    if name in ("sglang-python", "sglang-rust"):
        from .sglang.tree import sglang_tree_factory

        return sglang_tree_factory(name.removeprefix("sglang-"))
    raise ValueError(f"unknown tree {name!r}; choose one of {', '.join(TREES)}")
