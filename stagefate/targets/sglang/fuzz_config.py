"""The settings a program of SGLang's fuzzer runs under, drawn per program.

A release is deployed with knobs, and its defaults are one point among them: 0.5.19's paced
retry ships off, so a campaign on its defaults never runs its retry path. Each program therefore
draws a :class:`FuzzConfig` (the prefetch stop policy, the retry pacing, the anchor lock and its
cap, the host bounce buffer, the prefetch threshold) before its first move; Hypothesis prints it
with a failing program (``Draw 1 (config): FuzzConfig(...)``), and ``fuzz --config KEY=VALUE``
pins a field for a whole campaign. Each field's first choice is the world of the campaigns
before configurations were drawn, so a failure shrinks towards it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

PAGE = 4
"""The fuzz world's page size (tokens) in SGLang's runs."""
DEVICE_TOKENS = 512
"""The consumer's device pool: SGLang's ``SteppedSGLang`` default."""
HIT_TOKENS = 8 * PAGE
"""The longest hit of the fuzz world: one whole sequence."""


@dataclass(frozen=True)
class FuzzConfig:
    """One program's deployment of the release under test."""

    prefetch_policy: Literal["wait_complete", "best_effort", "timeout"] = "wait_complete"
    """``--hicache-storage-prefetch-policy`` (``timeout``'s deadline is the world's clock:
    the fuzzer's ``expire_wait`` move)."""
    retry_interval: int | None = None
    """``--hicache-storage-prefetch-retry-poll-interval`` (0: paced retries off); None: the
    release's default."""
    retry_max_attempts: int | None = None
    """``--hicache-storage-prefetch-retry-max-attempts``; None: the release's default."""
    anchor_lock: bool | None = None
    """Pin the splice base (0.5.19's switch; a cap of 0 in later releases); None: the
    release's default (0.5.19 off, later releases on)."""
    anchor_cap: float = 24 / DEVICE_TOKENS
    """The anchor-lock cap as a share of the device pool: 24 tokens, so two short anchors fit, a
    third waits and a whole sequence's anchor is over it."""
    host_tokens: int | None = None
    """The host bounce buffer in tokens; None: SGLang's default. Below :data:`HIT_TOKENS` no
    whole hit fits."""
    prefetch_threshold: int = 1
    """Spans shorter than this (tokens) are not fetched."""
    swa_window: int | None = None
    """A hybrid model's sliding window (tokens; :mod:`.hybrid`): SWA layers beside full
    attention, with an SWA pool of their own; None: full attention only. A window SGLang
    cannot stage in the host pool drawn (two windows) is a deployment it refuses: the program
    is rejected, not failed."""

    def driver_settings(self) -> dict[str, Any]:
        """The fields of :class:`~.pipeline_driver.SteppedSGLang` this configuration sets."""
        return {"page_size": PAGE, "device_tokens": DEVICE_TOKENS, **dataclasses.asdict(self)}


CHOICES: Mapping[str, Sequence[Any]] = {
    "prefetch_policy": ("wait_complete", "best_effort", "timeout"),
    "retry_interval": (None, 0, 1, 4),
    "retry_max_attempts": (None, 1, 3),
    "anchor_lock": (None, True, False),
    "anchor_cap": (24 / DEVICE_TOKENS, 0.5),
    "host_tokens": (None, 2 * HIT_TOKENS, HIT_TOKENS // 2, 2 * PAGE),
    "prefetch_threshold": (1, 3 * PAGE, HIT_TOKENS + 1),
    "swa_window": (None, PAGE, 2 * PAGE),
}
"""What each field is drawn from, its default first (``HIT_TOKENS + 1``: nothing is fetched)."""
assert set(CHOICES) == {field.name for field in dataclasses.fields(FuzzConfig)}


def configurations(pins: Mapping[str, Any]) -> st.SearchStrategy[FuzzConfig]:
    """Every field drawn from :data:`CHOICES`, but those ``pins`` fixes."""
    return st.builds(
        FuzzConfig,
        **{
            name: st.just(pins[name]) if name in pins else st.sampled_from(choices)
            for name, choices in CHOICES.items()
        },
    )


def parse_pins(texts: Sequence[str], flag: str = "--config") -> dict[str, Any]:
    """``fuzz --config KEY=VALUE`` (repeatable): the fields a campaign fixes (``flag``: the
    option the errors name)."""
    fields = {field.name: field for field in dataclasses.fields(FuzzConfig)}
    pins: dict[str, Any] = {}
    for text in texts:
        name, equals, raw = text.partition("=")
        name = name.strip().replace("-", "_")
        if not equals or name not in fields:
            raise ValueError(
                f"{flag} {text!r}: expected KEY=VALUE with KEY one of {', '.join(fields)}"
            )
        if name in pins:
            raise ValueError(f"{flag} {name} is given twice: keep one")
        pins[name] = _value(name, raw.strip(), flag)
    return pins


_NONE_WORDS = {"swa_window": "off"}
"""How a field's None is written where it is not the release's default."""


def _value(name: str, raw: str, flag: str) -> Any:
    choices = CHOICES[name]
    fix = f"{flag} {name}=: one of {', '.join(_show(name, choice) for choice in choices)}"
    if raw == _NONE_WORDS.get(name, "default") and None in choices:
        return None
    if name == "prefetch_policy":
        if raw not in choices:
            raise ValueError(f"{fix} (got {raw!r})")
        return raw
    if name == "anchor_lock":
        if raw not in ("on", "off", "true", "false"):
            raise ValueError(f"{fix}: on or off (got {raw!r})")
        return raw in ("on", "true")
    try:
        number = float(raw) if name == "anchor_cap" else int(raw)
    except ValueError:
        raise ValueError(f"{fix}, or another number (got {raw!r})") from None
    least = 1 if name in ("host_tokens", "prefetch_threshold", "swa_window") else 0
    if not least <= number <= (1 if name == "anchor_cap" else float("inf")):
        bounds = "a share from 0 to 1" if name == "anchor_cap" else f"at least {least}"
        raise ValueError(f"{fix}; {name} is {bounds} (got {raw!r})")
    return number


def _show(name: str, choice: Any) -> str:
    if choice is None:
        return _NONE_WORDS.get(name, "default")
    if isinstance(choice, bool):
        return "on" if choice else "off"
    return f"{choice:g}" if isinstance(choice, float) else str(choice)
