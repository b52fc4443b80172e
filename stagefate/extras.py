"""The ``tools`` extra (pyproject.toml): what of it each command needs, and the refusal that
names what is missing and how to get it. Standard library only: the command line checks before
it imports any of the tools."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

TOOLS = ("rich", "hypothesis", "transitions")
"""What every command needs of the extra."""
DRAWING_TOOLS = ("pygraphviz",)
"""The rest of it, Graphviz's binding: only ``stagefate diagram`` needs it and asks for it
itself, so a GPU image or an engine's environment without Graphviz still benches, fuzzes and
replays."""


def refused_without(tools: Sequence[str], who: str, why: str) -> bool:
    """True, having told stderr ``who`` needs the missing ``tools`` and how to install them,
    when any of ``tools`` is not importable."""
    missing = [name for name in tools if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"{who} needs {', '.join(missing)}: pip install 'stagefate[tools]' ({why})",
            file=sys.stderr,
        )
    return bool(missing)
