"""Which SGLang release holds which buffer-mode design, and the names that pick one.

Facts read from the wheels on PyPI (docs/sglang.md, "Releases"); nothing here is SGLang's code.
Buffer mode first ships in 0.5.19, which holds PR #36834 as merged; 0.5.20 reworks its API, and
0.5.21 to 0.5.23 keep that rework. A driver is written per *API generation*, not per release:

* ``plan`` (0.5.19): ``try_lock_anchor`` at issue (opt-in: ``SGLANG_ENABLE_HICACHE_BUFFER_
  ANCHOR_LOCK``), ``plan_staged_splice`` and ``init_load_back`` at admission, retries through the
  scheduler's missed-rid set (PR #36227);
* ``prepare`` (0.5.20 and later): the pin at the IO commit, ``cap_busy``,
  ``prepare_staged_prefetch``, ``StoragePrefetchRetries`` and ``CacheRequestHandle``.

A target name is ``sglang`` (the newest release installed) or ``sglang==V``; tree names take a
release the same way (``sglang-rust==0.5.21``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Generation = Literal["plan", "prepare"]


@dataclass(frozen=True)
class Release:
    version: str
    generation: Generation
    built: str
    """The wheel's build date (PyPI)."""
    holds: str
    """What its buffer mode is, in a line."""
    backs_up_on_request: bool = False
    """Its cache writes a node through at once when asked (``request_buffer_backup``, 0.5.22
    on); earlier ones write in the insert itself, later ones at a hit-count threshold too."""
    times_prefetch_wait: bool = False
    """Its ``timeout`` policy keeps a wait book (``_StoragePrefetchWait``, timed from
    ``prefetch_timeout_base``: 0.5.23); earlier ones ask ``_prefetch_timeout_check_linear_func``
    of each operation."""


RELEASES: dict[str, Release] = {
    release.version: release
    for release in (
        Release(
            "0.5.19",
            "plan",
            "2026-09-04",
            "PR #36834 as merged; the anchor lock opt-in "
            "(SGLANG_ENABLE_HICACHE_BUFFER_ANCHOR_LOCK)",
        ),
        Release(
            "0.5.20",
            "prepare",
            "2026-09-18",
            "the rework: pin at the commit by default, cap_busy, prepare_staged_prefetch, "
            "StoragePrefetchRetries",
        ),
        Release("0.5.21", "prepare", "2026-10-01", "0.5.20's API; the Rust tree core by default"),
        Release("0.5.22", "prepare", "2026-10-15", "0.5.20's API", backs_up_on_request=True),
        Release(
            "0.5.23",
            "prepare",
            "2026-11",
            "0.5.20's API (the release `make sglang` installs)",
            backs_up_on_request=True,
            times_prefetch_wait=True,
        ),
    )
}
"""Every release with buffer mode, oldest first."""

NEWEST = next(reversed(RELEASES))
FIRST = next(iter(RELEASES))


class UnknownRelease(ValueError):
    """A release name stagefate cannot drive; the message says which can be."""


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def release(version: str) -> Release:
    """The release ``version``, or :class:`UnknownRelease` naming why and what to pick."""
    choices = ", ".join(RELEASES)
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        raise UnknownRelease(f"{version!r} is not a release number; choose one of {choices}")
    if version in RELEASES:
        return RELEASES[version]
    if _key(version) < _key(FIRST):
        raise UnknownRelease(
            f"SGLang {version} has no buffer mode (it first ships in {FIRST}); choose one of "
            f"{choices}"
        )
    raise UnknownRelease(
        f"SGLang {version} is not a release stagefate knows (its private names move between "
        f"releases); choose one of {choices}"
    )


def split_name(name: str, bases: tuple[str, ...]) -> tuple[str, str | None]:
    """``"sglang-rust==0.5.21"`` -> ``("sglang-rust", "0.5.21")``; a plain base -> ``(base,
    None)`` (the newest installed). The base must be one of ``bases``; the release is checked."""
    base, sep, version = name.partition("==")
    if base not in bases or (sep and not version):
        raise UnknownRelease(
            f"{name!r}: expected one of {', '.join(bases)}, optionally with a release "
            f"({bases[0]}=={FIRST})"
        )
    if not sep:
        return base, None
    return base, release(version).version
