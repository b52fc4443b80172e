"""No lifecycle state is tested by its name as a string outside the spec (issue 42): code asks
the spec's groups (``record.state in spec.group("spliced")``), a branch's outcome
(``outcome.ended``), or its own books (``request_id in self._parked``), so renaming or
regrouping a state in ``spec/lifecycle.yaml`` cannot leave a comparison behind.

The scan reads every module of the package (the repo-root ``spec``, ``statemachine`` and
``runtime`` it links in included) and reports each comparison (``==``, ``!=``, ``in``,
``not in``) with a string constant that names a state of the lifecycle. One place speaks
another lifecycle's vocabulary and is left out:
``targets/sglang/design_log`` writes the transitions of SGLang's designs (spec/designs/*.yaml,
whose states share names with ours; every log is validated against its design's spec);
:data:`OTHER_VOCABULARIES` holds it, with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stagefate
from stagefate.spec import load_spec

PACKAGE = Path(stagefate.__file__).resolve().parent
OTHER_VOCABULARIES = {
    "targets/sglang/design_log": "the designs' transitions, validated against their specs",
}


def _modules() -> list[tuple[str, Path]]:
    """``(name under the package, path)`` of every module, linked directories followed."""
    found = []
    for top in sorted(PACKAGE.iterdir()):
        if top.suffix == ".py":
            found.append((top.name, top))
        elif top.is_dir():
            root = top.resolve()
            found += [(f"{top.name}/{p.relative_to(root)}", p) for p in sorted(root.rglob("*.py"))]
    return found


def _string_constants(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [value for element in node.elts for value in _string_constants(element)]
    return []


def state_names_compared(source: str, states: frozenset[str]) -> list[str]:
    """``line: comparison`` for each comparison in ``source`` with a state's name as a string."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            names = [
                value
                for side in (node.left, *node.comparators)
                for value in _string_constants(side)
            ]
            if states.intersection(names):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_a_state_name_compared_as_a_string() -> None:
    states = frozenset(load_spec().states)
    source = 'if record.state == "consumed" or state in ("locked", "x"):\n    pass\n'
    assert state_names_compared(source, states) == [
        "1: record.state == 'consumed'",
        "1: state in ('locked', 'x')",
    ]
    assert state_names_compared("if record.state in spliced:\n    pass\n", states) == []


def test_no_module_compares_a_lifecycle_state_by_its_name() -> None:
    states = frozenset(load_spec().states)
    modules = _modules()
    assert any(name == "statemachine/pipeline.py" for name, _ in modules)  # linked dirs read
    offences = [
        f"{name}:{found}"
        for name, path in modules
        if not any(name.startswith(prefix) for prefix in OTHER_VOCABULARIES)
        for found in state_names_compared(path.read_text(encoding="utf-8"), states)
    ]
    assert offences == [], (
        "compare with the spec's groups (spec.group(...)), an Outcome's `ended`, or your own "
        "books instead of a state's name:\n" + "\n".join(offences)
    )
