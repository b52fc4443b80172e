"""The ``stagefate`` command line: one module per command, its flags beside its handler.

Exit status: 0 success; 1 a check failed (a violation, a stale diagram, a finding) or stagefate
itself failed (the traceback is printed: a bug to report, not a usage error); 2 bad usage (a flag
out of range, a file that is not there, a malformed spec or trace, a target not installed), with
a message that names the flag or the file and the fix; 130 interrupted (Ctrl-C: one line, the
workers stopped, no output left under its name). Refusals and failures go to standard error.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from ..runtime.mooncake import MooncakeUnavailable
from ..targets import TargetUnavailable
from . import bench, check, diagram, fuzz, replay, spec_diff, targets, trace, validate
from .common import Parser, console, errors, flagged

COMMANDS = (replay, fuzz, check, validate, diagram, spec_diff, bench, targets, trace)

INTERRUPTED = 130
"""The shell's status for a command stopped by SIGINT (128 + 2)."""
USAGE_ERRORS = (ValueError, OSError, TargetUnavailable, MooncakeUnavailable)
"""What bad input raises (a SpecError and a TraceError are ValueErrors): exit 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="stagefate", description="Staged KV-cache prefetch lifecycle: spec, checks, jobs."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
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
    with sglang_log_file():
        return _run(args)


@contextmanager
def sglang_log_file() -> Iterator[None]:
    """SGLang's own log lines, from every process of the command that runs SGLang, into one
    file named at the end (:mod:`stagefate.targets.sglang.logs`); the environment as it was
    after."""
    from ..targets.sglang.logs import LOG_ENV, lines_in, route_sglang_logs

    # a file of this run's own: one named by the pid alone may be an earlier process's
    made, name = tempfile.mkstemp(prefix=f"stagefate-sglang-{os.getpid()}-", suffix=".log")
    os.close(made)
    path = Path(name)
    before = os.environ.get(LOG_ENV)
    os.environ[LOG_ENV] = str(path)
    route_sglang_logs()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LOG_ENV, None)
        else:
            os.environ[LOG_ENV] = before
        logged = lines_in(path)
        if logged:
            console.print(f"SGLang's own log: {logged:,} lines in {path}", soft_wrap=True)
        else:
            path.unlink(missing_ok=True)  # SGLang said nothing: no file left behind


def _run(args: argparse.Namespace) -> int:
    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        flagged(
            "interrupted:",
            f"stagefate {args.command} stopped (Ctrl-C); what it would have written was not",
            errors,
        )
        return INTERRUPTED
    except USAGE_ERRORS as exc:
        flagged("error:", usage_message(exc), errors)
        return 2
    except Exception:  # stagefate's own failure: the whole story, for a bug report
        traceback.print_exc()
        flagged(
            "internal error",
            "(a bug in stagefate, not in how it was called): the traceback is above",
            errors,
        )
        return 1
    return result
