"""The ``stagefate`` command line: one module per command, its flags beside its handler.

Exit status: 0 success; 1 a check failed (a violation, a stale diagram, a finding) or stagefate
itself failed (the traceback is printed: a bug to report, not a usage error); 2 bad usage (a flag
out of range, a file that is not there, a malformed spec or trace, a target not installed), with
a message that names the flag or the file and the fix.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from pydantic import ValidationError

from ..runtime.mooncake import MooncakeUnavailable
from ..targets import TargetUnavailable
from . import bench, check, diagram, fuzz, replay, spec_diff, targets, trace, validate
from .common import flagged

COMMANDS = (replay, fuzz, check, validate, diagram, spec_diff, bench, targets, trace)

USAGE_ERRORS = (ValueError, OSError, TargetUnavailable, MooncakeUnavailable)
"""What bad input raises (a SpecError and a TraceError are ValueErrors): exit 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stagefate", description="Staged KV-cache prefetch lifecycle: spec, checks, jobs."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def usage_message(error: BaseException) -> str:
    """``error`` for a person: pydantic's field errors without its URLs and boilerplate."""
    if isinstance(error, ValidationError):
        fields = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'value'}: "
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in error.errors()
        )
        return f"invalid {error.title}: {fields}"
    return str(error)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (see the module's docstring)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(args_list)
    args.argv = args_list[1:]
    try:
        result: int = args.func(args)
    except USAGE_ERRORS as exc:
        flagged("error:", usage_message(exc))
        return 2
    except Exception:  # stagefate's own failure: the whole story, for a bug report
        traceback.print_exc()
        flagged(
            "internal error",
            "(a bug in stagefate, not in how it was called): the traceback is above",
        )
        return 1
    return result
