"""SGLang as a target: its radix trees and its buffer-mode pipeline, release by release, driven
by stagefate on a CPU (docs/sglang.md). :mod:`.releases` says which release holds which design;
:mod:`.environments` installs one environment per release (``stagefate targets install
sglang==V``; ``make sglang`` puts the newest in this one); :func:`require` says what is missing.

SGLang's own code decides everything; :mod:`.shim` replaces only what cannot run on a CPU, in one
place, each replacement explained.
"""

from __future__ import annotations

from .. import TargetUnavailable
from .releases import NEWEST, RELEASES, Release, UnknownRelease, release

INSTALL = "make sglang"


def require(version: str | None = None) -> Release:
    """Import this interpreter's SGLang (with the CPU stand-ins) and return its release; raise
    :class:`TargetUnavailable` naming the fix when there is none, it is not a release stagefate
    drives, or it is not ``version``."""
    from .environments import here_version, install_command

    found = here_version()
    if found is None:
        raise TargetUnavailable(
            f"SGLang is not installed here; run `{INSTALL}` (SGLang {NEWEST}, CPU install into "
            f".venv) or `{install_command(version or NEWEST)}`"
        )
    try:
        held = release(found)
    except UnknownRelease as unknown:
        raise TargetUnavailable(
            f"SGLang {found} is installed, but stagefate drives {', '.join(RELEASES)}: {unknown}; "
            f"run `{INSTALL}`"
        ) from None
    if version is not None and found != version:
        raise TargetUnavailable(
            f"this interpreter holds SGLang {found}, not {version} (one sglang per interpreter); "
            f"run it through its own environment (`{install_command(version)}`)"
        )
    from . import shim

    shim.install()
    return held
