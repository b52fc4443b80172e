"""Two lifecycle specs side by side (``stagefate spec-diff A B``), as Markdown tables.

What differs between two designs written in the spec language: the states and what each holds;
every (state, event) row with its branches, in order (``guard → target (reason)``); the guards
each decides on; and what each counts (its counters and end reasons). A row or a name one spec
lacks shows as ``—``. Rows that are the same in both are kept, so the tables read as the two
lifecycles, not only as their difference; ``=`` marks a row both write alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from .schema import BranchSpec, LifecycleSpec

ABSENT = "—"


def title(spec: LifecycleSpec) -> str:
    design = spec.design
    return "stagefate" if design is None else design.name


def _branch(spec: LifecycleSpec, source: str, branch: BranchSpec) -> str:
    target = spec.target_of(source, branch)
    reason = f" ({branch.reason})" if branch.reason else ""
    return f"{branch.guard or 'else'} → {target}{reason}"


def _rows(spec: LifecycleSpec) -> dict[tuple[str, str], str]:
    return {
        (state, event): "; ".join(_branch(spec, state, branch) for branch in branches)
        for state, event, branches in spec.rows()
    }


Name = TypeVar("Name", str, tuple[str, str])


def _union(*names: Iterable[Name]) -> list[Name]:
    return list(dict.fromkeys(name for group in names for name in group))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _same(a: str, b: str) -> str:
    return "=" if a == b else ""


def spec_diff(a: LifecycleSpec, b: LifecycleSpec) -> str:
    """The Markdown page: ``a``'s column first, then ``b``'s."""
    names = [title(a), title(b)]
    out = [f"# {names[0]} | {names[1]}", ""]

    def holds(spec: LifecycleSpec, state: str) -> str:
        found = spec.states.get(state)
        if found is None:
            return ABSENT
        kept = ", ".join(f"{r} ({level})" for r, level in found.holds.items())
        return kept or ("terminal" if found.terminal else "nothing")

    out += ["## States (what each holds)", ""]
    out += _table(
        ["state", *names, ""],
        [
            [
                f"`{state}`",
                holds(a, state),
                holds(b, state),
                _same(holds(a, state), holds(b, state)),
            ]
            for state in _union(a.states, b.states)
        ],
    )

    def atomic(spec: LifecycleSpec) -> str:
        return "; ".join(" then ".join(pair) for pair in spec.atomic) or "none"

    out += [
        "",
        f"The issue fires `{a.issue_event}` | `{b.issue_event}`. Events one scheduler pass runs "
        f"back to back: {atomic(a)} | {atomic(b)}.",
    ]

    rows_a, rows_b = _rows(a), _rows(b)
    out += ["", "## Transitions (branches in order: guard → target (reason))", ""]
    out += _table(
        ["state", "event", *names, ""],
        [
            [
                f"`{state}`",
                event,
                rows_a.get((state, event), ABSENT),
                rows_b.get((state, event), ABSENT),
                _same(rows_a.get((state, event), ""), rows_b.get((state, event), "")),
            ]
            for state, event in _union(rows_a, rows_b)
        ],
    )

    sections: list[tuple[str, Callable[[LifecycleSpec], dict[str, str]]]] = [
        ("Guards (what each decides on)", lambda spec: spec.guards),
        ("What each counts: counters", lambda spec: spec.counters),
        ("What each counts: end reasons", lambda spec: spec.reasons),
    ]
    for heading, section_of in sections:
        of_a, of_b = section_of(a), section_of(b)
        out += ["", f"## {heading}", ""]
        out += _table(
            ["name", *names],
            [
                [f"`{name}`", of_a.get(name, ABSENT), of_b.get(name, ABSENT)]
                for name in _union(of_a, of_b)
            ],
        )
    return "\n".join(out) + "\n"
