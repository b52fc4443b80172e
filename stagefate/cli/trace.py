"""``stagefate trace synth``: a multi-turn trace in the Mooncake format, from a seed."""

from __future__ import annotations

import argparse
from typing import Any

from ..output_files import write_atomically
from ..sim.synth import SynthOptions
from .common import console, output_file


def add_parser(sub: Any) -> None:
    trace = sub.add_parser("trace", help="write traces: synth, a multi-turn one from a seed")
    actions = trace.add_subparsers(dest="action", required=True)
    synth = actions.add_parser(
        "synth",
        help="a multi-turn conversation trace in the Mooncake format (docs/replay.md)",
        description="Conversations with a shared system prompt; each turn's prompt is the last "
        "one's, its answer and a new message; a partial last block re-hashed per turn; think "
        "times between turns; Poisson conversation starts. Seeded: the same flags, the same file.",
    )
    synth.add_argument(
        "--out",
        required=True,
        type=output_file("the trace written", ".jsonl"),
        help="the .jsonl file to write",
    )
    for name, info in SynthOptions.model_fields.items():
        meaning = info.description or (info.annotation.__name__ if info.annotation else "")
        synth.add_argument(
            "--" + name.replace("_", "-"),
            type=info.annotation,  # pydantic checks the range, naming the flag's field
            default=info.default,
            help=f"{meaning} (default {info.default})" if meaning else f"default {info.default}",
        )
    synth.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..sim.conversations import infer_turns
    from ..sim.synth import as_read, synthesize, write_jsonl

    options = SynthOptions(**{name: getattr(args, name) for name in SynthOptions.model_fields})
    requests = synthesize(options)
    write_atomically(args.out, write_jsonl(requests))
    found = infer_turns(as_read(requests))
    follow_ups = sum(1 for request in requests if request.turn)
    console.print(
        f"wrote {args.out}: {len(requests):,} requests of {options.conversations:,} "
        f"conversations, {follow_ups:,} of them follow-ups; the turn rule finds "
        f"{len(found.predecessor):,} ({found.shared_prefixes:,} shared prefixes)",
        soft_wrap=True,
    )
    return 0
