"""Lifecycle diagrams generated from the spec: Mermaid in Markdown, and SVG through Graphviz.

Two levels, both from the spec's ``diagram`` section: an overview (states clustered by phase,
one edge per (from, to) labelled by its events, the terminal state drawn once per family of
end reasons) that fits one page, and one diagram per phase with every guard and effect.

The output is deterministic (spec order, no timestamps), so ``stagefate diagram --check`` can
compare the committed docs byte for byte with what the spec generates now.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .load import DEFAULT_SPEC_PATH
from .schema import SAME, BranchSpec, LifecycleSpec, PhaseSpec

MARKDOWN_NAME = "lifecycle.md"
SVG_NAME = "lifecycle.svg"
"""The overview; each phase with exits gets ``lifecycle-<phase>.svg`` beside it."""


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    label: str


def spec_digest(path: Path = DEFAULT_SPEC_PATH) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _slug(name: str) -> str:
    return "-".join(name.lower().split())


def _node_id(name: str) -> str:
    """A Mermaid-safe id for a state, a phase or an end (prefixed: ``end`` is a keyword)."""
    return "n_" + "".join(c if c.isalnum() else "_" for c in name)


def branch_label(event: str, branch: BranchSpec) -> str:
    """``event [guard] / effects``: one branch as a phase diagram labels it (the reason is its
    target, drawn per reason)."""
    label = f"{event} [{branch.guard or 'else'}]"
    if branch.effects:
        label += " / " + ", ".join(branch.effects)
    return label


def end_node(spec: LifecycleSpec, branch: BranchSpec) -> str:
    """Where the overview draws a branch into a terminal state: its reason's family."""
    assert branch.reason is not None
    return f"released: {spec.diagram.family_of(branch.reason)}"


def overview_edges(spec: LifecycleSpec) -> list[Edge]:
    """The overview's arrows, labelled by their events, self-loops left to the phase diagrams.

    A terminal target is drawn as its reason's family. When two or more states of one phase
    lead to the same target outside it, one arrow leaves the phase itself (its source is the
    phase's name), so the page shows how a phase ends rather than every state's copy of it.
    """
    merged: dict[tuple[str, str], list[str]] = {}
    for source, event, branches in spec.rows():
        for branch in branches:
            target = spec.target_of(source, branch)
            if target == source:
                continue
            if spec.states[target].terminal:
                target = end_node(spec, branch)
            events = merged.setdefault((source, target), [])
            if event not in events:
                events.append(event)
    by_phase: dict[tuple[str, str], list[str]] = {}
    for source, target in merged:
        phase = spec.diagram.phase_of(source)
        if target in spec.states and spec.diagram.phase_of(target) == phase:
            continue  # inside a phase: drawn state to state
        by_phase.setdefault((phase, target), []).append(source)
    result = []
    done: set[tuple[str, str]] = set()
    for (source, target), events in merged.items():
        phase = spec.diagram.phase_of(source)
        sources = by_phase.get((phase, target), [source])
        if len(sources) < 2:
            result.append(Edge(source, target, ", ".join(events)))
        elif (phase, target) not in done:
            done.add((phase, target))
            union: list[str] = []
            for member in sources:
                union += [e for e in merged[(member, target)] if e not in union]
            result.append(Edge(phase, target, ", ".join(union)))
    return result


ROW_SEPARATOR = " | "
"""Joins the source states of a row that several states share (one node in a phase diagram)."""


def phase_edges(spec: LifecycleSpec, phase: PhaseSpec) -> list[Edge]:
    """The rows leaving a phase's states, with guards and effects, merged per (from, to); a
    label holds one branch a line.

    A row shared by several states (the spec's ``from: [...]``) is drawn once, from one node
    naming them all, as the spec declares it; a terminal target is drawn per reason.
    """
    merged: dict[tuple[str, str], list[str]] = {}
    for row in spec.transitions:
        if not set(row.sources) & set(phase.states):
            continue
        source = ROW_SEPARATOR.join(row.sources)
        for branch in row.branches:
            target = source if branch.to == SAME else branch.to
            if target in spec.states and spec.states[target].terminal:
                target = f"{target}: {branch.reason}"
            merged.setdefault((source, target), []).append(branch_label(row.event, branch))
    return [Edge(s, t, "\n".join(labels)) for (s, t), labels in merged.items()]


def drawn_phases(spec: LifecycleSpec) -> list[PhaseSpec]:
    """Phases with at least one live state: each gets a detailed diagram."""
    return [p for p in spec.diagram.phases if any(not spec.states[s].terminal for s in p.states)]


def phase_svg_name(phase: PhaseSpec) -> str:
    return f"lifecycle-{_slug(phase.name)}.svg"


# ---------------------------------------------------------------------- Mermaid


def _mermaid_node(name: str, spec: LifecycleSpec) -> str:
    if name in spec.states:
        return f'{_node_id(name)}(["{name}"])'
    if ROW_SEPARATOR in name:  # a row several states share
        return f'{_node_id(name)}["{name}"]'
    return f'{_node_id(name)}[["{name}"]]'  # an end: a family or a reason


def mermaid_overview(spec: LifecycleSpec) -> str:
    lines = ["flowchart TB", f"    start((start)) --> {_node_id(spec.initial)}"]
    ends = [f"released: {family.name}" for family in spec.diagram.families]
    for phase in spec.diagram.phases:
        members = [s for s in phase.states if not spec.states[s].terminal]
        if all(spec.states[s].terminal for s in phase.states):
            members = ends
        lines.append(f'    subgraph {_node_id(phase.name)}["{phase.name}"]')
        lines += [f"        {_mermaid_node(m, spec)}" for m in members]
        lines.append("    end")
    for edge in overview_edges(spec):
        lines.append(f'    {_node_id(edge.source)} -- "{edge.label}" --> {_node_id(edge.target)}')
    return "\n".join(lines) + "\n"


def _phase_nodes(spec: LifecycleSpec, phase: PhaseSpec, drawn: list[Edge]) -> list[str]:
    """The phase's states, then the shared-row nodes that name one of them."""
    shared = [e.source for e in drawn if e.source not in spec.states]
    return [*phase.states, *dict.fromkeys(shared)]


def mermaid_phase(spec: LifecycleSpec, phase: PhaseSpec) -> str:
    drawn = phase_edges(spec, phase)
    inside = _phase_nodes(spec, phase, drawn)
    lines = ["flowchart LR", f'    subgraph {_node_id(phase.name)}["{phase.name}"]']
    lines += [f"        {_mermaid_node(s, spec)}" for s in inside]
    lines.append("    end")
    for edge in drawn:
        if edge.target not in inside:
            lines.append(f"    {_mermaid_node(edge.target, spec)}")
        label = edge.label.replace("\n", "<br/>")
        lines.append(f'    {_node_id(edge.source)} -- "{label}" --> {_node_id(edge.target)}')
    return "\n".join(lines) + "\n"


def markdown(spec: LifecycleSpec, digest: str, source: str = "spec/lifecycle.yaml") -> str:
    design = spec.design
    title = "The prefetch lifecycle" + (
        "" if design is None else f" of {design.name} ({design.releases})"
    )
    drives = (
        "drives the executable machine, the static checks and the model checker."
        if design is None
        else "is what the static checks and the model checker read; its facts come from "
        f"{design.source}."
    )
    out = [
        f"# {title}",
        "",
        f"<!-- Generated by `stagefate diagram` from {source}; do not edit by hand. -->",
        f"<!-- spec sha256: {digest} -->",
        "",
        "The whole life of a prefetch on one page: states grouped by phase, one arrow per",
        "(from, to) labelled by the events that take it, and the terminal `released` drawn once",
        "per family of end reasons. Each phase then has its own diagram with every guard and",
        "effect, and the tables below list every state, transition and reason. The same table",
        drives,
    ]
    if design is not None and design.not_expressed:
        out += ["", "What the implementation does that this spec does not say:", ""]
        out += [f"- {sentence}" for sentence in design.not_expressed]
    out += [
        "",
        "## Overview",
        "",
        f"![lifecycle overview]({SVG_NAME})",
        "",
        "```mermaid",
        mermaid_overview(spec).rstrip("\n"),
        "```",
    ]
    for phase in drawn_phases(spec):
        out += [
            "",
            f"## Phase: {phase.name}",
            "",
            "Every exit of " + ", ".join(f"`{s}`" for s in phase.states) + ", as",
            "`event [guard] / effects`; a row's guards are tried top to bottom, `else` last.",
            "",
            f"![{phase.name}]({phase_svg_name(phase)})",
            "",
            "```mermaid",
            mermaid_phase(spec, phase).rstrip("\n"),
            "```",
        ]
    out += ["", "## States", "", "| state | phase | holds | meaning |", "|---|---|---|---|"]
    for name, state in spec.states.items():
        holds = ", ".join(f"{r} ({lvl})" for r, lvl in state.holds.items()) or "—"
        kind = " (terminal: no exits)" if state.terminal else ""
        phase_name = spec.diagram.phase_of(name)
        out.append(f"| `{name}` | {phase_name} | {holds} | {state.doc}{kind} |")
    out += ["", "## Transitions", "", "| from | event | guard | to | effects | reason |"]
    out.append("|---|---|---|---|---|---|")
    for row in spec.transitions:
        for branch in row.branches:
            out.append(
                f"| {', '.join(f'`{s}`' for s in row.sources)} | {row.event} | "
                f"{branch.guard or 'else'} | `{branch.to}` | {', '.join(branch.effects) or '—'} | "
                f"{branch.reason or '—'} |"
            )
    if spec.exits:
        out += [
            "",
            "## Exits",
            "",
            "Run on every move out of the states named, whichever branch "
            "makes it (after the branch's effects and the state change).",
            "",
        ]
        out += ["| exit | leaving | states | what it ends |", "|---|---|---|---|"]
        for name, exit_spec in spec.exits.items():
            left = spec.groups.get(exit_spec.leaving)
            states = (exit_spec.leaving,) if left is None else left.states
            out.append(
                f"| {name} | {exit_spec.leaving} | {', '.join(f'`{s}`' for s in states)} | "
                f"{' '.join(exit_spec.doc.split())} |"
            )
    out += ["", "## Terminal reasons", "", "| reason | family | meaning |", "|---|---|---|"]
    out += [
        f"| `{name}` | {spec.diagram.family_of(name)} | {doc} |"
        for name, doc in spec.reasons.items()
    ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------- Graphviz


def _graph(rankdir: str) -> Any:
    import pygraphviz  # imported here: only diagram generation needs Graphviz

    graph = pygraphviz.AGraph(directed=True, strict=False, rankdir=rankdir, compound="true")
    graph.graph_attr.update(
        fontname="Helvetica", fontsize="11", nodesep="0.35", ranksep="0.45", newrank="true"
    )
    graph.node_attr.update(shape="box", style="rounded", fontname="Helvetica", fontsize="11")
    graph.edge_attr.update(fontname="Helvetica", fontsize="9", color="#555555")
    return graph


def _cluster(graph: Any, name: str, members: list[str], spec: LifecycleSpec) -> None:
    cluster = graph.add_subgraph(
        name=f"cluster_{_node_id(name)}", label=name, style="rounded,filled", color="#dddddd"
    )
    cluster.graph_attr.update(fillcolor="#f6f6f6", fontname="Helvetica-Bold", fontsize="11")
    for member in members:
        _gv_node(cluster, member, spec)


def _gv_node(graph: Any, name: str, spec: LifecycleSpec) -> None:
    if name in spec.states:
        graph.add_node(name, style="rounded,filled", fillcolor="white")
    elif ROW_SEPARATOR in name:  # a row several states share
        graph.add_node(name, style="rounded,dashed,filled", fillcolor="white")
    else:  # an end: drawn as the terminal state it stands for
        graph.add_node(name, peripheries=2, style="rounded,filled", fillcolor="#eef3fb")


def _drawn(graph: Any, digest: str) -> bytes:
    drawn: bytes = graph.draw(format="svg", prog="dot")
    marker = f"<!-- spec sha256: {digest} -->\n".encode()
    head, _, tail = drawn.partition(b"\n")
    return head + b"\n" + marker + tail


def svg(spec: LifecycleSpec, digest: str) -> bytes:
    """The overview: phases as clusters, ends per family, one edge per (from, to)."""
    graph = _graph("TB")
    graph.add_node(
        "start", shape="circle", label="", width="0.18", style="filled", fillcolor="black"
    )
    for phase in spec.diagram.phases:
        members = [s for s in phase.states if not spec.states[s].terminal]
        if not members:
            members = [f"released: {family.name}" for family in spec.diagram.families]
        _cluster(graph, phase.name, members, spec)
    graph.add_edge("start", spec.initial)
    phases = {phase.name: phase for phase in spec.diagram.phases}
    for index, edge in enumerate(overview_edges(spec)):
        attributes = {"key": str(index), "label": f" {edge.label} "}
        source = edge.source
        if source in phases:  # from the phase as a whole: leave its cluster's border
            attributes["ltail"] = f"cluster_{_node_id(source)}"
            source = _anchor_state(spec, phases[source])
        graph.add_edge(source, edge.target, **attributes)
    return _drawn(graph, digest)


def _anchor_state(spec: LifecycleSpec, phase: PhaseSpec) -> str:
    """The state a phase-wide arrow is drawn from (graphviz needs a node inside the cluster)."""
    live = [s for s in phase.states if not spec.states[s].terminal]
    return live[len(live) // 2]


def phase_svg(spec: LifecycleSpec, phase: PhaseSpec, digest: str) -> bytes:
    """One phase: its states, and every exit with guards and effects."""
    graph = _graph("LR")
    drawn = phase_edges(spec, phase)
    inside = _phase_nodes(spec, phase, drawn)
    _cluster(graph, phase.name, inside, spec)
    for index, edge in enumerate(drawn):
        if edge.target not in inside:
            _gv_node(graph, edge.target, spec)
        graph.add_edge(edge.source, edge.target, key=str(index), label=edge.label)
    return _drawn(graph, digest)


def _svgs(spec: LifecycleSpec, digest: str) -> dict[str, bytes]:
    drawn = {SVG_NAME: svg(spec, digest)}
    for phase in drawn_phases(spec):
        drawn[phase_svg_name(phase)] = phase_svg(spec, phase, digest)
    return drawn


def write_diagrams(
    spec: LifecycleSpec, out_dir: Path, digest: str, source: str = "spec/lifecycle.yaml"
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = out_dir / MARKDOWN_NAME
    md_path.write_text(markdown(spec, digest, source), encoding="utf-8")
    written = [md_path]
    for name, drawn in _svgs(spec, digest).items():
        (out_dir / name).write_bytes(drawn)
        written.append(out_dir / name)
    return written


def stale_diagrams(
    spec: LifecycleSpec, out_dir: Path, digest: str, source: str = "spec/lifecycle.yaml"
) -> list[str]:
    """Why the committed diagrams differ from the spec (empty when they are in step).

    The Markdown is compared byte for byte; the SVG by the spec digest it carries, since
    Graphviz releases may lay out the same graph with different coordinates.
    """
    problems = []
    md_path = out_dir / MARKDOWN_NAME
    expected = markdown(spec, digest, source)
    if not md_path.exists() or md_path.read_text(encoding="utf-8") != expected:
        problems.append(f"{md_path} is missing or out of step with the spec")
    marker = f"<!-- spec sha256: {digest} -->".encode()
    names = [SVG_NAME, *(phase_svg_name(phase) for phase in drawn_phases(spec))]
    for svg_path in (out_dir / name for name in names):
        if not svg_path.exists() or marker not in svg_path.read_bytes():
            problems.append(f"{svg_path} is missing or was drawn from another spec")
    return problems
