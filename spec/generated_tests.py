"""A readable test per edge of the spec, written from the shortest program that takes it.

``stagefate check --emit-tests DIR`` writes :data:`FILE_NAME` there (tests/generated/ in this
repository, committed): for every modelled edge of the spec, in the spec's order, one pytest case
of plain calls on :class:`stagefate.testing.LineWorld` (the model checker's world made of real
objects), the steps of :func:`~.witnesses.shortest_witnesses`. After every step the case asserts
the state the model predicts (the device prefix, free bounce and pinned pages, each request's
state); at the end it lets every request go and asserts the pipeline quiescent (docs/design.md
§4). Each case names its edge in its name and docstring, so a failing edge reads as one short
program. CI regenerates the file and fails on any difference (``--diff``): a spec change shows
up as a diff of tests.
"""

from __future__ import annotations

import textwrap
from dataclasses import fields

from .modelcheck import NOT_MODELLED_GUARDS, Bounds, Step, World
from .schema import LifecycleSpec
from .witnesses import Witness, shortest_witnesses

FILE_NAME = "test_edges.py"
LINE = 100
"""The longest line written (the project's ruff line length)."""
COMMAND = "stagefate check --emit-tests tests/generated"


def test_name(witness: Witness) -> str:
    state, event, guard = witness.edge
    return f"test_{state}__{event}__{guard}"


def edge_of_test(name: str) -> tuple[str, str, str]:
    """The edge a generated test's name names (the inverse of :func:`test_name`)."""
    state, event, guard = name.removeprefix("test_").split("__")
    return state, event, guard


def _call(step: Step) -> str:
    kind, request, what = step.kind, step.request, step.what
    if kind == "world":
        return f"world.{what}()"
    if kind == "poll":
        return "world.poll()"
    if kind == "issue":
        return (
            f"world.issue({request}, stale=True)" if what == "stale" else f"world.issue({request})"
        )
    if kind in ("event", "live"):
        return f"world.{what}({request})"
    if what == "short":
        return f'world.complete({request}, "short", pages={step.pages})'
    return (
        f'world.complete({request}, "error")' if what == "error" else f"world.complete({request})"
    )


def _expect(world: World) -> str:
    pinned = sum(slot.record.pin_charge for slot in world.slots if slot.record is not None)
    states = ", ".join(
        f"r{i}={'None' if slot.record is None else repr(slot.record.state)}"
        for i, slot in enumerate(world.slots)
    )
    states = states.replace("'", '"')
    return _call_line(
        "world.expect",
        f"device={world.device}, host_free={world.host_free}, pinned={pinned}, {states}",
    )


def _call_line(function: str, arguments: str) -> str:
    """``function(arguments)`` at a test body's indent, wrapped as ``ruff format`` wraps it."""
    line = f"    {function}({arguments})"
    return line if len(line) <= LINE else f"    {function}(\n        {arguments}\n    )"


def _docstring(text: str) -> list[str]:
    return textwrap.wrap(text, LINE - 4, initial_indent="    ", subsequent_indent="    ")


def _case(spec: LifecycleSpec, witness: Witness) -> str:
    state, event, guard = witness.edge
    ends = f" ({witness.reason})" if witness.reason else ""
    when = "otherwise" if guard == "else" else f"{guard}: {spec.guards[guard]}"
    lines = [
        f"def {test_name(witness)}() -> None:",
        f'    """({state}) --{event}--> {witness.target}{ends}',
        "",
        *_docstring(f"when {when}"),
        '    """',
        "    world = LineWorld(BOUNDS)",
    ]
    for step, after in zip(witness.steps, witness.worlds, strict=True):
        lines += [f"    {_call(step)}", _expect(after)]
    lines.append("    world.finish()")
    return "\n".join(lines)


def render(
    spec: LifecycleSpec, bounds: Bounds | None = None, source: str = "spec/lifecycle.yaml"
) -> str:
    """The whole generated test file for ``spec`` (deterministic: same spec, same text);
    ``source`` names the spec in its header."""
    bounds = bounds or Bounds()
    witnesses = shortest_witnesses(spec, bounds)
    given = "".join(
        f"    {field.name}={getattr(bounds, field.name)},\n"
        for field in fields(bounds)
        if field.name != "max_states"
    )
    about = (
        "Do not edit: a spec change shows up here as a diff of tests. "
        f"One test per modelled edge of the spec ({len(witnesses)} of {len(spec.edges())}; not "
        f"modelled: the branches guarded by {', '.join(sorted(NOT_MODELLED_GUARDS))}), each the "
        "model checker's shortest program of public calls that takes it (spec/witnesses.py), on "
        "the model's world made of real objects (stagefate.testing.LineWorld). After every "
        "step: the state the model predicts. At the end: every request let go, the pipeline "
        "quiescent."
    )
    header = f'''"""Written by `{COMMAND}` from {source}.

{textwrap.fill(about, LINE)}
"""

from __future__ import annotations

from stagefate.spec.modelcheck import Bounds
from stagefate.testing import LineWorld

BOUNDS = Bounds(
{given})
'''
    cases = "\n\n\n".join(_case(spec, witness) for witness in witnesses)
    return f"{header}\n\n{cases}\n"
