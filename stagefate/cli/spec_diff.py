"""``stagefate spec-diff A B``: two lifecycle specs side by side, as Markdown."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..output_files import write_atomically
from ..spec import load_spec
from ..spec.load import DEFAULT_SPEC_PATH
from ..spec.spec_diff import spec_diff
from .common import console, output_file


def add_parser(sub: Any) -> None:
    diff = sub.add_parser(
        "spec-diff",
        help="two lifecycle specs side by side: states, transitions, guards, what each counts",
    )
    diff.add_argument("a", help="a spec file (`stagefate` for the shipped lifecycle.yaml)")
    diff.add_argument("b", help="another (e.g. spec/designs/sglang-0.5.23.yaml)")
    diff.add_argument(
        "--out",
        type=output_file("the comparison"),
        help="write the Markdown to this file instead of printing it",
    )
    diff.set_defaults(func=run)


def _path(name: str) -> Path:
    return DEFAULT_SPEC_PATH if name == "stagefate" else Path(name)


def run(args: argparse.Namespace) -> int:
    page = spec_diff(load_spec(_path(args.a)), load_spec(_path(args.b)))
    if args.out:
        write_atomically(args.out, page)
        console.print(f"wrote {args.out}")
    else:
        console.print(page, soft_wrap=True)
    return 0
