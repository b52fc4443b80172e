"""``stagefate bench dispatch``: the cost of one transition, generated rows vs ``transitions``.

Both machines are built from the shipped spec with guards that always fail, so every event takes
its row's fallback branch; one cycle walks issued → locked → (hit) → reading → staged → (plan)
→ consumed → released, seven transitions.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec import load_spec
from ..statemachine.machine import CompiledMachine
from ..statemachine.oracle import OracleMachine
from .report import Section, median_seconds, table

CYCLE = ("lock", "hit", "commit", "read_done", "plan", "consume", "ack")


@dataclass
class _Record:
    request_id: str
    state: str


def _never(_record: _Record) -> bool:
    return False


def _nothing(_record: _Record) -> None:
    return None


def run(cycles: int = 2000, repeats: int = 7) -> Section:
    spec = load_spec()
    guards = dict.fromkeys(spec.guards, _never)
    effects = dict.fromkeys(spec.effects, _nothing)
    compiled: CompiledMachine[_Record] = CompiledMachine(spec, guards, effects)
    oracle = OracleMachine(spec, guards, effects)
    record = _Record("bench", spec.initial)
    model = oracle.add(record)

    def drive_compiled() -> None:
        for _ in range(cycles):
            record.state = spec.initial
            for event in CYCLE:
                compiled.fire(record, event)

    def drive_oracle() -> None:
        for _ in range(cycles):
            oracle.machine.set_state(spec.initial, model=model)
            for event in CYCLE:
                oracle.trigger(model, event)

    per = cycles * len(CYCLE)
    compiled_us = median_seconds(drive_compiled, repeats) / per * 1e6
    oracle_us = median_seconds(drive_oracle, repeats) / per * 1e6
    body = table(
        ["machine", "µs per transition (median)", "vs compiled"],
        [
            ["generated rows (`CompiledMachine.fire`)", f"{compiled_us:.3f}", "1.0×"],
            [
                "transitions (`OracleMachine.trigger`)",
                f"{oracle_us:.3f}",
                f"{oracle_us / compiled_us:.1f}×",
            ],
        ],
    )
    verdict = "met" if compiled_us <= 1.0 else "NOT met"
    body += (
        f"\n\n{cycles} cycles of {len(CYCLE)} transitions, median of {repeats} runs. "
        f"Target: compiled dispatch ≤ 1 µs per transition: **{verdict}**."
    )
    return Section("dispatch", "Dispatch: generated rows vs transitions", body)
