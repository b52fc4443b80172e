"""``stagefate diagram``: the lifecycle's Mermaid and SVG diagrams, written from the spec."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..extras import DRAWING_TOOLS, refused_without
from ..spec import load_spec
from ..spec.diagram import spec_digest, stale_diagrams, write_diagrams
from ..spec.load import DEFAULT_SPEC_PATH
from .common import checkout_root, console, flagged, output_folder, spec_source


def add_parser(sub: Any) -> None:
    diagram = sub.add_parser("diagram", help="regenerate docs/lifecycle.md and .svg from the spec")
    diagram.add_argument("--spec", help="spec file (default: the shipped lifecycle.yaml)")
    diagram.add_argument(
        "--out",
        type=output_folder("the diagrams"),
        help="output folder (default: the docs/ of the stagefate checkout you run it in; "
        "docs/designs/NAME/ for spec/designs/NAME.yaml)",
    )
    diagram.add_argument("--check", action="store_true", help="exit 1 if the folder is stale")
    diagram.set_defaults(func=run)


def checkout_docs(cwd: Path | None = None) -> Path:
    """The ``docs/`` of the stagefate checkout ``cwd`` is inside (the one this package was
    installed from, editable); refused elsewhere, so nothing is written into a stranger's
    ``./docs``."""
    root = checkout_root()
    here = (cwd or Path.cwd()).resolve()
    inside = here == root or root in here.parents
    if not inside or not (root / "docs").is_dir() or not (root / "pyproject.toml").is_file():
        raise ValueError(
            f"stagefate diagram writes the docs of a stagefate checkout; {here} is not inside "
            f"one: pass --out DIR (a folder for lifecycle.md and the SVGs)"
        )
    return root / "docs"


def _default_out(spec_path: Path) -> Path:
    """docs/ for stagefate's spec; docs/designs/NAME/ for a design in spec/designs/."""
    docs = checkout_docs()
    if spec_path.resolve().parent == DEFAULT_SPEC_PATH.resolve().parent / "designs":
        return docs / "designs" / spec_path.stem
    return docs


def run(args: argparse.Namespace) -> int:
    graphviz = "with Graphviz's library and headers installed"
    if refused_without(DRAWING_TOOLS, "stagefate diagram draws with Graphviz and", graphviz):
        return 2
    spec_path = Path(args.spec) if args.spec else DEFAULT_SPEC_PATH
    spec = load_spec(spec_path)
    digest = spec_digest(spec_path)
    source = spec_source(spec_path)
    out = Path(args.out) if args.out else _default_out(spec_path)
    if args.check:
        problems = stale_diagrams(spec, out, digest, source)
        again = "stagefate diagram" + (f" --spec {args.spec} --out {out}" if args.spec else "")
        for problem in problems:
            flagged("STALE", f"{problem}; run `{again}` and commit {out}")
        return 1 if problems else 0
    for path in write_diagrams(spec, out, digest, source):
        console.print(f"wrote {path}")
    return 0
