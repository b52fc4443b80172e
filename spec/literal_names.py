"""The spec's names as ``Literal`` types, written into :data:`NAMES_FILE` (``spec/names.py``).

The state, group, event, reason and counter names live in ``lifecycle.yaml``; code that names
one (a record's ``state``, ``try_lock_anchor``'s outcome) is typed with these, so ``mypy
--strict`` (its strict equality) rejects a misspelt ``record.state == "lockd"``. The file is
committed; ``python -m stagefate.spec.literal_names`` rewrites it, and a test fails while it is
not what the spec gives.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from .load import DEFAULT_SPEC_PATH, load_spec
from .schema import LifecycleSpec

NAMES_FILE = Path(__file__).with_name("names.py")
COMMAND = "python -m stagefate.spec.literal_names"
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
        _literal("ReasonName", "Every reason a record ends with.", list(spec.reasons)),
        _literal(
            "CounterName",
            "Every counter (the declared, then one per reason).",
            list(spec.all_counters),
        ),
    ]
    header = (
        f'"""Written by `{COMMAND}` from {source}:\nthe spec\'s names as types. Do not edit."""\n\n'
        "from __future__ import annotations\n\nfrom typing import Literal\n\n"
    )
    return header + "\n".join(parts)


if __name__ == "__main__":
    NAMES_FILE.write_text(render(load_spec(DEFAULT_SPEC_PATH)), encoding="utf-8")
    print(f"wrote {NAMES_FILE}")
