"""The typed, frozen shape of ``lifecycle.yaml``.

Every model is immutable (Automat's rule: the machine is a declaration, not an object that is
edited at run time). Cross-references between sections (a branch naming a state, a guard or an
effect) are resolved here when they can be checked without knowing the implementations; the
static checks in :mod:`stagefate.spec.checks` prove the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

SAME = "same"
"""A branch target meaning: stay in the source state."""


class Level(str, Enum):
    """How surely a state holds a resource."""

    NONE = "none"
    MAYBE = "maybe"
    ALWAYS = "always"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StateSpec(_Frozen):
    doc: str
    holds: dict[str, Literal["maybe", "always"]] = Field(default_factory=dict)
    terminal: bool = False

    def level(self, resource: str) -> Level:
        return Level(self.holds.get(resource, "none"))


class EffectSpec(_Frozen):
    doc: str
    acquires: tuple[str, ...] = ()
    may_acquire: tuple[str, ...] = ()
    releases: tuple[str, ...] = ()


class ExitSpec(_Frozen):
    """A hook run on every move out of a set of states, whichever branch makes it."""

    doc: str
    leaving: str
    """A group or a state: the hook runs on a move from inside it to outside it."""


class BranchSpec(_Frozen):
    """One guarded outcome of a (state, event) row."""

    to: str
    guard: str | None = None
    reason: str | None = None
    effects: tuple[str, ...] = ()
    count: tuple[str, ...] = ()


class TransitionSpec(_Frozen):
    """A row: the same ordered branches for every source state listed in ``from``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    sources: tuple[str, ...] = Field(alias="from", min_length=1)
    event: str
    branches: tuple[BranchSpec, ...] = Field(min_length=1)


class InvariantSpec(_Frozen):
    id: str
    statement: str
    checked_by: tuple[
        Literal[
            "static", "model_checker", "stateful", "rank_fuzzer", "rank_model_checker", "scenarios"
        ],
        ...,
    ] = Field(min_length=1)


class GroupSpec(_Frozen):
    """A named set of live states the code asks about (``spec.group("hold")``)."""

    doc: str
    states: tuple[str, ...] = Field(min_length=1)


class PhaseSpec(_Frozen):
    name: str
    states: tuple[str, ...] = Field(min_length=1)


class FamilySpec(_Frozen):
    name: str
    reasons: tuple[str, ...] = Field(min_length=1)


class DiagramSpec(_Frozen):
    """How the docs group the lifecycle: states by phase, terminal reasons by family."""

    phases: tuple[PhaseSpec, ...] = Field(min_length=1)
    families: tuple[FamilySpec, ...] = Field(min_length=1)

    def phase_of(self, state: str) -> str:
        return next(phase.name for phase in self.phases if state in phase.states)

    def family_of(self, reason: str) -> str:
        return next(family.name for family in self.families if reason in family.reasons)


class KnownFinding(_Frozen):
    """A violation of a design's release, found by the model checker and reported upstream."""

    invariant: str
    """The invariant it breaks (an id under ``invariants``)."""
    finding: str
    """The heading of its section in docs/sglang-findings.md."""


class DesignSpec(_Frozen):
    """Whose lifecycle a spec writes down when it is not stagefate's own (spec/designs/)."""

    name: str
    releases: str
    """The releases that run it (``0.5.20 to 0.5.23``)."""
    source: str
    """Where its facts were read (files of the wheel; facts, not code)."""
    not_expressed: tuple[str, ...] = ()
    """What the implementation does that this spec does not say, each in a sentence."""
    known_findings: tuple[KnownFinding, ...] = ()
    """Violations the model checker is expected to find in this design: a design written down
    faithfully keeps its release's bugs, and the checker finding them is the check that it does
    (``stagefate check --spec`` fails if one is no longer found)."""


CompletionKind = Literal["exists", "read", "load"]
"""The IO operations a record waits on (``IOOp.kind``)."""


COMPLETION_KINDS: tuple[CompletionKind, ...] = get_args(CompletionKind)


def _completions() -> dict[CompletionKind, str]:
    return {"exists": "hit", "read": "read_done", "load": "ack"}


ApiCall = Literal[
    "try_lock_anchor",
    "poll",
    "plan_staged_splice",
    "init_load_back",
    "release_staged_hold",
    "release_aborted_request",
    "give_up_slow_read",
]
"""The scheduler's calls that fire events on a live record (``prefetch_from_storage`` fires
``issue_event``; ``poll`` fires its completions' events, then its own)."""


def _calls() -> dict[ApiCall, tuple[str, ...]]:
    return {
        "try_lock_anchor": ("lock",),
        "poll": ("commit",),
        "plan_staged_splice": ("plan",),
        "init_load_back": ("make_room", "consume"),
        "release_staged_hold": ("release_hold",),
        "release_aborted_request": ("abort",),
    }


class LifecycleSpec(_Frozen):
    version: Literal[1]
    design: DesignSpec | None = None
    """None: stagefate's own lifecycle, which its pipeline implements (bindings checked);
    otherwise another implementation's, checked statically and by the model checker only."""
    resources: dict[str, str]
    states: dict[str, StateSpec]
    initial: str
    issue_event: str = "lock"
    """The event ``prefetch_from_storage`` fires on a new record (in the initial state)."""
    completions: dict[CompletionKind, str] = Field(default_factory=_completions)
    """The event each kind of IO completion fires: the existence query's, the L3 read's, the
    H2D copy's."""
    calls: dict[ApiCall, tuple[str, ...]] = Field(default_factory=_calls)
    """The events each scheduler call fires on a record, in order (it stops at the first that
    ends the record); a design names the calls it has (blind has no try_lock_anchor)."""
    atomic: tuple[tuple[str, str], ...] = ()
    """Pairs of events the scheduler runs back to back in one pass, nothing between them (the
    model checker then never runs a step between the two). Only ``(plan, consume)`` is
    understood."""
    groups: dict[str, GroupSpec]
    events: dict[str, str]
    guards: dict[str, str]
    effects: dict[str, EffectSpec]
    exits: dict[str, ExitSpec] = {}
    """What leaving a group (or a state) ends, run after the branch's effects and the state
    change, before the record's end: bound by name like an effect."""
    reasons: dict[str, str]
    counters: dict[str, str]
    """Every counter but the reasons' (each end reason counts itself under its own name)."""
    transitions: tuple[TransitionSpec, ...]
    diagram: DiagramSpec
    invariants: tuple[InvariantSpec, ...]

    @model_validator(mode="after")
    def _names_resolve(self) -> LifecycleSpec:
        problems = [
            *self._entry_problems(),
            *self._resource_problems(),
            *self._group_problems(),
            *self._name_clash_problems(),
            *self._row_problems(),
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _entry_problems(self) -> Iterator[str]:
        """The initial state, the atomic calls, the completions, the calls and the issue."""
        if self.initial not in self.states:
            yield f"initial state {self.initial!r} is not declared under 'states'"
        for pair in self.atomic:
            if pair != ("plan", "consume"):
                yield (
                    f"atomic {list(pair)}: only [plan, consume] (a plan and its init_load_back "
                    "in one pass) is understood; remove it or extend the model checker"
                )
        for kind, event in self.completions.items():
            if event not in self.events:
                yield (
                    f"completions: {kind!r} fires {event!r}, which is not declared under "
                    "'events'; declare it or name a declared event"
                )
        for call, fired in self.calls.items():
            unknown = [event for event in fired if event not in self.events]
            if unknown or not fired:
                yield (
                    f"calls: {call!r} fires {unknown or 'nothing'}; name events declared under "
                    "'events', at least one"
                )
        if set(self.completions) != set(COMPLETION_KINDS):
            yield "completions: name the event of each of exists, read and load"
        if self.issue_event not in self.events:
            yield (
                f"issue_event {self.issue_event!r} is not declared under 'events' (it is what "
                "prefetch_from_storage fires on a new record)"
            )

    def _resource_problems(self) -> Iterator[str]:
        """What the states hold and the effects take or give back."""
        for name, state in self.states.items():
            for resource in state.holds:
                if resource not in self.resources:
                    yield (
                        f"state {name!r} holds unknown resource {resource!r}; "
                        f"declare it under 'resources' or fix the name"
                    )
        for name, effect in self.effects.items():
            for resource in (*effect.acquires, *effect.may_acquire, *effect.releases):
                if resource not in self.resources:
                    yield f"effect {name!r} names unknown resource {resource!r}"

    def _group_problems(self) -> Iterator[str]:
        """The groups' members and what the exits leave."""
        for group_name, group in self.groups.items():
            for member in group.states:
                if member not in self.states:
                    yield (
                        f"group {group_name!r} names unknown state {member!r}; declare it under "
                        f"'states' or fix the name"
                    )
                elif self.states[member].terminal:
                    yield (
                        f"group {group_name!r} names terminal state {member!r}; groups are of live "
                        f"states (a released record is forgotten), so remove it"
                    )
        for exit_name, exit_spec in self.exits.items():
            if exit_spec.leaving not in self.groups and exit_spec.leaving not in self.states:
                yield (
                    f"exit {exit_name!r} leaves {exit_spec.leaving!r}, which is neither a group "
                    f"nor a state; name one declared under 'groups' or 'states'"
                )

    def _name_clash_problems(self) -> Iterator[str]:
        """A design's known findings name declared invariants; no counter is also a reason."""
        declared = {invariant.id for invariant in self.invariants}
        for known in self.design.known_findings if self.design else ():
            if known.invariant not in declared:
                yield (
                    f"design: known finding {known.finding!r} breaks {known.invariant!r}, which "
                    "is not declared under 'invariants'; declare it or fix the id"
                )
        for counter in self.counters:
            if counter in self.reasons:
                yield (
                    f"counter {counter!r} is also a reason, which counts itself; remove it from "
                    f"'counters'"
                )

    def _row_problems(self) -> Iterator[str]:
        """Each row's event and sources, and each of its branches."""
        for index, row in enumerate(self.transitions):
            where = f"transitions[{index}] ({row.event})"
            if row.event not in self.events:
                yield f"{where}: unknown event {row.event!r}; declare it under 'events'"
            for source in row.sources:
                if source not in self.states:
                    yield f"{where}: unknown source state {source!r}"
            for branch in row.branches:
                yield from self._branch_problems(where, branch)

    def _branch_problems(self, where: str, branch: BranchSpec) -> list[str]:
        problems = []
        if branch.to != SAME and branch.to not in self.states:
            problems.append(f"{where}: unknown target state {branch.to!r}")
        if branch.guard is not None and branch.guard not in self.guards:
            problems.append(f"{where}: unknown guard {branch.guard!r}; declare it under 'guards'")
        for effect in branch.effects:
            if effect not in self.effects:
                problems.append(f"{where}: unknown effect {effect!r}; declare it under 'effects'")
        for counter in branch.count:
            if counter not in self.counters:
                problems.append(
                    f"{where}: unknown counter {counter!r}; declare it under 'counters'"
                )
        target = self.states.get(branch.to)
        if target is not None and target.terminal and branch.reason is None:
            problems.append(f"{where}: a branch into terminal state {branch.to!r} needs a reason")
        if branch.reason is not None:
            if target is None or not target.terminal:
                problems.append(f"{where}: reason {branch.reason!r} on a non-terminal target")
            elif branch.reason not in self.reasons:
                problems.append(f"{where}: unknown reason {branch.reason!r}")
        return problems

    # Derived views used by the generated machine, the checks and the diagrams.

    @property
    def terminal_states(self) -> tuple[str, ...]:
        return tuple(name for name, state in self.states.items() if state.terminal)

    @property
    def all_counters(self) -> tuple[str, ...]:
        """Every counter a pipeline keeps: the declared ones, then one per reason."""
        return (*self.counters, *self.reasons)

    def group(self, name: str, required: bool = True) -> frozenset[str]:
        """The states of group ``name``; a spec without it cannot drive this code, unless the
        group is not ``required`` (a design with no such states: the model checker's
        ``owning`` for one that dedups nothing)."""
        found = self.groups.get(name)
        if found is None and not required:
            return frozenset()
        if found is None:
            raise KeyError(
                f"the spec declares no state group {name!r} (it has {', '.join(self.groups)}); "
                f"add it under 'groups' in the spec"
            )
        return frozenset(found.states)

    def reasons_leaving(self, group: str) -> tuple[str, ...]:
        """The reasons a record ends with from a state of ``group``, in spec order (from
        ``spliced``: the ends of a read that was spliced from, whatever became of its copy)."""
        states = self.group(group)
        reasons: dict[str, None] = {}
        for source, _, branches in self.rows():
            if source in states:
                reasons.update(dict.fromkeys(b.reason for b in branches if b.reason))
        return tuple(reasons)

    def exits_on(self, source: str, target: str) -> tuple[str, ...]:
        """The exits a move from ``source`` to ``target`` runs, in spec order."""
        return tuple(
            name
            for name, exit_spec in self.exits.items()
            if source in self._left(exit_spec) and target not in self._left(exit_spec)
        )

    def _left(self, exit_spec: ExitSpec) -> frozenset[str]:
        group = self.groups.get(exit_spec.leaving)
        return frozenset((exit_spec.leaving,) if group is None else group.states)

    def rows(self) -> list[tuple[str, str, tuple[BranchSpec, ...]]]:
        """``(state, event, branches)`` for every source state of every row, in spec order."""
        return [
            (source, row.event, row.branches) for row in self.transitions for source in row.sources
        ]

    def edges(self) -> list[tuple[str, str, str]]:
        """``(state, event, guard or 'else')`` of every branch, in spec order."""
        return [
            (state, event, branch.guard or "else")
            for state, event, branches in self.rows()
            for branch in branches
        ]

    def target_of(self, source: str, branch: BranchSpec) -> str:
        return source if branch.to == SAME else branch.to


def transition_text(
    request: str, source: str, event: str, guard: str, target: str, reason: str | None
) -> str:
    """One fired transition as the generated tests and their failures write it:
    ``r0: (issued) --lock[below_threshold]--> released (declined_too_short)``; ``guard`` is the
    branch taken (its guard, or ``else``)."""
    ends = f" ({reason})" if reason else ""
    return f"{request}: ({source}) --{event}[{guard}]--> {target}{ends}"
