"""The spec's names are the code's: every counter, every group read and every `checked_by` claim
is verified against what the pipeline, the metrics, the fuzzer, the model checker, the static
checks and the scenario tests actually have (h11's rule: all state-machine knowledge in the
table, and the table checked against the code)."""

from __future__ import annotations

import inspect
from types import ModuleType

from stagefate.fuzz.fuzzer import PipelineFuzzer
from stagefate.fuzz.rank_fuzzer import RankFuzzer
from stagefate.metrics import exported_counters
from stagefate.spec import load_spec, model_world
from stagefate.spec.checks import PROVES, run_static_checks
from stagefate.statemachine.stats import Stats

from . import test_dedup, test_scenarios, test_tensor_parallel

SPEC = load_spec()


def _claimed(checker: str) -> set[str]:
    return {inv.id for inv in SPEC.invariants if checker in inv.checked_by}


def test_stats_and_the_metrics_keep_exactly_the_specs_counters() -> None:
    assert set(Stats.model_fields) == set(SPEC.all_counters)
    assert exported_counters(SPEC) == set(SPEC.all_counters)


def _invariants_of(machine: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(machine)
        if getattr(member, "hypothesis_stateful_invariant", None) is not None
    }


def test_the_fuzzers_invariants_are_exactly_the_spec_ids_it_is_listed_for() -> None:
    assert _invariants_of(PipelineFuzzer) == _claimed("stateful")


def test_the_rank_fuzzers_invariants_are_exactly_the_spec_ids_it_is_listed_for() -> None:
    assert _invariants_of(RankFuzzer) == _claimed("rank_fuzzer")


def test_the_model_checker_raises_exactly_the_invariants_it_is_listed_for() -> None:
    assert _claimed("model_checker") == model_world.INVARIANTS
    assert _claimed("rank_model_checker") == model_world.RANK_INVARIANTS


def test_each_static_claim_is_proved_by_named_static_checks_that_exist() -> None:
    assert set(PROVES) == _claimed("static")
    checks = {finding.check for finding in run_static_checks(SPEC)}  # none on the shipped spec
    assert checks == set()
    import stagefate.spec.checks as module

    for check_names in PROVES.values():
        for name in check_names:
            assert callable(getattr(module, f"check_{name}")), name


def _marked(module: ModuleType) -> set[str]:
    ids: set[str] = set()
    for _name, function in inspect.getmembers(module, inspect.isfunction):
        for mark in getattr(function, "pytestmark", []):
            if mark.name == "invariant":
                ids.update(mark.args)
    return ids


def test_each_scenario_claim_has_scenario_tests_marked_with_it() -> None:
    marked = _marked(test_scenarios) | _marked(test_dedup) | _marked(test_tensor_parallel)
    assert marked <= {inv.id for inv in SPEC.invariants}, "a mark names no spec invariant"
    assert marked == _claimed("scenarios")
