"""``stagefate validate``: a transition log checked against the spec, line by line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..spec import load_spec
from ..spec.load import DEFAULT_SPEC_PATH
from ..spec.schema import LifecycleSpec
from .common import console, flagged


def add_parser(sub: Any) -> None:
    validate = sub.add_parser(
        "validate", help="check a transition log (JSON lines) against the lifecycle spec"
    )
    validate.add_argument(
        "logs",
        nargs="+",
        metavar="log",
        help="the log: one transition a line (stagefate replay --log); several (one per "
        "tensor-parallel rank, replay --tp N --log): each checked, then all checked identical",
    )
    validate.add_argument("--spec", help="spec file (default: the shipped lifecycle.yaml)")
    validate.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..transition_log import first_difference

    spec = load_spec(Path(args.spec) if args.spec else DEFAULT_SPEC_PATH)
    paths = [Path(log) for log in args.logs]
    for path in paths:
        if path.is_dir():
            raise ValueError(f"transition log {path} is a folder; pass the log file in it")
        if path.exists() and not path.is_file():
            raise ValueError(
                f"transition log {path} is not a regular file (a pipe or a device: it is read "
                "twice to compare ranks); save it to a file and pass that"
            )
        if not path.is_file():
            raise ValueError(f"transition log {path} does not exist; write one with --log FILE")
        if not path.stat().st_size:
            raise ValueError(
                f"transition log {path} is empty: nothing to validate (did the run that wrote it "
                "fire any transition?); pass a log a run wrote with --log FILE"
            )
    for path in paths:
        if not _validate(path, spec):
            return 1
    if len(paths) > 1:
        for other in paths[1:]:
            difference = first_difference(paths[0], other)
            if difference is not None:
                flagged("OUT OF LOCKSTEP", f"{paths[0]} and {other} differ at {difference}")
                return 1
        console.print(
            f"the {len(paths)} ranks' logs are identical: every rank fired the same "
            "transitions in the same order",
            soft_wrap=True,
        )
    return 0


def _validate(path: Path, spec: LifecycleSpec) -> bool:
    from ..transition_log import validate_log

    try:
        with path.open(encoding="utf-8") as lines:
            summary = validate_log(lines, spec)
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}: not a text file ({error.reason}); pass a transition log"
        ) from None
    if summary.violation is not None:
        flagged("INVALID", f"{path}:{summary.violation}")
        return False
    if not summary.lines and not summary.closed:
        raise ValueError(
            f"transition log {path} holds no transition (blank lines only); pass a log a run "
            "wrote with --log FILE"
        )
    ended = ", ".join(f"{reason} {n:,}" for reason, n in summary.ended.most_common()) or "none"
    live = ", ".join(f"{state} {n:,}" for state, n in summary.live.most_common()) or "none"
    console.print(
        f"{path}: {summary.lines:,} transitions of {summary.records:,} records follow the spec; "
        f"{len(summary.edges)} of {len(spec.edges())} edges taken; ended: {ended}; "
        f"still live: {live}",
        soft_wrap=True,
    )
    if not summary.closed:
        flagged(
            "CUT SHORT",
            f"{path} has no closing record: the run that wrote it stopped before it finished "
            "(a crash, Ctrl-C, a server killed), so the records still live may never have "
            "ended; its lines follow the spec as far as they go",
        )
        return False
    return True
