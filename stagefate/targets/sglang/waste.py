"""Decisions that are only wasteful: the same program under two settings, compared on the tokens
read from L3 and never spliced.

A setting can keep every invariant and still cost more: an anchor lock that is skipped reads a
span a sibling then publishes, a retry that reads again what a revoked prefetch already had. No
invariant fails on such a program, so the fuzzer compares. With ``fuzz --target sglang --compare
KEY=VALUE``, each program's driver calls are recorded (:class:`RecordingDriver`) as it runs
under its drawn configuration; at its end the same calls are replayed on a *twin*, a fresh world
whose configuration differs only in ``KEY``. A call the twin cannot take (an admission of a
request it already admitted, a retry of one it dropped) is skipped and counted. Each side's
waste is what SGLang read into the bounce buffer (its own ``log_prefetched_tokens``) less what
its admissions loaded onto the device, once both are settled. A program where one side wastes
more is a finding of its own kind (performance): :data:`WASTE` keeps the largest difference
each way with its program, printed as the driver calls it is made of; with ``--waste-fails
SIDE`` such a program fails (:class:`WastedMore`), so Hypothesis shrinks it to a minimal one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .fuzz_config import FuzzConfig
from .pipeline_driver import SteppedSGLang

Call = tuple[str, tuple[Any, ...], dict[str, Any], Any]
"""A recorded driver call: its name, arguments, keyword arguments and result."""


READ_ONLY = frozenset(
    {
        "slot_problems",
        "device_books",
        "swa_books",
        "loading",
        "live",
        "abandoned",
        "pipeline_host_available",
        "retry_budget",
    }
)
"""Driver calls that change nothing: not recorded, so not replayed on a twin (the invariants
make some of them after every step) nor printed."""
UNPRINTED = frozenset({"device_marks"})
"""Observations the invariants make after every step through SGLang's own ``match_prefix``,
which splits nodes and applies cache actions (a hybrid's SWA tombstones): recorded and replayed,
so the twin's tree is walked as the drawn one was (else the two differ by more than their
setting), but not printed."""


class WastedMore(AssertionError):
    """``fuzz --waste-fails SIDE``: in this program that side read more from L3 without splicing
    it than the other (a performance finding; Hypothesis shrinks it like any failure)."""


class RecordingDriver:
    """Forwards every method call to ``driver`` and records those that change something
    (attribute reads and the :data:`READ_ONLY` calls, the invariants' among them, pass through
    unrecorded)."""

    def __init__(self, driver: SteppedSGLang) -> None:
        self._driver = driver
        self.calls: list[Call] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._driver, name)
        if not callable(value):
            return value

        if name in READ_ONLY:
            return value  # it changes nothing: a twin need not make it, a program not show it

        def recorded(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            # only an admission's result is read later; the others may hold SGLang's objects,
            # which need not pickle to another release's process
            self.calls.append((name, args, kwargs, result if name == "admit" else None))
            return result

        return recorded


class ReadTokens:
    """Stands in for SGLang's storage metrics collector on a side: counts the tokens its reads
    brought into the bounce buffer (and passes every call on to ``passed_on``)."""

    def __init__(self, passed_on: Any = None) -> None:
        self.tokens = 0
        self.passed_on = passed_on

    def log_prefetched_tokens(self, tokens: int) -> None:
        self.tokens += int(tokens)

    def __getattr__(self, name: str) -> Any:
        forward = getattr(self.passed_on, name, None)
        return forward if forward is not None else lambda *args, **kwargs: None


@dataclass(frozen=True)
class Waste:
    read: int
    """Tokens read from L3 into the bounce buffer."""
    spliced: int
    """Tokens admissions loaded onto the device."""

    @property
    def wasted(self) -> int:
        return self.read - self.spliced


@dataclass
class Comparison:
    """A campaign's comparison of two settings (:data:`WASTE`)."""

    key: str = ""
    value: Any = None
    programs: int = 0
    skipped_calls: int = 0
    more: dict[str, int] = field(default_factory=lambda: {"drawn": 0, "twin": 0})
    """Programs in which that side wasted more."""
    worst: dict[str, tuple[int, FuzzConfig, list[Call]] | None] = field(
        default_factory=lambda: {"drawn": None, "twin": None}
    )
    """Per side, the program in which it wasted the most more than the other: the difference,
    the drawn configuration, the calls."""
    pending: list[tuple[FuzzConfig, list[Call], Waste, int]] = field(default_factory=list)
    """With :data:`RELEASE`: each program's configuration, calls, waste and the call at which
    quiescence began, to replay in the twin release's process after the campaign."""

    def start(self, key: str, value: Any) -> None:
        """A new campaign comparing the drawn configurations with ``key`` set to ``value``."""
        fresh = Comparison(key, value)
        for each in dataclasses.fields(self):
            setattr(self, each.name, getattr(fresh, each.name))

    def add(self, config: FuzzConfig, calls: list[Call], drawn: Waste, twin: Waste) -> None:
        self.programs += 1
        difference = twin.wasted - drawn.wasted
        side = "twin" if difference > 0 else "drawn"
        if difference:
            self.more[side] += 1
            worst = self.worst[side]
            if worst is None or abs(difference) > worst[0]:
                self.worst[side] = (abs(difference), config, list(calls))


RELEASE = "release"
"""``--compare release=V``: the twin is SGLang V under the same drawn configuration (its own
defaults where the configuration says "the release's"), the programs replayed in V's process
once the campaign ends."""

WASTE = Comparison()
"""The running campaign's comparison (reset by each campaign)."""


def spliced(calls: list[Call]) -> int:
    return sum(int(result) for name, _args, _kwargs, result in calls if name == "admit")


def replay(calls: list[Call], twin: SteppedSGLang) -> tuple[int, int]:
    """Make ``calls`` on ``twin``; returns ``(tokens its admissions loaded, calls skipped)``.
    A call the twin refuses (a ``ValueError`` or ``KeyError``: a request not in the state the
    call needs there) is skipped."""
    loaded = skipped = 0
    for name, args, kwargs, _result in calls:
        try:
            result = getattr(twin, name)(*args, **kwargs)
        except (ValueError, KeyError):
            skipped += 1
            continue
        if name == "admit":
            loaded += int(result)
    return loaded, skipped


def twin_config(config: FuzzConfig, key: str, value: Any) -> FuzzConfig:
    return dataclasses.replace(config, **{key: value})


def program_text(calls: list[Call], sequences: Sequence[list[int]]) -> str:
    """``calls`` as the driver calls they are, one per line (an admission's tokens loaded as a
    comment; a token list as the fuzz world's ``SEQUENCES[i]`` or prefix of one it is)."""
    lines = []
    for name, args, kwargs, result in calls:
        if name in UNPRINTED:
            continue
        shown = [_show(arg, sequences) for arg in args] + [
            f"{key}={_show(value, sequences)}" for key, value in kwargs.items()
        ]
        note = f"  # {result!r}" if name == "admit" and result else ""
        lines.append(f"driver.{name}({', '.join(shown)}){note}")
    return "\n".join(lines)


def _show(value: Any, sequences: Sequence[list[int]]) -> str:
    if isinstance(value, list):
        for index, sequence in enumerate(sequences):
            if value == sequence:
                return f"SEQUENCES[{index}]"
            if value and sequence[: len(value)] == value:
                return f"SEQUENCES[{index}][:{len(value)}]"
    return repr(value)
