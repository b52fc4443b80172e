"""The spec loads, has the states of docs/design.md §3, passes every static check, and each check
has teeth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stagefate.spec import SpecError, load_spec, parse_spec, run_static_checks
from stagefate.spec.checks import (
    check_determinism,
    check_diagram,
    check_implementations,
    check_pure_revoke,
    check_reachability,
    check_resource_balance,
    check_terminal,
    check_termination,
    check_unused,
)
from stagefate.spec.diagram import drawn_phases, overview_edges, phase_edges
from stagefate.spec.load import DEFAULT_SPEC_PATH
from stagefate.statemachine.bindings import implemented_names
from tests.harness import spec_document

SECTION_3_STATES = {
    "issued",
    "locked",
    "no_anchor",
    "cap_skip",
    "anchor_lost",
    "parked",
    "reading",
    "abandoned",
    "outrun",
    "staged",
    "trimmed",
    "consumed",
    "released",
}


def row(doc: dict[str, Any], source: str, event: str) -> dict[str, Any]:
    for item in doc["transitions"]:
        if source in item["from"] and item["event"] == event:
            return item  # type: ignore[no-any-return]
    raise KeyError((source, event))


def test_spec_has_every_design_state_and_one_terminal() -> None:
    spec = load_spec()
    assert set(spec.states) == SECTION_3_STATES
    assert spec.terminal_states == ("released",)
    assert spec.initial == "issued"


def test_shipped_spec_passes_every_static_check_with_the_pipeline_bound() -> None:
    assert run_static_checks(load_spec(), *implemented_names()) == []


def test_unknown_name_is_rejected_with_field_path_and_fix() -> None:
    doc = spec_document()
    row(doc, "reading", "read_done")["branches"][0]["guard"] = "read_emptyy"
    with pytest.raises(SpecError) as info:
        parse_spec(doc, "broken.yaml")
    message = str(info.value)
    assert "broken.yaml" in message and "read_emptyy" in message and "declare it" in message


def test_malformed_field_names_its_path() -> None:
    doc = spec_document()
    doc["states"]["locked"]["holds"] = {"pin": "sometimes"}
    with pytest.raises(SpecError, match=r"states\.locked\.holds\.pin"):
        parse_spec(doc)


def test_unreadable_spec_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("states: [")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)


def test_a_key_given_twice_is_refused_naming_it_and_its_line(tmp_path: Path) -> None:
    """Plain YAML keeps the last of two ``initial:`` keys: the spec would start elsewhere."""
    twice = tmp_path / "twice.yaml"
    text = DEFAULT_SPEC_PATH.read_text()
    twice.write_text(text.replace("\ninitial:", "\ninitial: locked\ninitial:", 1))
    assert "initial: locked\ninitial:" in twice.read_text()
    line = twice.read_text().splitlines().index("initial: locked") + 2
    with pytest.raises(SpecError, match=rf"key 'initial' is given twice .*line {line}"):
        load_spec(twice)


def test_implementations_check_names_the_missing_guard() -> None:
    bound = implemented_names()
    findings = check_implementations(load_spec(), bound.guards - {"host_short"}, bound.effects)
    assert [f.message for f in findings] == [
        "guards the spec declares with no implementation: host_short (bind exactly the guards "
        "spec/lifecycle.yaml declares)"
    ]


def test_implementations_check_runs_both_ways_over_counters_and_groups() -> None:
    bound = implemented_names()
    findings = check_implementations(
        load_spec(),
        bound.guards | {"made_up"},
        bound.effects,
        bound.counters - {"l3_reads"} | {"l3_writes"},
        bound.groups | {"resting"},
    )
    messages = " / ".join(f.message for f in findings)
    assert "guard implementations the spec never declares: made_up" in messages
    assert "counters the spec declares with no implementation: l3_reads" in messages
    assert "counter implementations the spec never declares: l3_writes" in messages
    assert "Stats (statemachine/stats.py)" in messages
    assert "does not declare: resting (add them under 'groups')" in messages


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["groups"]["hold"]["states"].append("stagedd"), "unknown state 'stagedd'"),
        (lambda d: d["groups"]["owning"]["states"].append("released"), "terminal state"),
        (lambda d: d["groups"]["pending"].update(states=[]), "groups.pending.states"),
        (lambda d: d["groups"].update(idle={"states": ["parked"]}), "groups.idle.doc"),
    ],
    ids=["unknown-state", "terminal-state", "empty", "no-doc"],
)
def test_a_broken_group_is_rejected_with_the_fix(edit: Any, expected: str) -> None:
    doc = spec_document()
    edit(doc)
    with pytest.raises(SpecError, match=expected):
        parse_spec(doc)


def test_an_undeclared_or_clashing_counter_is_rejected() -> None:
    doc = spec_document()
    row(doc, "reading", "read_done")["branches"][1]["count"] = ["stagedd"]
    with pytest.raises(SpecError, match="unknown counter 'stagedd'; declare it under 'counters'"):
        parse_spec(doc)
    doc = spec_document()
    doc["counters"]["filled"] = "counted twice"
    with pytest.raises(SpecError, match="counter 'filled' is also a reason"):
        parse_spec(doc)


def test_the_code_reads_groups_from_the_spec_and_refuses_a_spec_without_one() -> None:
    spec = load_spec()
    assert spec.group("hold") == {"staged", "trimmed"}
    with pytest.raises(KeyError, match="add it under 'groups'"):
        spec.group("resting")
    doc = spec_document()
    del doc["groups"]["pending"]
    from stagefate import BufferPipeline, PipelineConfig
    from stagefate.statemachine.errors import IncompleteImplementation

    with pytest.raises(IncompleteImplementation, match="does not declare: pending"):
        BufferPipeline(PipelineConfig(), spec=parse_spec(doc))


def test_an_exit_names_a_declared_group_and_runs_on_moves_out_of_it() -> None:
    spec = load_spec()
    assert spec.exits_on("staged", "consumed") == ()  # both own the span's page keys
    assert spec.exits_on("consumed", "released") == ("disown_span",)
    assert spec.exits_on("parked", "parked") == ()
    assert spec.exits_on("parked", "released") == ("leave_parked_fifo",)
    doc = spec_document()
    del doc["groups"]["owning"]
    with pytest.raises(SpecError, match="exit 'disown_span' leaves 'owning', which is neither"):
        parse_spec(doc)
    doc = spec_document()
    del doc["exits"]["disown_span"]
    from stagefate import BufferPipeline, PipelineConfig
    from stagefate.statemachine.errors import IncompleteImplementation

    with pytest.raises(IncompleteImplementation, match="exit implementations the spec never"):
        BufferPipeline(PipelineConfig(), spec=parse_spec(doc))


def test_pure_revoke_check_finds_a_bounce_before_the_commit() -> None:
    doc = spec_document()
    doc["states"]["parked"]["holds"]["bounce"] = "maybe"
    findings = check_pure_revoke(parse_spec(doc))
    assert any("pre-commit state 'parked' may hold the bounce" in f.message for f in findings)
    doc = spec_document()
    row(doc, "locked", "hit")["branches"][0]["effects"] = ["unpin", "alloc_bounce", "free_bounce"]
    findings = check_pure_revoke(parse_spec(doc))
    assert any("a revoke must allocate nothing" in f.message for f in findings)


def test_reachability_check_finds_an_orphan_state() -> None:
    doc = spec_document()
    doc["states"]["orphan"] = {"doc": "nothing leads here"}
    doc["transitions"].append(
        {
            "from": ["orphan"],
            "event": "abort",
            "branches": [{"to": "released", "reason": "aborted"}],
        }
    )
    findings = check_reachability(parse_spec(doc))
    assert [f.message for f in findings] == ["state 'orphan' is not reachable from 'issued'"]


def test_termination_check_finds_a_trap() -> None:
    doc = spec_document()
    doc["states"]["trap"] = {"doc": "no way out"}
    doc["transitions"].append({"from": ["trap"], "event": "abort", "branches": [{"to": "same"}]})
    row(doc, "reading", "abort")["branches"][0]["to"] = "trap"
    row(doc, "reading", "abort")["branches"][0]["effects"] = ["unpin", "free_bounce"]
    findings = check_termination(parse_spec(doc))
    assert any("'trap' can never reach a terminal state" in f.message for f in findings)


def test_determinism_check_finds_missing_fallback_and_shadowed_branch() -> None:
    doc = spec_document()
    branches = row(doc, "staged", "plan")["branches"]
    branches[-1]["guard"] = "trim_positive"  # duplicate guard, and no fallback
    findings = [f.message for f in check_determinism(parse_spec(doc))]
    assert any("no transition; add an unguarded fallback" in m for m in findings)
    assert any("guard 'trim_positive' is tried twice" in m for m in findings)
    doc = spec_document()
    branches = row(doc, "reading", "read_done")["branches"]
    branches[0]["guard"] = None
    findings = [f.message for f in check_determinism(parse_spec(doc))]
    assert any("branch 0 has no guard" in m for m in findings)


def test_resource_balance_check_finds_a_leaked_bounce() -> None:
    doc = spec_document()
    row(doc, "staged", "release_hold")["branches"][0]["effects"] = ["unpin"]
    findings = [f.message for f in check_resource_balance(parse_spec(doc))]
    assert findings == [
        "staged --release_hold[else]--> released: leaks 'bounce' ('released' cannot hold it); "
        "add an effect that releases it",
        "trimmed --release_hold[else]--> released: leaks 'bounce' ('released' cannot hold it); "
        "add an effect that releases it",
    ]


def test_resource_balance_check_finds_a_double_acquire() -> None:
    doc = spec_document()
    row(doc, "locked", "lock")["branches"][0]["effects"] = ["pin_anchor"]
    findings = [f.message for f in check_resource_balance(parse_spec(doc))]
    assert len(findings) == 1 and "double acquire" in findings[0]


def test_resource_balance_check_finds_a_missing_acquire() -> None:
    doc = spec_document()
    commit = row(doc, "locked", "commit")["branches"][-1]
    commit["effects"] = ["pin_if_possible", "launch_read"]  # no alloc_bounce
    findings = [f.message for f in check_resource_balance(parse_spec(doc))]
    assert findings and all("always holds 'bounce'" in m for m in findings)


def test_terminal_check_finds_holdings_and_exits() -> None:
    doc = spec_document()
    doc["states"]["released"]["holds"] = {"pin": "maybe"}
    doc["transitions"].append(
        {"from": ["released"], "event": "abort", "branches": [{"to": "same"}]}
    )
    findings = [f.message for f in check_terminal(parse_spec(doc))]
    assert "terminal state 'released' holds ['pin']" in findings
    assert "terminal state 'released' has an exit on 'abort'; remove it" in findings


def test_unused_check_finds_dead_declarations() -> None:
    doc = spec_document()
    doc["guards"]["never_used"] = "declared for nothing"
    findings = [f.message for f in check_unused(parse_spec(doc))]
    assert findings == ["guard 'never_used' is declared but no transition uses it"]


def test_diagram_check_finds_a_state_without_phase_and_a_reason_in_two_families() -> None:
    doc = spec_document()
    doc["diagram"]["phases"][1]["states"] = []  # parked has no phase now
    doc["diagram"]["phases"][1]["states"].append("parkd")
    doc["diagram"]["families"][0]["reasons"].append("aborted")
    findings = [f.message for f in check_diagram(parse_spec(doc))]
    assert findings == [
        "phase 'IO commit' lists unknown state 'parkd'",
        "state 'parked' is in none; list it under exactly one diagram phase",
        "reason 'aborted' is in ['filled', 'aborted']; list it under exactly one diagram family",
    ]


def test_the_overview_loses_no_transition_and_the_phases_show_every_branch() -> None:
    """Every branch that leaves its state is an overview arrow (from its state or its phase,
    to its state or its reason's family, its event in the label), and every branch appears in
    the diagram of each phase its row starts in."""
    spec = load_spec()
    arrows = {(e.source, e.target): e.label.split(", ") for e in overview_edges(spec)}
    for source, event, branches in spec.rows():
        for branch in branches:
            target = spec.target_of(source, branch)
            if target == source:
                continue  # self-loops live in the phase diagrams
            if spec.states[target].terminal:
                assert branch.reason is not None
                target = f"released: {spec.diagram.family_of(branch.reason)}"
            phase = spec.diagram.phase_of(source)
            drawn = arrows.get((source, target)) or arrows.get((phase, target))
            assert drawn is not None and event in drawn, (source, event, branch)
    assert len(arrows) < len(spec.edges()) / 2  # one page, not the whole table
    for phase in drawn_phases(spec):
        labels = "\n".join(e.label for e in phase_edges(spec, phase))
        for row in spec.transitions:
            if set(row.sources) & set(phase.states):
                for branch in row.branches:
                    assert f"{row.event} [{branch.guard or 'else'}]" in labels
