"""Imports go one way (docs/design.md, "Layout"): a walk of the package's import graph.

Every ``import`` and ``from … import`` in the package's modules counts, the ones inside
functions too (a lazy import is still a dependency), except those under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import stagefate

ROOT = Path(stagefate.__file__).parent
FACE = (
    "stagefate.cli",
    "stagefate.bench",
    "stagefate.registry",
    "stagefate.runner",
    "stagefate.targets",
)
"""The public face's packages (and the targets themselves): the only ones that may import
``stagefate.targets``."""
LAYERS = {
    "stagefate.spec": 0,
    "stagefate.runtime": 0,
    "stagefate.output_files": 0,
    "stagefate.statemachine": 1,
    "stagefate.transition_log": 1,
    "stagefate.metrics": 2,
    "stagefate.sim": 2,
    "stagefate.fuzz": 2,
    "stagefate.testing": 3,
    "stagefate.integrations": 3,
    "stagefate.targets": 4,
}
"""Nothing imports a module of a higher layer than its own; the rest of the package (the face:
``stagefate``, ``cli``, ``bench``, ``registry``) is above them all."""
PEERS = (("stagefate.sim", "stagefate.fuzz"),)
"""Packages of one layer that must not import each other either: the replay and the fuzzers
share only what lies below them."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def package_files() -> list[Path]:
    """Every module file of the package, through the links that put the top-level ``runtime``,
    ``spec`` and ``statemachine`` folders inside it (``Path.rglob`` does not follow them)."""
    return sorted(
        Path(folder) / name
        for folder, _dirs, files in os.walk(ROOT, followlinks=True)
        for name in files
        if name.endswith(".py")
    )


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, for every module of ``stagefate``
    (read once per session: the tests only read it)."""
    paths = package_files()
    names = {_module_name(path) for path in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_lines(tree)
        found: set[str] = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", 0) in skipped:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path.name == "__init__.py", node)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                while target and target not in names:
                    target = target.rpartition(".")[0]
                if target.startswith("stagefate") and target != module:
                    found.add(target)
        graph[module] = found
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path that closes on itself), or None. Package ``__init__``
    modules importing their own submodules are the package's face, not a cycle."""
    visiting: list[str] = []
    done: set[str] = set()

    def edges(module: str) -> set[str]:
        return {t for t in graph[module] if not t.startswith(module + ".")}

    def visit(module: str) -> list[str] | None:
        if module in visiting:
            return [*visiting[visiting.index(module) :], module]
        if module in done:
            return None
        visiting.append(module)
        for target in sorted(edges(module)):
            found = visit(target)
            if found:
                return found
        visiting.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module)
        if found:
            return found
    return None


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _layer(module: str) -> int:
    for prefix, layer in LAYERS.items():
        if _within(module, prefix):
            return layer
    return max(LAYERS.values()) + 1


def test_the_package_has_no_import_cycle() -> None:
    assert _cycle(import_graph()) is None, " -> ".join(_cycle(import_graph()) or [])


def test_only_the_face_imports_the_targets() -> None:
    offenders = {
        (module, target)
        for module, targets in import_graph().items()
        for target in targets
        if target.startswith("stagefate.targets")
        and not (module in FACE or module.startswith(tuple(f"{face}." for face in FACE)))
    }
    assert offenders == set(), f"below the face, these import targets: {sorted(offenders)}"


def test_nothing_imports_a_layer_above_it() -> None:
    offenders = {
        (module, target)
        for module, targets in import_graph().items()
        for target in targets
        if _layer(target) > _layer(module)
    }
    assert offenders == set(), sorted(offenders)


def test_peers_of_one_layer_do_not_import_each_other() -> None:
    offenders = {
        (module, target)
        for module, targets in import_graph().items()
        for target in targets
        for one, other in PEERS
        if (_within(module, one) and _within(target, other))
        or (_within(module, other) and _within(target, one))
    }
    assert offenders == set(), sorted(offenders)


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_engine_knows_only_the_policy_interface() -> None:
    """The scheduler model loads neither the pipeline nor any policy nor a target."""
    reached = _reach(import_graph(), "stagefate.sim.engine_model")
    assert "stagefate.statemachine.pipeline" not in reached
    assert not {t for t in reached if t.startswith(("stagefate.sim.", "stagefate.targets"))} - {
        "stagefate.sim.costs",
        "stagefate.sim.policy",
        "stagefate.sim.trace",
    }


def test_the_walk_sees_a_planted_cycle() -> None:
    graph = {
        "stagefate.a": {"stagefate.b"},
        "stagefate.b": {"stagefate.c"},
        "stagefate.c": {"stagefate.a"},
    }
    assert _cycle(graph) == ["stagefate.a", "stagefate.b", "stagefate.c", "stagefate.a"]


def test_only_an_engines_own_target_imports_its_integration() -> None:
    """``stagefate.integrations.vllm`` imports vLLM, ``…sglang`` SGLang: only that engine's
    target (which runs in its environment) and the integration itself may import one, never
    the face, the core or another engine's (what they share, ``integrations.settings``, any
    integration may)."""
    engines = {
        path.name for path in (ROOT / "integrations").iterdir() if (path / "__init__.py").is_file()
    }
    offenders = {
        module
        for module, targets in import_graph().items()
        for target in targets
        for engine in engines
        if _within(target, f"stagefate.integrations.{engine}")
        and not _within(module, f"stagefate.integrations.{engine}")
        and not _within(module, f"stagefate.targets.{engine}")
    }
    assert offenders == set(), f"these import an engine integration: {sorted(offenders)}"


ONE_CONCEPT_IN_SEVERAL_PLACES = {
    "books": "what must add up: L3 reads (statemachine) and SGLang's engine at idle (its target)",
    "findings": "SGLang's findings, run on the stand-in and through SGLang's engine",
    "fuzzer": "a stateful fuzzer: of stagefate's pipeline, and of SGLang's",
    "pipeline": "a buffer pipeline: stagefate's, and stagefate's as SGLang's",
    "policy": "a replay policy: the interface (sim) and SGLang's pipeline as one (its target)",
    "settings": "an integration's settings: the shared checks, SGLang's, vLLM's, the engine's",
    "tree": "a radix tree: stagefate's, SGLang's adapted, SGLang's built for its target",
}
"""Basenames several modules share because they are one concept in several places (why)."""
NAMED_FOR_WHAT_THEY_RUN = ("stagefate/cli/", "stagefate/bench/")
"""A command's module (``cli/replay.py``) or a benchmark's (``bench/replay.py``) is named for what
it runs, which lives under the same name elsewhere."""


def test_no_two_modules_share_a_basename_unless_they_are_one_concept() -> None:
    by_name: dict[str, list[str]] = {}
    for folder, _, files in sorted(os.walk(ROOT, followlinks=True)):  # spec/, runtime/: links
        for name in sorted(files):
            if name.endswith(".py") and name != "__init__.py":
                relative = os.path.relpath(Path(folder, name), ROOT.parent)
                by_name.setdefault(name.removesuffix(".py"), []).append(relative)
    shared = {}
    for name, places in by_name.items():
        named_elsewhere = [p for p in places if not p.startswith(NAMED_FOR_WHAT_THEY_RUN)]
        if len(named_elsewhere) > 1 and name not in ONE_CONCEPT_IN_SEVERAL_PLACES:
            shared[name] = places
    assert not shared, f"modules sharing a basename, each naming another concept: {shared}"
    assert set(ONE_CONCEPT_IN_SEVERAL_PLACES) <= {n for n, p in by_name.items() if len(p) > 1}
