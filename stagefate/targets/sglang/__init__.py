"""SGLang 0.5.23 as a target: its radix trees (and, later, its buffer-mode pipeline) driven by
stagefate on a CPU. ``make sglang`` installs it; :func:`require` says so when it is missing.

SGLang's own code decides everything; :mod:`.shim` replaces only what cannot run on a CPU, in one
place, each replacement explained.
"""

from __future__ import annotations

from .. import TargetUnavailable

VERSION = "0.5.23"
INSTALL = "make sglang"


def require() -> None:
    """Import SGLang (with the CPU stand-ins) or raise :class:`TargetUnavailable` naming the fix."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        found = version("sglang")
    except PackageNotFoundError:
        raise TargetUnavailable(
            f"SGLang {VERSION} is not installed here; run `{INSTALL}` (CPU install into .venv)"
        ) from None
    if found != VERSION:
        raise TargetUnavailable(
            f"SGLang {found} is installed, but the target drives {VERSION} (private names move "
            f"between releases); run `{INSTALL}`"
        )
    from . import shim

    shim.install()
