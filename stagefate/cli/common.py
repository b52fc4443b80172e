"""What every command shares: the console, numeric flag types that refuse bad values before any
work starts, the report of spec edges never reached, and where the checkout and its spec are.

Printed to a terminal, the console wraps to its width; to a file or a pipe, nothing is wrapped
or cut (:data:`UNWRAPPED_WIDTH`). The console reads no markup: what it prints (a log's
``--hit [zero_pages]-->``, an install hint ``pip install 'stagefate[mooncake]'``, an exception's
text) comes out as written. A line that leads with a red label says so through
:func:`flagged`."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from ..spec.load import DEFAULT_SPEC_PATH

UNWRAPPED_WIDTH = 4096
"""The width printed to a file or a pipe: a table at its natural width, never cut to a
terminal's 80 columns (a sweep table piped to a file once lost its last columns)."""

console = Console(
    highlight=False, markup=False, width=None if sys.stdout.isatty() else UNWRAPPED_WIDTH
)
errors = Console(
    stderr=True,
    highlight=False,
    markup=False,
    width=None if sys.stderr.isatty() else UNWRAPPED_WIDTH,
)
"""Standard error: where a refusal or a failure of the command itself goes (a finding of a
check is the command's output, on :data:`console`)."""


def flagged(label: str, text: str, to: Console = console) -> None:
    """Print ``label`` in red, then ``text`` exactly as it is, unwrapped (one finding, one line
    to grep, whatever the terminal's width)."""
    to.print(Text.assemble((label, "red"), " ", text), soft_wrap=True)


def number(
    kind: type[int] | type[float], low: float, meaning: str, strict: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite ``kind`` of at least ``low`` (above it, when ``strict``). A
    bad value is refused before any work starts: argparse names the flag, exits 2, and this says
    why (``nan`` and ``inf`` parse as floats and compare false or pass every bound, so they are
    refused by name: a budget of ``nan`` never ended)."""
    noun = "a whole number" if kind is int else "a number"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes {noun} ({meaning}); got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"takes a finite number ({meaning}); got {text!r}")
        if value < low or (strict and value == low):
            bound = f"greater than {low:g}" if strict else f"at least {low:g}"
            raise argparse.ArgumentTypeError(f"must be {bound} ({meaning}); got {text}")
        return value

    return parse


def positive_int(meaning: str) -> Callable[[str], float]:
    return number(int, 1, meaning)


def count(meaning: str) -> Callable[[str], float]:
    """A whole number of at least 0."""
    return number(int, 0, meaning)


def positive(meaning: str) -> Callable[[str], float]:
    return number(float, 0, meaning, strict=True)


def output_file(meaning: str, suffix: str | None = None) -> Callable[[str], str]:
    """An argparse type for a file the command writes at its end: refused before any work if it
    is a folder, if its folder does not exist or cannot be written, or (``suffix``) if its name
    does not end in ``suffix`` (a run must not end in a bare ``[Errno …]`` after the work)."""

    def parse(text: str) -> str:
        path = Path(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(
                f"{text} is a folder; name a file in it ({meaning}), e.g. {path / 'out'}"
                f"{suffix or ''}"
            )
        if suffix is not None and path.suffix != suffix:
            raise argparse.ArgumentTypeError(
                f"must name a {suffix} file ({meaning}); got {text!r}, e.g. {text}{suffix}"
            )
        _writable_folder(path.parent, meaning)
        if path.exists() and not os.access(path, os.W_OK):
            raise argparse.ArgumentTypeError(
                f"{text} exists and is read-only ({meaning}); make it writable (chmod u+w) or "
                "name another file"
            )
        return text

    return parse


def output_folder(meaning: str) -> Callable[[str], str]:
    """An argparse type for a folder the command writes into (created if its parent exists)."""

    def parse(text: str) -> str:
        path = Path(text)
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a file; name a folder ({meaning})")
        _writable_folder(path if path.is_dir() else path.parent, meaning)
        return text

    return parse


def _writable_folder(folder: Path, meaning: str) -> None:
    where = folder if str(folder) else Path(".")
    if not where.is_dir():
        raise argparse.ArgumentTypeError(
            f"the folder {where} does not exist ({meaning}); create it first or name another"
        )
    if not os.access(where, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {where} ({meaning})")


def report_unreached(edges: Sequence[tuple[str, str, str]]) -> None:
    for state, event, guard in edges:
        console.print(f"finding: edge never reached: {state} --{event} [{guard}]-->")


def add_sglang_env(parser: Any, applies_to: str) -> None:
    """``--sglang-env KEY=VALUE`` (repeatable): one of SGLang's own knobs, for ``applies_to``."""
    parser.add_argument(
        "--sglang-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"{applies_to}: set one of SGLang's own knobs (repeatable), e.g. "
        "SGLANG_ENABLE_HICACHE_BUFFER_ANCHOR_LOCK=1",
    )


def parse_sglang_env(pairs: list[str]) -> dict[str, str]:
    """``--sglang-env KEY=VALUE`` pairs: SGLang's knobs, each named once."""
    knobs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"SGLANG_[A-Z0-9_]+", key):
            raise ValueError(
                f"--sglang-env {pair!r}: give one of SGLang's knobs as KEY=VALUE, the key an "
                "SGLANG_ variable in capitals (SGLANG_ENABLE_HICACHE_BUFFER_ANCHOR_LOCK=1)"
            )
        if key in knobs:
            raise ValueError(f"--sglang-env sets {key} twice; keep one")
        knobs[key] = value
    return knobs


def checkout_root() -> Path:
    """The top of the stagefate checkout this package was installed from (spec/ sits there)."""
    return DEFAULT_SPEC_PATH.resolve().parent.parent


def spec_source(spec_path: Path) -> str:
    """How a generated file (diagrams, edge tests) names the spec it came from: its path from
    the checkout's top when inside it, so the text does not depend on where one stands."""
    try:
        return str(spec_path.resolve().relative_to(checkout_root()))
    except ValueError:
        return str(spec_path)


_GIVEN = "_flags_given"
"""Where :class:`StoreOnce` keeps the flags a command line gave (dropped after parsing)."""


def _note_given(
    parser: argparse.ArgumentParser, namespace: argparse.Namespace, dest: str, shown: str
) -> None:
    given: dict[str, str] = namespace.__dict__.setdefault(_GIVEN, {})
    if dest in given:
        parser.error(
            f"{given[dest]} and {shown} both set {dest.replace('_', '-')}: one would silently "
            "win; give it once"
        )
    given[dest] = shown


class _GivenOnce(argparse.Action):
    """An action that refuses its flag (or its ``--no-`` twin) a second time on one line."""

    takes_value = True

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string is not None:
            shown = f"{option_string} {values}" if self.takes_value else option_string
            _note_given(parser, namespace, self.dest, shown)
        super().__call__(parser, namespace, values, option_string)


class _Store(argparse.Action):
    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, *_: Any) -> None:
        setattr(namespace, self.dest, values)


class StoreOnce(_GivenOnce, _Store):
    """``store``, refusing a flag given twice (``--speed 1 --speed 2`` once kept the last)."""


class OnOrOffOnce(_GivenOnce, argparse.BooleanOptionalAction):
    """``--x`` / ``--no-x``, refusing both (or either twice) on one command line."""

    takes_value = False


class Parser(argparse.ArgumentParser):
    """stagefate's argument parser: a plain value flag (``store``) may be given once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, StoreOnce)
        self.register("action", "store", StoreOnce)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        parsed = super().parse_args(args, namespace)
        vars(parsed).pop(_GIVEN, None)
        return parsed
