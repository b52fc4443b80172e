"""The compiled lifecycle: each row of the spec generated into one straight-line Python function.

For every ``(state, event)`` row the spec's branches become a function that tests the guards in
order and, on the first that holds (or the fallback), runs that branch's effects, enters its
target, counts its counters, runs the exit hooks of the move and ends the record with the
branch's reason. Firing an event is one dict lookup and one call; there is no loop over branch
objects and no second frame per transition, which on the per-prefetch path was a sixth of the
interpreter's work. The functions are written from the spec alone (:func:`factory_source`),
compiled once per spec object and shape of hooks, and closed over each machine's own guards and
effects, so building a machine costs a few dozen closures, not a compile.

The ``transitions`` Machine built from the same spec (:mod:`.oracle`) is the reference; a
conformance test drives both and requires identical states.

Guards must be pure: they are evaluated before anything changes, so an event that raises (no row
for the state) or a guard that raises leaves the record untouched.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable, Collection, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ..spec import LifecycleSpec
from ..spec.checks import implementation_problems
from .errors import IncompleteImplementation, LifecycleError


class HasState(Protocol):
    """What the machine reads of a context; its generated rows set ``state`` (read-only here, so
    a context may type its state with the spec's names, ``spec/names.py``)."""

    @property
    def request_id(self) -> str:
        """The request the record belongs to."""
        ...

    @property
    def state(self) -> str:
        """The record's state (a name of the spec's ``states``)."""
        ...


Ctx = TypeVar("Ctx", bound=HasState)
K = TypeVar("K")
V = TypeVar("V")
Guard = Callable[[Ctx], bool]
Effect = Callable[[Ctx], None]
Transition = Callable[[Ctx], "Outcome"]
EndHook = Callable[[Ctx, str], None]
"""Called with the branch's reason when a branch ends the record."""
Factory = Callable[..., dict[str, dict[tuple[str, str], Any]]]
"""``make``: its functions are generated, so their types are the machine's to state."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one fired event decided: the branch taken and what it names."""

    source: str
    event: str
    target: str
    guard: str | None
    reason: str | None
    effects: tuple[str, ...]
    counters: tuple[str, ...]

    @property
    def ended(self) -> bool:
        """The branch ended the record (it has a reason; the record is forgotten)."""
        return self.reason is not None


def named_methods(cls: type, prefix: str) -> frozenset[str]:
    """The spec names ``cls`` implements as ``{prefix}{name}`` methods (``_guard_zero_pages``
    is ``zero_pages``): what binding by name finds, for the completeness check."""
    return frozenset(name.removeprefix(prefix) for name in vars(cls) if name.startswith(prefix))


def bind(owner: object, prefix: str, names: Collection[str]) -> dict[str, Any]:
    """``{name: owner.<prefix><name>}``: the bound methods a machine is built from."""
    return {name: getattr(owner, f"{prefix}{name}") for name in names}


def require_complete(
    spec: LifecycleSpec,
    guards: Mapping[str, object],
    effects: Mapping[str, object],
    counts: Mapping[str, int] | None = None,
    groups: Collection[str] = (),
    exits: Mapping[str, object] | None = None,
) -> None:
    """Raise unless the implementation is exactly the spec's (:func:`implementation_problems`)."""
    problems = implementation_problems(spec, guards, effects, counts, groups, exits)
    if problems:
        raise IncompleteImplementation("; ".join(problems))


class CompiledMachine(Generic[Ctx]):
    """The spec's rows as generated functions over bound guards and effects.

    ``counts`` (optional) receives the branches' counters and must hold exactly the spec's
    counters; ``groups`` names the state groups the caller reads (each must be declared);
    ``exits`` (optional) binds the spec's exits, each run on a move out of its group (after the
    branch's own effects and the state change); ``end`` is called with the reason of a branch
    that has one, last.
    """

    def __init__(
        self,
        spec: LifecycleSpec,
        guards: Mapping[str, Guard[Ctx]],
        effects: Mapping[str, Effect[Ctx]],
        counts: MutableMapping[str, int] | None = None,
        exits: Mapping[str, Effect[Ctx]] | None = None,
        end: EndHook[Ctx] | None = None,
        groups: Collection[str] = (),
    ) -> None:
        require_complete(spec, guards, effects, counts, groups, exits)
        self.spec = spec
        self._legal: dict[str, list[str]] = {name: [] for name in spec.states}
        for source, event, _branches in spec.rows():
            self._legal[source].append(event)
        factory = _factory(
            spec, counted=counts is not None, exited=exits is not None, ended=end is not None
        )
        made = factory(
            guards=[guards[name] for name in sorted(spec.guards)],
            effects=[effects[name] for name in sorted(spec.effects)],
            outcomes=_outcomes(spec),
            exits=[] if exits is None else [exits[name] for name in sorted(spec.exits)],
            counts=counts,
            end=end,
        )
        self.transitions: Mapping[tuple[str, str], Transition[Ctx]] = made["fire"]
        """``{(state, event): fire}``: a hot caller's one lookup and one call."""
        self._decisions: Mapping[tuple[str, str], Transition[Ctx]] = made["decide"]

    def allows(self, state: str, event: str) -> bool:
        """Whether the spec has a row for ``event`` in ``state``."""
        return (state, event) in self.transitions

    def legal_events(self, state: str) -> list[str]:
        """The events the spec's rows accept in ``state``, in spec order."""
        return list(self._legal.get(state, ()))

    def decide(self, ctx: Ctx, event: str) -> Outcome:
        """The branch ``event`` would take now, without running any effect."""
        return self._row(self._decisions, ctx, event)(ctx)

    def fire(self, ctx: Ctx, event: str) -> Outcome:
        """Take the first branch whose guard holds: run its effects, then enter its target."""
        return self._row(self.transitions, ctx, event)(ctx)

    def refuse(self, ctx: Ctx, event: str) -> LifecycleError:
        """The error for an event the spec has no row for in the record's state."""
        return LifecycleError(ctx.request_id, ctx.state, event, self.legal_events(ctx.state))

    def _row(
        self, table: Mapping[tuple[str, str], Transition[Ctx]], ctx: Ctx, event: str
    ) -> Transition[Ctx]:
        row = table.get((ctx.state, event))
        if row is None:
            raise self.refuse(ctx, event)
        return row


_CACHE_SIZE = 32
_OUTCOMES: dict[int, tuple[LifecycleSpec, list[Outcome]]] = {}
_FACTORIES: dict[tuple[int, bool, bool, bool], tuple[LifecycleSpec, Factory]] = {}
"""Per spec object (kept alive by the entry, so its ``id`` is not reused while cached): a
pipeline is built per fuzz program, and writing and compiling the rows each time would cost
more than the rest of the pipeline's construction."""


def _outcomes(spec: LifecycleSpec) -> list[Outcome]:
    """Every branch's :class:`Outcome`, row by row in spec order."""
    return _per_spec(
        _OUTCOMES,
        id(spec),
        spec,
        lambda: [
            Outcome(
                source=source,
                event=event,
                target=spec.target_of(source, branch),
                guard=branch.guard,
                reason=branch.reason,
                effects=branch.effects,
                counters=branch.count,
            )
            for source, event, branches in spec.rows()
            for branch in branches
        ],
    )


def _factory(spec: LifecycleSpec, counted: bool, exited: bool, ended: bool) -> Factory:
    return _per_spec(
        _FACTORIES,
        (id(spec), counted, exited, ended),
        spec,
        lambda: _compile_factory(factory_source(spec, counted, exited, ended)),
    )


def _per_spec(
    cache: dict[K, tuple[LifecycleSpec, V]], key: K, spec: LifecycleSpec, make: Callable[[], V]
) -> V:
    """``make()`` once per key while cached; the entry keeps ``spec`` alive, so its ``id`` in
    the key is not reused. Cleared whole when full."""
    cached = cache.get(key)
    if cached is None:
        if len(cache) >= _CACHE_SIZE:
            cache.clear()
        cached = cache[key] = (spec, make())
    return cached[1]


def factory_source(spec: LifecycleSpec, counted: bool, exited: bool, ended: bool) -> str:
    """Python source of ``make(guards, effects, outcomes, exits, counts, end)``, which returns
    ``{"fire": {(state, event): fire}, "decide": {(state, event): decide}}``.

    Guards, effects, outcomes and exits are positional (``g3``, ``e7``, ``o12``, ``x1``): the
    spec's names only appear in comments and string constants, written with ``repr``.
    """
    guard_of = {name: f"g{i}" for i, name in enumerate(sorted(spec.guards))}
    effect_of = {name: f"e{i}" for i, name in enumerate(sorted(spec.effects))}
    exit_of = {name: f"x{i}" for i, name in enumerate(sorted(spec.exits))} if exited else {}
    lines = ["def make(guards, effects, outcomes, exits, counts, end):"]
    for names, given in (
        (guard_of.values(), "guards"),
        (effect_of.values(), "effects"),
        (exit_of.values(), "exits"),
    ):
        if names:
            lines.append(f"    {', '.join(names)}, = {given}")
    fires, decides = [], []
    outcome = 0
    for index, (source, event, branches) in enumerate(spec.rows()):
        fire = [f"    def fire_{index}(ctx):  # {source!r} --{event!r}-->"]
        decide = [f"    def decide_{index}(ctx):  # {source!r} --{event!r}-->"]
        for branch in branches:
            target = spec.target_of(source, branch)
            body = [f"ctx.state = {target!r}"]
            body[:0] = [f"{effect_of[name]}(ctx)  # {name!r}" for name in branch.effects]
            if counted:
                body += [f"counts[{name!r}] += 1" for name in branch.count]
            leaving = spec.exits_on(source, target) if exited else ()
            body += [f"{exit_of[name]}(ctx)  # {name!r}" for name in leaving]
            if ended and branch.reason is not None:
                body.append(f"end(ctx, {branch.reason!r})")
            body.append(f"return o{outcome}")
            if branch.guard is None:
                fire += [f"        {line}" for line in body]
                decide.append(f"        return o{outcome}")
            else:
                test = f"        if {guard_of[branch.guard]}(ctx):  # {branch.guard!r}"
                fire += [test, *(f"            {line}" for line in body)]
                decide += [test, f"            return o{outcome}"]
            outcome += 1
        if branches[-1].guard is not None:  # the static checks require a fallback; say so here
            missing = f"raise AssertionError({f'({source}, {event}) has no fallback'!r})"
            fire.append(f"        {missing}")
            decide.append(f"        {missing}")
        fires += [*fire, ""]
        decides += [*decide, ""]
    outcomes = ", ".join(f"o{i}" for i in range(outcome))
    lines += [f"    {outcomes}, = outcomes", "", *fires, *decides]
    keys = [f"({source!r}, {event!r})" for source, event, _branches in spec.rows()]
    for kind in ("fire", "decide"):
        entries = ", ".join(f"{key}: {kind}_{index}" for index, key in enumerate(keys))
        lines.append(f"    {kind} = {{{entries}}}")
    lines.append("    return {'fire': fire, 'decide': decide}")
    return "\n".join(lines) + "\n"


def _compile_factory(source: str) -> Factory:
    """Compile a factory; its lines show in tracebacks (``linecache``)."""
    filename = f"<stagefate lifecycle {abs(hash(source)):x}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, object] = {}
    exec(compile(source, filename, "exec"), namespace)  # the source is written above
    return namespace["make"]  # type: ignore[return-value]
