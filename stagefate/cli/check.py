"""``stagefate check``: the spec's static checks, then the exhaustive model checker."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ..spec import load_spec, run_static_checks
from ..spec.load import DEFAULT_SPEC_PATH
from ..spec.modelcheck import Bounds
from ..spec.schema import LifecycleSpec
from .common import console, count, positive_int, report_unreached


def add_parser(sub: Any) -> None:
    check = sub.add_parser(
        "check", help="static checks of the lifecycle spec, then the exhaustive model checker"
    )
    check.add_argument("--spec", help="spec file (default: the shipped lifecycle.yaml)")
    check.add_argument("--static", action="store_true", help="static checks only")
    defaults = Bounds()
    for flag, default, kind, meaning in (
        ("--pages", defaults.pages, positive_int, "pages of the abstract token line"),
        ("--requests", defaults.requests, positive_int, "requests (request i wants pages - i)"),
        ("--host-pages", defaults.host_pages, count, "bounce capacity in pages"),
        ("--device-pages", defaults.device_pages, positive_int, "device pool capacity in pages"),
        ("--cap-pages", defaults.cap_pages, count, "anchor-pin cap in pages"),
        ("--threshold-pages", defaults.threshold_pages, count, "prefetch threshold in pages"),
        ("--issues", defaults.issues_per_request, positive_int, "prefetches per request"),
        ("--max-states", defaults.max_states, positive_int, "states explored at the most"),
    ):
        check.add_argument(
            flag, type=kind(meaning), default=default, help=f"model check: {meaning}"
        )
    check.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..statemachine.bindings import implemented_names

    if args.requests > args.pages:
        raise ValueError(
            f"--requests {args.requests} needs as many --pages (request i wants pages - i): "
            f"pass --pages {args.requests} or more"
        )
    spec_path = Path(args.spec) if args.spec else DEFAULT_SPEC_PATH
    spec = load_spec(spec_path)
    findings = run_static_checks(spec, *implemented_names())
    for finding in findings:
        console.print(f"[red]FAIL[/red] {finding}")
    if findings:
        console.print(f"{len(findings)} static finding(s) in {spec_path}")
        return 1
    console.print(
        f"static checks passed: {len(spec.states)} states, {len(spec.rows())} (state, event) rows, "
        f"{len(spec.guards)} guards, {len(spec.effects)} effects, all implemented"
    )
    return 0 if args.static else _model_check(spec, args)


def _model_check(spec: LifecycleSpec, args: argparse.Namespace) -> int:
    from ..spec.modelcheck import NOT_MODELLED_GUARDS, ModelChecker

    bounds = Bounds(
        pages=args.pages,
        requests=args.requests,
        host_pages=args.host_pages,
        device_pages=args.device_pages,
        cap_pages=args.cap_pages,
        threshold_pages=args.threshold_pages,
        issues_per_request=args.issues,
        max_states=args.max_states,
    )
    started = time.perf_counter()
    checker = ModelChecker(spec, bounds)
    result = checker.run()
    seconds = time.perf_counter() - started
    console.print(
        f"model check: {result.states:,} states explored in {seconds:.1f} s "
        f"({bounds.pages} pages, {bounds.requests} requests, host {bounds.host_pages}, device "
        f"{bounds.device_pages}, cap {bounds.cap_pages}, threshold {bounds.threshold_pages}, "
        f"{bounds.issues_per_request} issues each)"
    )
    if result.violation is not None:
        console.print(f"[red]VIOLATION[/red] {result.violation}", markup=True)
        console.print("shortest counterexample:")
        for number, step in enumerate(result.counterexample or [], start=1):
            console.print(f"  {number}. {step}", markup=False)
        return 1
    modelled = [
        e for e in ModelChecker(spec, bounds).all_edges() if e[2] not in NOT_MODELLED_GUARDS
    ]
    console.print(
        f"invariants hold in every state; {len(modelled) - len(result.unreached_edges)} of "
        f"{len(modelled)} modelled edges reached (not modelled: {sorted(NOT_MODELLED_GUARDS)})"
    )
    report_unreached(result.unreached_edges)
    for state in result.unreached_states:
        console.print(f"finding: state never reached: {state}", markup=False)
    if result.truncated:
        console.print(f"finding: stopped at --max-states {bounds.max_states:,}; raise it")
    return 1 if result.unreached_edges or result.unreached_states or result.truncated else 0
