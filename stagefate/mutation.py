"""The generated tests run under every mutant of the spec: do they fail where they should?

Each mutant of :func:`~stagefate.spec.mutants.mutants` runs the whole generated file
(tests/generated/test_edges.py) on pipelines that run the mutant's lifecycle (a
:class:`~stagefate.testing.LineWorld` given its spec); it is *killed* when some test fails.
:func:`~stagefate.spec.mutants.telling_programs` says which mutants change behaviour at all. The
score is the share of those the tests kill, and it must be all of them: a mutant that changes
behaviour and survives is reported with the program that tells it from the spec, written as a
generated test (it passes on the spec and fails on the mutant), ready to paste.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any

from .spec.generated_tests import ReplayedProgram, case_text, header
from .spec.model_world import Bounds
from .spec.mutants import Mutant, mutants, telling_programs
from .spec.schema import LifecycleSpec
from .spec.witnesses import ApiModelChecker, replayed
from .testing import LineWorld


@dataclass(frozen=True)
class Verdict:
    mutant: Mutant
    changes_behaviour: bool
    killed_by: str | None
    """The first generated test that failed under the mutant, and why (None: all passed)."""
    telling: ReplayedProgram | None
    """The shortest program that tells the mutant from the spec, replayed on the spec's model."""


@dataclass
class MutationReport:
    verdicts: list[Verdict] = field(default_factory=list)
    states: int = 0
    """States the exploration deciding which mutants change behaviour visited."""
    seconds: float = 0.0

    @property
    def changing(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.changes_behaviour]

    @property
    def survivors(self) -> list[Verdict]:
        """Mutants that change behaviour and that no generated test kills."""
        return [v for v in self.changing if v.killed_by is None]

    @property
    def score(self) -> str:
        killed = len(self.changing) - len(self.survivors)
        return f"{killed} of {len(self.changing)}"


@functools.lru_cache(maxsize=4)
def _compiled(source: str) -> CodeType:
    """A generated file compiled once, however many mutants run it."""
    return compile(source, "test_edges.py", "exec")


def load_tests(source: str) -> dict[str, Callable[[], None]]:
    """The test functions of a generated file's text, in its order."""
    namespace: dict[str, Any] = {"__name__": "stagefate_generated_tests"}
    exec(_compiled(source), namespace)
    return {name: test for name, test in namespace.items() if name.startswith("test_")}


def first_failure(source: str, spec: LifecycleSpec) -> str | None:
    """Run the generated file's tests with every LineWorld running ``spec``; the first failing
    test's name and error, or None when all pass."""
    tests = load_tests(source)
    world = functools.partial(LineWorld, spec=spec)
    for name, test in tests.items():
        test.__globals__["LineWorld"] = world
        try:
            test()
        except Exception as error:
            said = str(error).splitlines()
            return f"{name}: {type(error).__name__}" + (f": {said[0][:160]}" if said else "")
    return None


def run_mutants(
    spec: LifecycleSpec, generated: Path, bounds: Bounds | None = None
) -> MutationReport:
    """Every mutant of ``spec`` against the generated tests in ``generated`` (a file)."""
    started = time.perf_counter()
    bounds = bounds or Bounds()
    made = mutants(spec)
    telling = telling_programs(spec, made, bounds)
    source = generated.read_text(encoding="utf-8")
    model = ApiModelChecker(spec, bounds)
    report = MutationReport(states=telling.states)
    for number, mutant in enumerate(made):
        steps = telling.programs.get(number)
        program = None if steps is None else ReplayedProgram(steps, *replayed(model, steps))
        killed_by = first_failure(source, mutant.spec)
        report.verdicts.append(Verdict(mutant, steps is not None, killed_by, program))
    report.seconds = time.perf_counter() - started
    return report


def telling_test(verdict: Verdict, bounds: Bounds) -> str:
    """A surviving mutant's telling program as a pasteable generated test (imports included)."""
    assert verdict.telling is not None, "only a mutant that changes behaviour has a program"
    mutant = verdict.mutant
    name = f"test_tells_{mutant.kind}_of_row_{mutant.row}"
    about = (
        f"The spec, not the mutant where {mutant.what}: this program passes on the spec and "
        "fails on that mutant."
    )
    case = case_text(name, f"Mutant {mutant.kind}: {mutant.what}", about, verdict.telling)
    return f"{header(bounds)}\n\n{case}\n"
