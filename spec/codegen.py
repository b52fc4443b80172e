"""Code written from the spec: its names as ``Literal`` types, and the ``Stats`` model.

The state, group, event, reason and counter names live in ``lifecycle.yaml``; code that names
one (a record's ``state``, ``try_lock_anchor``'s outcome) is typed with these, so ``mypy
--strict`` (its strict equality) rejects a misspelt ``record.state == "lockd"``. ``Stats`` (a
pipeline's counters) has one field per counter the spec declares and one per reason, each with
the spec's words as its description. Both files are committed (mypy and a reader see them as
code); ``python -m stagefate.spec.codegen`` rewrites them, and a test fails while either is not
what the spec gives.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from .load import DEFAULT_SPEC_PATH, load_spec
from .schema import LifecycleSpec

NAMES_FILE = Path(__file__).with_name("names.py")
STATS_FILE = Path(__file__).parent.parent / "statemachine" / "stats.py"
COMMAND = "python -m stagefate.spec.codegen"
LINE = 100


def _literal(name: str, doc: str, values: list[str]) -> str:
    one_line = f"{name} = Literal[{', '.join(map(repr, values))}]".replace("'", '"')
    if len(one_line) <= LINE:
        body = one_line
    else:
        items = "".join(f'    "{value}",\n' for value in values)
        body = f"{name} = Literal[\n{items}]"
    return f'{body}\n"""{textwrap.fill(doc, LINE - 6)}"""\n'


def _camel(group: str) -> str:
    return "".join(part.capitalize() for part in group.split("_")) + "State"


def _header(source: str, what: str) -> str:
    return f'"""Written by `{COMMAND}` from {source}:\n{what}. Do not edit."""\n\n'


def render(spec: LifecycleSpec, source: str = "spec/lifecycle.yaml") -> str:
    """The whole of ``names.py`` for ``spec`` (same spec, same text)."""
    parts = [
        _literal("StateName", "Every state of the lifecycle.", list(spec.states)),
        _literal(
            "LiveStateName",
            "The states a record lives in (not terminal).",
            [name for name, state in spec.states.items() if not state.terminal],
        ),
        *(
            _literal(
                _camel(group),
                f"The ``{group}`` group: {spec.groups[group].doc}.",
                list(spec.groups[group].states),
            )
            for group in spec.groups
        ),
        _literal("EventName", "Every event.", list(spec.events)),
        _literal("ExitName", "Every exit (run on a move out of a group).", list(spec.exits)),
        _literal("ReasonName", "Every reason a record ends with.", list(spec.reasons)),
        _literal(
            "CounterName",
            "Every counter (the declared, then one per reason).",
            list(spec.all_counters),
        ),
    ]
    header = _header(source, "the spec's names as types") + (
        "from __future__ import annotations\n\nfrom typing import Literal\n\n"
    )
    return header + "\n".join(parts)


def _field(name: str, doc: str) -> str:
    text = textwrap.fill(" ".join(doc.split()), LINE - 10, break_on_hyphens=False)
    return f'    {name}: int = 0\n    """{text.replace(chr(10), chr(10) + "    ")}"""\n'


def render_stats(spec: LifecycleSpec, source: str = "spec/lifecycle.yaml") -> str:
    """The whole of ``statemachine/stats.py`` for ``spec``: a frozen model of every counter."""
    header = _header(source, "a pipeline's counters, one field per counter and per reason") + (
        "from __future__ import annotations\n\nfrom pydantic import BaseModel, ConfigDict\n\n\n"
        "class Stats(BaseModel):\n"
        '    """Outcome counters of a pipeline (a snapshot): the spec\'s counters, then one per\n'
        '    reason (each end counts itself)."""\n\n'
        "    model_config = ConfigDict("
        'frozen=True, extra="forbid", use_attribute_docstrings=True)\n\n'
        "    # counters\n"
    )
    counters = "".join(_field(name, doc) for name, doc in spec.counters.items())
    reasons = "".join(
        _field(name, f"records that ended {name}: {doc}") for name, doc in spec.reasons.items()
    )
    return header + counters + "    # ends, one per reason\n" + reasons


def write() -> list[Path]:
    """Rewrite both files from the shipped spec; returns their paths."""
    spec = load_spec(DEFAULT_SPEC_PATH)
    NAMES_FILE.write_text(render(spec), encoding="utf-8")
    STATS_FILE.write_text(render_stats(spec), encoding="utf-8")
    return [NAMES_FILE, STATS_FILE]


if __name__ == "__main__":
    for path in write():
        print(f"wrote {path}")
