"""SGLang's own log lines, out of the terminal and into one file a replay names at its end.

SGLang logs what it handles as an operator would want it (an L3 miss, a host pool smaller than
the device pool, a CPU event without timing), once per pool or per request: over a replay of
several policies, releases and seeds they fill the terminal the figures are printed to. The
replay sets :data:`LOG_ENV` to a file; every process that runs SGLang (this one, the spawned
replays of ``--seeds``/``--jobs``, another release's worker) routes the ``sglang`` logger there
with :func:`route_sglang_logs`, appending.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

LOG_ENV = "STAGEFATE_SGLANG_LOG"
"""The file SGLang's log lines go to, in every process of a run (unset: SGLang's own
handling)."""

_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"


def route_sglang_logs() -> Path | None:
    """Send the ``sglang`` logger's lines (warnings and worse) to ``$STAGEFATE_SGLANG_LOG``,
    once per process; the file, or None when the variable is unset."""
    where = os.environ.get(LOG_ENV)
    if not where:
        return None
    path = Path(where).resolve()
    logger = logging.getLogger("sglang")
    for handler in list(logger.handlers):  # an earlier run's file, in this process
        ours = isinstance(handler, logging.FileHandler) and getattr(handler, "stagefate", False)
        if ours and handler.baseFilename != str(path):  # type: ignore[attr-defined]
            logger.removeHandler(handler)
            handler.close()
    if not any(getattr(handler, "stagefate", False) for handler in logger.handlers):
        handler = logging.FileHandler(path, mode="a", encoding="utf-8", delay=True)
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler.stagefate = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False  # not to the root logger's stderr
    return path


def lines_in(path: Path) -> int:
    """How many lines SGLang logged to ``path`` (0 when it wrote none)."""
    if not path.is_file():
        return 0
    with path.open(encoding="utf-8", errors="replace") as lines:
        return sum(1 for _ in lines)
