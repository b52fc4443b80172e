"""``stagefate`` and ``python -m stagefate``: the command line, once its tools are there.

The runtime path an engine imports (the pipeline, its pools, storage and IO) needs torch, NumPy,
pydantic and PyYAML only; the command line, the fuzzers, the oracle and the diagrams need the
``tools`` extra as well. Without it the command says how to get it instead of a traceback.
"""

from __future__ import annotations

import sys

from .extras import TOOLS, refused_without


def entry() -> int:
    if refused_without(TOOLS, "stagefate's command line", "the runtime path needs none of them"):
        return 2
    try:
        from .cli import main  # torch's import takes seconds: a Ctrl-C may land in it
    except KeyboardInterrupt:
        print("interrupted: stagefate stopped (Ctrl-C) before it began", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(entry())
