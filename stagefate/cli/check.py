"""``stagefate check``: the spec's static checks, then the exhaustive model checker."""

from __future__ import annotations

import argparse
import difflib
import itertools
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..output_files import write_atomically
from ..spec import load_spec, run_static_checks
from ..spec.generated_tests import FILE_NAME
from ..spec.load import DEFAULT_SPEC_PATH
from ..spec.model_world import Bounds
from ..spec.modelcheck_ranks import RANK_BOUNDS
from ..spec.schema import LifecycleSpec
from .common import (
    console,
    count,
    flagged,
    output_folder,
    positive_int,
    report_unreached,
    spec_source,
)


def add_parser(sub: Any) -> None:
    check = sub.add_parser(
        "check", help="static checks of the lifecycle spec, then the exhaustive model checker"
    )
    check.add_argument("--spec", help="spec file (default: the shipped lifecycle.yaml)")
    check.add_argument("--static", action="store_true", help="static checks only")
    check.add_argument(
        "--ranks",
        type=positive_int("tensor-parallel ranks"),
        default=1,
        help="tensor-parallel ranks, each with its own L3 outcomes, agreed (default 1)",
    )
    check.add_argument(
        "--fuller-host",
        type=count("host pages the last rank lacks"),
        help="with --ranks: host pages the last rank's bounce pool lacks (default 1)",
    )
    check.add_argument(
        "--emit-tests",
        metavar="DIR",
        type=output_folder("the generated tests"),
        help="write a test per edge of the spec (the model checker's shortest program of public "
        f"calls for it) to DIR/{FILE_NAME} instead of model checking (tests/generated here)",
    )
    check.add_argument(
        "--diff",
        action="store_true",
        help="with --emit-tests: write nothing; exit 1, showing the difference, if DIR's tests "
        "are not what the spec generates",
    )
    check.add_argument(
        "--mutants",
        metavar="DIR",
        help=f"run DIR/{FILE_NAME} (the generated tests) under every mutant of the spec (swapped "
        "reasons, a dropped guard, a retargeted edge, two branches reordered) and report which "
        "it kills; exit 1, printing the program that tells it apart, if one that changes "
        "behaviour survives",
    )
    one, ranked = Bounds(), RANK_BOUNDS
    for field, flag, kind, meaning in _BOUND_FLAGS:
        single, several = getattr(one, field), getattr(ranked, field)
        defaults = f"{single}" if single == several else f"{single}; {several} with --ranks"
        check.add_argument(
            flag,
            type=kind(meaning),
            dest=field,
            metavar="N",
            help=f"model check: {meaning} (default {defaults})",
        )
    check.set_defaults(func=run)


_BOUND_FLAGS = (
    ("pages", "--pages", positive_int, "pages of the abstract token line"),
    ("requests", "--requests", positive_int, "requests (request i wants pages - i)"),
    ("host_pages", "--host-pages", count, "bounce capacity in pages"),
    ("device_pages", "--device-pages", positive_int, "device pool capacity in pages"),
    ("cap_pages", "--cap-pages", count, "anchor-pin cap in pages"),
    ("threshold_pages", "--threshold-pages", count, "prefetch threshold in pages"),
    ("issues_per_request", "--issues", positive_int, "prefetches per request"),
    ("max_states", "--max-states", positive_int, "states explored at the most"),
)
"""The model checker's bounds as flags: (Bounds field, flag, type, meaning)."""
MAX_PAGES = 64
"""The most --pages a model check takes: the checker explores every state, and at the default
5 pages × 3 requests that is already 2.4 M states in about a minute (huge page counts once ran
the machine out of memory)."""


def _check_flags(args: argparse.Namespace, bounds: Bounds) -> int:
    """Refuse flags that could not do what they say, before any work; the --fuller-host to
    use."""
    given = [flag for field, flag, _, _ in _BOUND_FLAGS if getattr(args, field) is not None]
    if args.static and (given or args.ranks > 1 or args.fuller_host is not None):
        extra = given + (["--ranks"] if args.ranks > 1 else [])
        extra += ["--fuller-host"] if args.fuller_host is not None else []
        raise ValueError(f"--static runs no model check: drop {', '.join(extra)} or --static")
    if args.fuller_host is not None and args.ranks == 1:
        raise ValueError("--fuller-host shapes the ranks' model check: add --ranks 2, or drop it")
    if bounds.pages > MAX_PAGES:
        raise ValueError(
            f"--pages {bounds.pages:,}: the model checker explores every state, and past "
            f"{MAX_PAGES} pages it cannot finish (5 pages take about a minute); pass fewer"
        )
    if bounds.requests > bounds.pages:
        raise ValueError(
            f"--requests {bounds.requests} needs as many --pages (request i wants pages - i): "
            f"pass --pages {bounds.requests} or more"
        )
    fuller_host = 1 if args.fuller_host is None else args.fuller_host
    if args.ranks > 1 and fuller_host > bounds.host_pages:
        raise ValueError(
            f"--fuller-host {fuller_host}: the last rank has only {bounds.host_pages} "
            f"host pages to lack; pass at most {bounds.host_pages} or raise --host-pages"
        )
    return fuller_host


def _bounds(args: argparse.Namespace) -> Bounds:
    """The bounds given, the rest from the defaults of one rank or of several."""
    base = RANK_BOUNDS if args.ranks > 1 else Bounds()
    given = {
        name: value
        for name in Bounds.__dataclass_fields__
        if (value := getattr(args, name, None)) is not None
    }
    return replace(base, **given)


def run(args: argparse.Namespace) -> int:
    from ..statemachine.bindings import implemented_names

    bounds = _bounds(args)
    fuller_host = _check_flags(args, bounds)
    spec_path = Path(args.spec) if args.spec else DEFAULT_SPEC_PATH
    spec = load_spec(spec_path)
    # another implementation's design has no bindings here: its code is its own
    findings = run_static_checks(spec, *(() if spec.design else implemented_names()))
    for finding in findings:
        flagged("FAIL", str(finding))
    if findings:
        console.print(f"{len(findings)} static finding(s) in {spec_path}")
        return 1
    bound = (
        "all implemented"
        if spec.design is None
        else f"the design of {spec.design.name}, whose implementation is its own"
    )
    console.print(
        f"static checks passed: {len(spec.states)} states, {len(spec.rows())} (state, event) rows, "
        f"{len(spec.guards)} guards, {len(spec.effects)} effects, {bound}"
    )
    if args.emit_tests:
        return _emit_tests(spec, bounds, spec_source(spec_path), Path(args.emit_tests), args.diff)
    if args.diff:
        raise ValueError("--diff compares generated tests: pass --emit-tests DIR with it")
    if args.mutants:
        return _mutants(spec, bounds, Path(args.mutants) / FILE_NAME)
    return 0 if args.static else _model_check(spec, spec_path, bounds, args.ranks, fuller_host)


def _emit_tests(spec: LifecycleSpec, bounds: Bounds, source: str, out: Path, diff: bool) -> int:
    from ..spec.generated_tests import COMMAND, render

    started = time.perf_counter()
    text = render(spec, bounds, source)
    path = out / FILE_NAME
    cases = text.count("\ndef test_")
    overlaps = len(re.findall(r"^def test_\w+__also__\w+\(", text, re.MULTILINE))
    took = (
        f"{cases - overlaps} edge tests and {overlaps} overlap tests from the shortest programs "
        f"in {time.perf_counter() - started:.0f} s"
    )
    if not diff:
        out.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text)
        console.print(f"wrote {path}: {took}")
        return 0
    committed = path.read_text() if path.is_file() else ""
    if committed == text:
        console.print(f"{path} is what the spec generates ({took})")
        return 0
    lines = difflib.unified_diff(
        committed.splitlines(), text.splitlines(), str(path), "generated", lineterm="", n=1
    )
    for line in itertools.islice(lines, 80):
        console.print(line)
    flagged("STALE", f"{path}: run `{COMMAND}` and commit it")
    return 1


def _print_program(spec: LifecycleSpec, spec_path: Path, bounds: Bounds) -> None:
    """The shortest program of public calls that breaks an invariant, as a pytest file."""
    from ..spec.generated_tests import counterexample_test
    from ..spec.witnesses import api_counterexample

    found = api_counterexample(spec, bounds)
    if found is None:
        console.print(
            "no program of public calls breaks it within the bounds: the counterexample needs "
            "an IO commit apart from its completion's poll, which the API never runs"
        )
        return
    steps, violation = found
    console.print(
        f"\nas a program of public calls ({len(steps)} steps), a test file that runs as it is:\n"
    )
    program = counterexample_test(spec, str(spec_path), bounds, steps, str(violation))
    console.print(program, markup=False, highlight=False, soft_wrap=True)


def _mutants(spec: LifecycleSpec, bounds: Bounds, generated: Path) -> int:
    from ..mutation import run_mutants, telling_test

    if not generated.is_file():
        raise ValueError(
            f"{generated} does not exist: write the generated tests first "
            f"(stagefate check --emit-tests {generated.parent})"
        )
    report = run_mutants(spec, generated, bounds)
    for verdict in report.verdicts:
        if not verdict.changes_behaviour:
            flagged("SAME", f"{verdict.mutant.what} (no program within the bounds tells it)")
        elif verdict.killed_by is None:
            flagged("SURVIVED", verdict.mutant.what)
    console.print(
        f"{len(report.verdicts)} mutants, {len(report.changing)} change behaviour "
        f"({report.states:,} states explored); the generated tests kill {report.score} mutants "
        f"that change behaviour ({report.seconds:.0f} s)"
    )
    for verdict in report.survivors:
        console.print(f"\nA test that kills {verdict.mutant.what}:\n")
        console.print(telling_test(verdict, bounds), markup=False, highlight=False)
    return 1 if report.survivors else 0


def _model_check(
    spec: LifecycleSpec, spec_path: Path, bounds: Bounds, ranks: int, fuller_host: int
) -> int:
    from ..spec.model_world import NOT_MODELLED_GUARDS
    from ..spec.modelcheck import ModelChecker
    from ..spec.modelcheck_ranks import RankModelChecker

    started = time.perf_counter()
    if ranks > 1:
        result = RankModelChecker(spec, bounds, ranks, fuller_host).run()
        world = f"{ranks} ranks, L3 per rank, the last rank's host pool {fuller_host} smaller; "
    else:
        result = ModelChecker(spec, bounds).run()
        world = ""
    seconds = time.perf_counter() - started
    console.print(
        f"model check: {result.states:,} states explored in {seconds:.1f} s "
        f"({world}{bounds.pages} pages, {bounds.requests} requests, host {bounds.host_pages}, "
        f"device {bounds.device_pages}, cap {bounds.cap_pages}, threshold "
        f"{bounds.threshold_pages}, {bounds.issues_per_request} issues each)"
    )
    known = {k.invariant: k.finding for k in spec.design.known_findings} if spec.design else {}
    if result.violation is not None:
        finding = known.pop(result.invariant or "", None)
        flagged("KNOWN" if finding else "VIOLATION", str(result.violation))
        console.print("shortest counterexample:")
        for number, step in enumerate(result.counterexample or [], start=1):
            console.print(f"  {number}. {step}")
        if finding is None:
            if ranks == 1:
                _print_program(spec, spec_path, bounds)
            return 1
        console.print(
            f"the design's known finding, reproduced: {finding!r} (docs/sglang-findings.md)"
        )
    for invariant, finding in known.items():
        flagged(
            "NOT FOUND",
            f"the design lists {finding!r} as breaking {invariant!r}, and the model checker "
            "no longer finds it: correct the design, or drop the finding from it",
        )
    if known:
        return 1
    modelled = [
        e for e in ModelChecker(spec, bounds).all_edges() if e[2] not in NOT_MODELLED_GUARDS
    ]
    checked = "invariants hold" if ranks == 1 else "every rank's invariants and lockstep hold"
    if result.violation is not None:
        checked = "every other invariant holds"
    console.print(
        f"{checked} in every state; {len(modelled) - len(result.unreached_edges)} of "
        f"{len(modelled)} modelled edges reached (not modelled: {sorted(NOT_MODELLED_GUARDS)})"
    )
    report_unreached(result.unreached_edges)
    for state in result.unreached_states:
        console.print(f"finding: state never reached: {state}")
    if result.truncated:
        console.print(f"finding: stopped at --max-states {bounds.max_states:,}; raise it")
    defaults = RANK_BOUNDS if ranks > 1 else Bounds()
    smaller = [
        flag
        for field, flag, _, _ in _BOUND_FLAGS
        if getattr(bounds, field) < getattr(defaults, field)
    ]
    if (result.unreached_edges or result.unreached_states) and smaller:
        console.print(
            f"hint: {', '.join(smaller)} below the defaults leave a world too small for some "
            "edges (at the defaults every modelled edge is reached): raise them to check those"
        )
    return 1 if result.unreached_edges or result.unreached_states or result.truncated else 0
