"""A readable test per edge of the spec, written from the shortest program that takes it.

``stagefate check --emit-tests DIR`` writes :data:`FILE_NAME` there (tests/generated/ in this
repository, committed): for every modelled edge of the spec, in the spec's order, one pytest case
of plain calls on :class:`stagefate.testing.LineWorld` (the model checker's world made of real
objects), the steps of :func:`~.witnesses.shortest_witnesses`. After every step the case asserts
the state the model predicts (the device prefix, free bounce and pinned pages, each request's
state) and the transitions the step fired, read from the pipeline's transition log (request,
source, event, branch, target, reason: two edges that end alike still differ there); at the end
it lets every request go and asserts the pipeline quiescent (docs/design.md §4). Each case names
its edge in its name and docstring, so a failing edge reads as one short program; an overlap's
case (``..__also__<guard>``) takes the edge while the next branch's guard holds too, so the
order of the two branches is tested as well. CI regenerates the file and fails on any difference
(``--diff``): a spec change shows up as a diff of tests.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, fields
from typing import Protocol

from .model_world import NOT_MODELLED_GUARDS, Bounds, Edge, Fired, Step, Violation, World
from .schema import LifecycleSpec
from .witnesses import ALSO, ApiModelChecker, Witness, replayed, shortest_witnesses

FILE_NAME = "test_edges.py"
LINE = 100
"""The longest line written (the project's ruff line length)."""
COMMAND = "stagefate check --emit-tests tests/generated"


class Program(Protocol):
    """Steps of public calls, the model's world after each and the transitions each fired."""

    @property
    def steps(self) -> list[Step]: ...

    @property
    def worlds(self) -> list[World]: ...

    @property
    def fired(self) -> list[list[Fired]]: ...


def test_name(witness: Witness) -> str:
    state, event, guard = witness.edge
    also = "" if witness.also is None else f"{ALSO}{witness.also}"
    return f"test_{state}__{event}__{guard}{also}"


def edge_of_test(name: str) -> tuple[Edge, str | None]:
    """The edge a generated test's name names, and the guard that held too in an overlap's
    (None otherwise): the inverse of :func:`test_name`."""
    edge, _, also = name.removeprefix("test_").partition(ALSO)
    state, event, guard = edge.split("__")
    return (state, event, guard), also or None


def _call(step: Step) -> str:
    kind, request, what = step.kind, step.request, step.what
    if kind == "world":
        return f"world.{what}()"
    slow = ["loads_slower=True"] if step.slower else []
    if kind == "poll":
        return f"world.poll({', '.join(slow)})"
    if kind == "issue":
        stale = ["stale=True"] if what == "stale" else []
        return f"world.issue({', '.join([str(request), *stale, *slow])})"
    if kind in ("event", "live"):
        return f"world.{what}({', '.join([str(request), *slow])})"
    mode = {"short": ['"short"', f"pages={step.pages}"], "error": ['"error"']}.get(what, [])
    return f"world.complete({', '.join([str(request), *mode, *slow])})"


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


def _fired(transitions: list[Fired]) -> str:
    texts = [f'"{transition.text()}"' for transition in transitions]
    line = f"    world.fired({', '.join(texts)})"
    if len(line) <= LINE:
        return line
    return "\n".join(["    world.fired(", *[_argument(text) for text in texts], "    )"])


def _argument(literal: str, indent: str = "        ") -> str:
    """A string literal as one argument line, or two lines of one concatenated literal (at a
    space) where one would be longer than :data:`LINE`."""
    line = f"{indent}{literal},"
    if len(line) <= LINE:
        return line
    cut = literal.rindex(" ", 0, LINE - len(indent) - 1)
    return f'{indent}{literal[:cut]}"\n{indent}"{literal[cut:]},'


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
    if witness.also is not None:
        when += f"; while {witness.also} held too: {spec.guards[witness.also]}"
    title = f"({state}) --{event}--> {witness.target}{ends}"
    return case_text(test_name(witness), title, f"when {when}", witness)


def case_text(
    name: str, title: str, about: str, program: Program, world: str = "LineWorld(BOUNDS)"
) -> str:
    """A test ``name`` running ``program`` on ``world`` (a :class:`~stagefate.testing.LineWorld`
    built from the module's ``BOUNDS``), asserting the model's world and transitions after each
    step, then quiescence; ``title`` and ``about`` make its docstring."""
    lines = [
        f"def {name}() -> None:",
        f'    """{title}',
        "",
        *_docstring(about),
        '    """',
        f"    world = {world}",
    ]
    for number, step in enumerate(program.steps):
        lines.append(f"    {_call(step)}")
        if number < len(program.worlds):
            lines += [_expect(program.worlds[number]), _fired(program.fired[number])]
    lines.append("    world.finish()")
    return "\n".join(lines)


def counterexample_test(
    spec: LifecycleSpec, spec_file: str, bounds: Bounds, steps: list[Step], broke: str
) -> str:
    """A model checker's counterexample at the API's granularity as a pytest file that runs
    as it is: each step and what the model predicts after it, up to the step that broke
    ``broke`` (an invariant, as the checker worded it), then quiescence, which a leak or a
    double release fails; the pipeline runs ``spec_file`` (where ``spec`` was read)."""
    model = ApiModelChecker(spec, bounds)
    done = len(steps) - 1
    try:
        worlds, fired = replayed(model, steps)
        done = len(steps)
    except Violation:  # the last step itself could not run
        worlds, fired = replayed(model, steps[:done])
    program = ReplayedProgram(steps, worlds[:done], fired[:done])
    about = f"The model checker's shortest program of public calls that breaks it: {broke}"
    world = f"LineWorld(BOUNDS, spec=load_spec({spec_file!r}))"
    case = case_text("test_counterexample", "The spec breaks an invariant.", about, program, world)
    return f"{header(bounds, loads_spec=True)}\n\n{case}\n"


@dataclass(frozen=True)
class ReplayedProgram:
    """A :class:`Program` replayed on the model outside a witness (a counterexample, a mutant's
    telling program); ``worlds`` and ``fired`` may stop a step short of ``steps``."""

    steps: list[Step]
    worlds: list[World]
    fired: list[list[Fired]]


def header(bounds: Bounds, loads_spec: bool = False) -> str:
    """The imports and ``BOUNDS`` a generated case runs with (``loads_spec``: and
    ``load_spec``, for a case whose LineWorld runs a spec file)."""
    given = "".join(
        f"    {field.name}={getattr(bounds, field.name)},\n"
        for field in fields(bounds)
        if field.name != "max_states"
    )
    load = "from stagefate.spec import load_spec\n" if loads_spec else ""
    return f"""from __future__ import annotations

{load}from stagefate.spec.model_world import Bounds
from stagefate.testing import LineWorld

BOUNDS = Bounds(
{given})
"""


def render(
    spec: LifecycleSpec, bounds: Bounds | None = None, source: str = "spec/lifecycle.yaml"
) -> str:
    """The whole generated test file for ``spec`` (deterministic: same spec, same text);
    ``source`` names the spec in its header."""
    bounds = bounds or Bounds()
    witnesses = shortest_witnesses(spec, bounds)
    edges = sum(witness.also is None for witness in witnesses)
    about = (
        "Do not edit: a spec change shows up here as a diff of tests. "
        f"One test per modelled edge of the spec ({edges} of {len(spec.edges())}; not "
        f"modelled: the branches guarded by {', '.join(sorted(NOT_MODELLED_GUARDS))}), and one "
        f"per overlap of two neighbouring guards a program can meet ({len(witnesses) - edges}, "
        "named ..__also__<guard>), each the model checker's shortest program of public calls "
        "that takes it (spec/witnesses.py), on the model's world made of real objects "
        "(stagefate.testing.LineWorld). After every step: the state the model predicts and the "
        "transitions the step fired. At the end: every request let go, the pipeline quiescent."
    )
    docstring = f'''"""Written by `{COMMAND}` from {source}.

{textwrap.fill(about, LINE)}
"""
'''
    cases = "\n\n\n".join(_case(spec, witness) for witness in witnesses)
    return f"{docstring}\n{header(bounds)}\n\n{cases}\n"
