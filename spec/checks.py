"""Static checks of a lifecycle spec: what can be proved from the declaration alone.

Each check returns findings; an empty list means the spec passed. The checks are:

* ``implementations``: the guards, effects and counters implemented are exactly the spec's,
  and every state group the code reads is declared (:func:`implementation_problems`, which the
  compiled machine also runs before it builds);
* ``reachability``: every state is reachable from the initial state;
* ``termination``: every live state can reach a terminal state;
* ``determinism``: one row per (state, event); within a row the guards are distinct, every
  branch but the last is guarded, and the last is the unguarded fallback (so the outcome is
  total and decided by order alone);
* ``resource_balance``: applying a branch's effects to what the source may hold yields exactly
  what the target may hold (acquire what is new, release what is dropped, never acquire twice);
* ``pure_revoke``: no state of the ``pre_commit`` group holds the bounce, and no branch from one
  into a terminal state allocates it;
* ``terminal``: terminal states hold nothing and have no exits;
* ``unused``: every declared event, guard, effect and reason is used by some row;
* ``diagram``: every state is drawn in exactly one phase and every reason in exactly one family.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

from .schema import BranchSpec, Level, LifecycleSpec


@dataclass(frozen=True)
class Finding:
    check: str
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.message}"


def implementation_problems(
    spec: LifecycleSpec,
    guards: Collection[str],
    effects: Collection[str],
    counters: Collection[str] | None = None,
    groups: Collection[str] = (),
    exits: Collection[str] | None = None,
) -> list[str]:
    """What an implementation lacks or has beyond the spec, each with its fix (empty: none).

    The one completeness check, both directions: every guard and effect the spec declares is
    implemented and nothing else is; ``counters`` and ``exits`` (when given) are exactly the
    spec's; every group the implementation reads (``groups``) is declared."""
    problems = []
    wanted: list[tuple[str, Collection[str], Collection[str], str]] = [
        ("guard", spec.guards, guards, "bind exactly the guards spec/lifecycle.yaml declares"),
        ("effect", spec.effects, effects, "bind exactly the effects spec/lifecycle.yaml declares"),
    ]
    if counters is not None:
        wanted.append(
            (
                "counter",
                spec.all_counters,
                counters,
                "Stats (statemachine/stats.py) keeps one "
                "field per counter of the spec's 'counters' and 'reasons'",
            )
        )
    if exits is not None:
        wanted.append(
            ("exit", spec.exits, exits, "bind exactly the exits spec/lifecycle.yaml declares")
        )
    for kind, declared, given, fix in wanted:
        missing = sorted(set(declared) - set(given))
        extra = sorted(set(given) - set(declared))
        if missing:
            problems.append(
                f"{kind}s the spec declares with no implementation: {', '.join(missing)} ({fix})"
            )
        if extra:
            problems.append(
                f"{kind} implementations the spec never declares: {', '.join(extra)} ({fix})"
            )
    undeclared = sorted(set(groups) - set(spec.groups))
    if undeclared:
        problems.append(
            f"state groups the implementation reads that the spec does not declare: "
            f"{', '.join(undeclared)} (add them under 'groups')"
        )
    return problems


def check_implementations(
    spec: LifecycleSpec,
    guards: Collection[str],
    effects: Collection[str],
    counters: Collection[str] | None = None,
    groups: Collection[str] = (),
    exits: Collection[str] | None = None,
) -> list[Finding]:
    return [
        Finding("implementations", problem)
        for problem in implementation_problems(spec, guards, effects, counters, groups, exits)
    ]


def successors(spec: LifecycleSpec) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in spec.states}
    for source, _event, branches in spec.rows():
        for branch in branches:
            edges[source].add(spec.target_of(source, branch))
    return edges


def _reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen = {start}
    queue = deque([start])
    while queue:
        for nxt in edges[queue.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def check_reachability(spec: LifecycleSpec) -> list[Finding]:
    reached = _reachable(successors(spec), spec.initial)
    return [
        Finding("reachability", f"state {name!r} is not reachable from {spec.initial!r}")
        for name in spec.states
        if name not in reached
    ]


def check_termination(spec: LifecycleSpec) -> list[Finding]:
    edges = successors(spec)
    terminals = set(spec.terminal_states)
    return [
        Finding("termination", f"live state {name!r} can never reach a terminal state")
        for name, state in spec.states.items()
        if not state.terminal and not (_reachable(edges, name) & terminals)
    ]


def check_determinism(spec: LifecycleSpec) -> list[Finding]:
    findings: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for source, event, branches in spec.rows():
        where = f"({source}, {event})"
        if (source, event) in seen:
            findings.append(
                Finding("determinism", f"{where} appears in two rows; merge them into one")
            )
        seen.add((source, event))
        guards = [branch.guard for branch in branches if branch.guard is not None]
        for guard in {g for g in guards if guards.count(g) > 1}:
            findings.append(Finding("determinism", f"{where}: guard {guard!r} is tried twice"))
        for position, branch in enumerate(branches[:-1]):
            if branch.guard is None:
                findings.append(
                    Finding(
                        "determinism",
                        f"{where}: branch {position} has no guard, so the branches after it "
                        f"can never fire; move it last or give it a guard",
                    )
                )
        if branches[-1].guard is not None:
            findings.append(
                Finding(
                    "determinism",
                    f"{where}: the last branch is guarded by {branches[-1].guard!r}, so some "
                    f"outcomes have no transition; add an unguarded fallback branch",
                )
            )
    return findings


def _held_after(spec: LifecycleSpec, source: str, branch: BranchSpec) -> dict[str, Level]:
    """What the record may hold after the branch's effects, or raise on a double acquire."""
    held = {resource: spec.states[source].level(resource) for resource in spec.resources}
    for name in branch.effects:
        effect = spec.effects[name]
        for resource in effect.releases:
            held[resource] = Level.NONE
        for resource in effect.acquires:
            if held[resource] is not Level.NONE:
                raise ValueError(
                    f"effect {name!r} acquires {resource!r}, which {source!r} may already hold "
                    f"(a double acquire); release it first or use may_acquire"
                )
            held[resource] = Level.ALWAYS
        for resource in effect.may_acquire:
            if held[resource] is not Level.ALWAYS:
                held[resource] = Level.MAYBE
    return held


def check_resource_balance(spec: LifecycleSpec) -> list[Finding]:
    findings: list[Finding] = []
    for source, event, branches in spec.rows():
        for branch in branches:
            target = spec.target_of(source, branch)
            edge = f"{source} --{event}[{branch.guard or 'else'}]--> {target}"
            try:
                held = _held_after(spec, source, branch)
            except ValueError as exc:
                findings.append(Finding("resource_balance", f"{edge}: {exc}"))
                continue
            for resource, level in held.items():
                allowed = spec.states[target].level(resource)
                if allowed is Level.NONE and level is not Level.NONE:
                    findings.append(
                        Finding(
                            "resource_balance",
                            f"{edge}: leaks {resource!r} ({target!r} cannot hold it); "
                            f"add an effect that releases it",
                        )
                    )
                if allowed is Level.ALWAYS and level is not Level.ALWAYS:
                    findings.append(
                        Finding(
                            "resource_balance",
                            f"{edge}: {target!r} always holds {resource!r} but the effects do "
                            f"not surely acquire it; add an effect that acquires it",
                        )
                    )
    return findings


def check_pure_revoke(spec: LifecycleSpec) -> list[Finding]:
    """No state of the ``pre_commit`` group may hold the bounce, and no branch leaving it for a
    terminal state acquires one: a record released at or before the IO commit read nothing."""
    findings: list[Finding] = []
    pre_commit = spec.groups.get("pre_commit")
    if pre_commit is None:
        return [Finding("pure_revoke", "no 'pre_commit' state group; declare it under 'groups'")]
    for name in pre_commit.states:
        if spec.states[name].level("bounce") is not Level.NONE:
            findings.append(
                Finding(
                    "pure_revoke",
                    f"pre-commit state {name!r} may hold the bounce; only the IO commit's "
                    f"read may allocate it (remove 'bounce' from its holds)",
                )
            )
    for source, event, branches in spec.rows():
        if source not in pre_commit.states:
            continue
        for branch in branches:
            if not spec.states[spec.target_of(source, branch)].terminal:
                continue
            acquiring = [
                effect
                for effect in branch.effects
                if "bounce" in (*spec.effects[effect].acquires, *spec.effects[effect].may_acquire)
            ]
            if acquiring:
                findings.append(
                    Finding(
                        "pure_revoke",
                        f"{source} --{event}[{branch.guard or 'else'}]--> {branch.to} ends the "
                        f"record but runs {acquiring}, which allocate the bounce; a revoke "
                        f"must allocate nothing",
                    )
                )
    return findings


PROVES: dict[str, tuple[str, ...]] = {
    "pure_revoke": ("pure_revoke", "resource_balance"),
    "hold_release": ("resource_balance", "terminal"),
    "exactly_once_end": ("termination", "terminal", "determinism"),
}
"""The static checks that prove each invariant whose ``checked_by`` lists ``static`` (a test
holds the keys equal to those invariants)."""


def check_terminal(spec: LifecycleSpec) -> list[Finding]:
    findings: list[Finding] = []
    if not spec.terminal_states:
        findings.append(Finding("terminal", "no terminal state is declared"))
    for name in spec.terminal_states:
        if spec.states[name].holds:
            findings.append(
                Finding(
                    "terminal", f"terminal state {name!r} holds {sorted(spec.states[name].holds)}"
                )
            )
    for source, event, _branches in spec.rows():
        if spec.states[source].terminal:
            findings.append(
                Finding(
                    "terminal", f"terminal state {source!r} has an exit on {event!r}; remove it"
                )
            )
    return findings


def check_unused(spec: LifecycleSpec) -> list[Finding]:
    used_events = {row.event for row in spec.transitions}
    branches = [branch for _s, _e, bs in spec.rows() for branch in bs]
    used = {
        "event": used_events,
        "guard": {b.guard for b in branches if b.guard is not None},
        "effect": {effect for b in branches for effect in b.effects},
        "reason": {b.reason for b in branches if b.reason is not None},
    }
    declared: dict[str, Collection[str]] = {
        "event": spec.events,
        "guard": spec.guards,
        "effect": spec.effects,
        "reason": spec.reasons,
    }
    return [
        Finding("unused", f"{kind} {name!r} is declared but no transition uses it")
        for kind, names in declared.items()
        for name in names
        if name not in used[kind]
    ]


def check_diagram(spec: LifecycleSpec) -> list[Finding]:
    findings: list[Finding] = []
    for kind, declared, groups in (
        ("state", spec.states, {p.name: p.states for p in spec.diagram.phases}),
        ("reason", spec.reasons, {f.name: f.reasons for f in spec.diagram.families}),
    ):
        group_kind = "phase" if kind == "state" else "family"
        homes: dict[str, list[str]] = {name: [] for name in declared}
        for group, members in groups.items():
            for name in members:
                if name not in homes:
                    findings.append(
                        Finding("diagram", f"{group_kind} {group!r} lists unknown {kind} {name!r}")
                    )
                else:
                    homes[name].append(group)
        for name, found in homes.items():
            if len(found) != 1:
                where = f"in {found}" if found else "in none"
                fix = f"list it under exactly one diagram {group_kind}"
                findings.append(Finding("diagram", f"{kind} {name!r} is {where}; {fix}"))
    return findings


def run_static_checks(
    spec: LifecycleSpec,
    guards: Collection[str] | None = None,
    effects: Collection[str] | None = None,
    counters: Collection[str] | None = None,
    groups: Collection[str] = (),
    exits: Collection[str] | None = None,
) -> list[Finding]:
    """Every static check; implementations are checked when their names are given."""
    findings: list[Finding] = []
    if guards is not None and effects is not None:
        findings += check_implementations(spec, guards, effects, counters, groups, exits)
    findings += check_reachability(spec)
    findings += check_termination(spec)
    findings += check_determinism(spec)
    findings += check_resource_balance(spec)
    findings += check_pure_revoke(spec)
    findings += check_terminal(spec)
    findings += check_unused(spec)
    findings += check_diagram(spec)
    return findings
