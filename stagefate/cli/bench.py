"""``stagefate bench``: the benchmarks, each section written to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..bench.report import Section
from .common import console, output_file, positive_int

BENCHES = ("dispatch", "tree", "copy", "lifecycle", "replay", "storage", "tp", "vllm", "sglang")
NEEDS_INSTALL = ("vllm", "sglang")
"""Benchmarks of a target installed on demand: run when named, not by ``all``."""


def add_parser(sub: Any) -> None:
    bench = sub.add_parser("bench", help="run benchmarks, write docs/benchmarks.md")
    bench.add_argument("which", nargs="?", default="all", choices=["all", *BENCHES])
    bench.add_argument(
        "--report",
        default="docs/benchmarks.md",
        type=output_file("the report"),
        help="report file",
    )
    bench.add_argument("--trace", help="trace for the replay bench (default: the embedded slice)")
    bench.add_argument(
        "--limit",
        type=positive_int("requests of the embedded slice"),
        help="vllm, sglang: requests of the embedded slice sent to the engine (default 300 "
        "for vLLM, 200 for SGLang)",
    )
    bench.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where copy and lifecycle run (auto: cuda when a GPU is visible)",
    )
    bench.add_argument(
        "--peer",
        help="sglang, sglang==V, or several (comma-separated; `stagefate targets`): tree: also "
        "run each release's trees on the §9.1 workload; lifecycle: also its BufferModePipeline, "
        "alternated prefetch by prefetch; one table",
    )
    bench.set_defaults(func=run)


def _runners(
    trace: str | None = None,
    device: str = "auto",
    peer: str | None = None,
    limit: int | None = None,
) -> dict[str, Callable[[], list[Section]]]:
    import torch

    from ..bench import (
        copy,
        dispatch,
        lifecycle,
        replay,
        sglang,
        storage,
        tensor_parallel,
        tree,
        vllm,
    )

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return {
        "dispatch": lambda: [dispatch.run()],
        # today's shapes, then the §9.1 workload (side by side with a peer when asked)
        "tree": lambda: [tree.run(), tree.run_side_by_side(peer)],
        "copy": lambda: [copy.run(device)],
        "lifecycle": lambda: (
            [lifecycle.run(device)] + ([lifecycle.run_side_by_side(peer)] if peer else [])
        ),
        "replay": lambda: [replay.run(trace)],
        "storage": lambda: [storage.run()],
        "tp": lambda: [tensor_parallel.run()],
        "vllm": lambda: [vllm.run(limit or 300)],
        "sglang": lambda: [sglang.run(limit or 200)],
    }


def run(args: argparse.Namespace) -> int:
    import torch

    from ..bench.report import check_report, write_section

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no GPU here; use --device cpu or auto")
    for flag, given, used_by in (  # ("all" runs every bench but vllm and sglang)
        ("--peer", args.peer, ("tree", "lifecycle", "all")),
        ("--trace", args.trace, ("replay", "all")),
        ("--limit", args.limit, ("vllm", "sglang")),
    ):
        if given is not None and args.which not in used_by:
            benches = " or ".join(name for name in used_by if name != "all")
            raise ValueError(f"{flag} is for bench {benches}, not {args.which}: drop it")
    check_report(Path(args.report))  # a report it could not write is refused before the work
    runners = _runners(args.trace, args.device, args.peer, args.limit)
    assert set(runners) == set(BENCHES)
    names = (
        [name for name in runners if name not in NEEDS_INSTALL]
        if args.which == "all"
        else [args.which]
    )
    for name in names:
        console.print(f"running bench {name} …")
        for section in runners[name]():
            command = "stagefate bench " + " ".join(shlex.quote(a) for a in args.argv)
            write_section(section, command.strip(), Path(args.report))
            console.print(section.body)
    console.print(f"results written to {args.report}")
    return 0
