"""``stagefate`` and ``python -m stagefate``: the command line, once its tools are there.

The runtime path an engine imports (the pipeline, its pools, storage and IO) needs torch, NumPy,
pydantic and PyYAML only; the command line, the fuzzers, the oracle and the diagrams need the
``tools`` extra as well. Without it the command says how to get it instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import sys

TOOLS = ("rich", "hypothesis", "transitions")
"""What every command needs of the ``tools`` extra (pyproject.toml); the rest of it, Graphviz's
binding, only ``stagefate diagram`` needs, and it asks for it itself (``cli.diagram``), so a GPU
image or an engine's environment without Graphviz still benches, fuzzes and replays."""


def entry() -> int:
    missing = [name for name in TOOLS if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"stagefate's command line needs {', '.join(missing)}: "
            "pip install 'stagefate[tools]' (the runtime path needs none of them)",
            file=sys.stderr,
        )
        return 2
    from .cli import main

    return main()


if __name__ == "__main__":
    sys.exit(entry())
