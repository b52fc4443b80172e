"""The model checker's abstract world (:mod:`.modelcheck` explores it): its bounds, a request's
record over positions, a stored state and its decoded form, the steps, the violations, and the
mutable draft one step runs on. The guards and effects over it are :mod:`.model_rules`'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, NoReturn, cast

from .schema import transition_text

if TYPE_CHECKING:
    from .modelcheck import ModelChecker

INVARIANTS = frozenset(
    {
        "pin_safety",
        "pin_balance",
        "pure_revoke",
        "hold_release",
        "exactly_once_end",
        "splice_correctness",
        "aux_and_ownership",
        "dedup_waiters",
        "progress",
    }
)
"""The spec's invariant ids this checker raises violations of: exactly those whose
``checked_by`` lists ``model_checker`` (a test holds the two equal)."""
RANK_INVARIANTS = frozenset({"lockstep", "rank_bytes"})
"""What the product of tensor-parallel ranks (:mod:`.modelcheck_ranks`) checks beyond each
rank's own: exactly the ids whose ``checked_by`` lists ``rank_model_checker``."""
NOT_MODELLED_GUARDS = frozenset({"aux_cut"})
"""Guards of parts the abstract world leaves out (no sliding-window aux pool)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The size of the abstract world; the defaults are the bounds CI checks (docs/design.md §7)."""

    pages: int = 5
    requests: int = 3
    host_pages: int = 2
    device_pages: int = 4
    cap_pages: int = 2
    threshold_pages: int = 2
    issues_per_request: int = 2
    max_states: int = 5_000_000

    def want(self, index: int) -> int:
        """Pages request ``index`` wants: spans overlap wholly or partly, no two alike."""
        return self.pages - index


class Rec(NamedTuple):
    """One live record over positions (a tuple: copied with ``_replace`` on every effect).

    Every field is an int or a str, so records order (symmetry sorts requests by them).
    """

    state: str
    matched: int
    span_end: int
    pin: int = -1
    """Pinned position (-1: none); an anchor pin is charged ``matched`` pages to the cap."""
    pin_charge: int = 0
    hit: int = -1
    bounce: int = 0
    read: int = 0
    plan: int = -1
    op: str = ""
    """The IO operation in flight: ``exists``, ``read``, ``load`` or ``""`` (none)."""
    queued: int = 0
    """A parked hit's place in the FIFO (kept by :mod:`.witnesses` only; 0 here, where any
    parked hit may be the head)."""


class Slot(NamedTuple):
    """One request: its live record (None between prefetches), issues so far, whom it waits on."""

    record: Rec | None
    issues: int
    waiting_on: int


State = tuple[int, ...]
"""A state as stored: ``(device, host_free, slot id of request 0, 1, …)``; each distinct
:class:`Slot` is numbered once, so a state hashes and compares as a few small ints."""


class World(NamedTuple):
    """A state decoded: what invariants and drafts read."""

    device: int
    host_free: int
    slots: tuple[Slot, ...]


@dataclass(frozen=True, slots=True)
class Args:
    tokens: int = 0
    error: bool = False
    prefix: int = 0
    host_slack: int = 0
    """The agreed bounce room minus this rank's own (at most 0; tensor parallelism only)."""
    slower: bool = False
    """At the issue or the IO commit: the measured speeds say the load would be slower than
    computing; at ``give_up_slow_read``: the read has run longer than computing would take."""


class Step(NamedTuple):
    """An action: ``request`` is -1 for the world's; ``what`` is the event or the mode."""

    kind: str
    request: int
    what: str
    pages: int = 0
    """Pages a short completion finds."""
    slack: int = 0
    """At the IO commit: the host room the ranks agreed minus this rank's own
    (:mod:`.modelcheck_ranks`; 0 on one rank)."""
    slower: bool = False
    """At an issue or an IO commit (or the pass a completion or a poll runs): the speeds
    measured say loads are slower than computing; at ``give_up_slow_read``: the read in flight
    has run longer than computing its tokens takes. Speeds change between any two steps, so
    the model draws both answers at every issue, commit and give-up."""


class Fired(NamedTuple):
    """One transition a step fired: request ``request``'s record left ``source`` by ``event``
    through the branch guarded by ``guard`` (``else``: none), reached ``target``, ended with
    ``reason`` (None: it lives on)."""

    request: int
    source: str
    event: str
    guard: str
    target: str
    reason: str | None

    def text(self) -> str:
        return transition_text(
            f"r{self.request}", self.source, self.event, self.guard, self.target, self.reason
        )


class Violation(Exception):
    """An invariant failed (``invariant``: its spec id), or the spec cannot run a step
    (``invariant`` None); ``str`` names it."""

    def __init__(self, invariant: str | None, message: str) -> None:
        assert invariant is None or invariant in INVARIANTS | RANK_INVARIANTS, invariant
        self.invariant = invariant
        self.message = message
        super().__init__(message if invariant is None else f"{invariant}: {message}")


@dataclass(slots=True)
class _Draft:
    """A mutable copy of a :class:`World` while one action runs."""

    device: int
    host_free: int
    records: list[Rec | None]
    issues: list[int]
    waiting_on: list[int]
    hidden_pins: int = 0
    """Pages pinned by records the step may not read (see :data:`HIDDEN`)."""
    woke: bool = False
    """Whether the step woke the requests waiting on it."""
    fired: list[Fired] | None = None
    """The transitions the step fired, in order, when a replay asks (None: not kept, as in the
    exhaustive search, where no one reads them)."""

    @classmethod
    def of(cls, world: World, only: int = -1) -> _Draft:
        """A draft of ``world``; with ``only``, every other record is :data:`HIDDEN`."""
        slots = world.slots
        records = [slot.record for slot in slots]
        hidden_pins = 0
        if only >= 0:
            for j, record in enumerate(records):
                if j != only and record is not None:
                    hidden_pins += record.pin_charge
                    records[j] = HIDDEN
        return cls(
            world.device,
            world.host_free,
            records,
            [slot.issues for slot in slots],
            [slot.waiting_on for slot in slots],
            hidden_pins,
        )

    def pinned_total(self) -> int:
        pinned = sum(r.pin_charge for r in self.records if r is not None and r is not HIDDEN)
        return pinned + self.hidden_pins


class _Hidden:
    """Another request's record, where a step is memoised without it (its pins are summed)."""

    def __getattr__(self, name: str) -> NoReturn:
        raise AssertionError(
            f"a step read another request's record ({name}): only the IO commit may; add the "
            "step to ModelChecker._reads_others or stop reading it"
        )


HIDDEN = cast(Rec, _Hidden())


Guard = Callable[["ModelChecker", _Draft, int, Rec, Args], bool]
Effect = Callable[["ModelChecker", _Draft, int, Rec, Args], Rec]
Exit = Callable[["ModelChecker", _Draft, int], None]
Edge = tuple[str, str, str]
