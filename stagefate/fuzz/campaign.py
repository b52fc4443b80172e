"""``stagefate fuzz``: run the stateful fuzzer for a budget and report every spec edge reached."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import hypothesis.core as hypothesis_core
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.reporting import current_reporter, with_reporter
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..spec import load_spec
from .fuzzer import PipelineFuzzer
from .profiles import register_profiles
from .tally import TALLY, Edge

STEPS_PER_EXAMPLE = 100
BATCH_EXAMPLES = 20
DATABASE = Path(".hypothesis") / "fuzz"


@dataclass(frozen=True)
class CampaignResult:
    states: int
    """States whose invariants were checked: the steps actually executed (programs end early)."""
    examples: int
    seconds: float
    failure: BaseException | None
    unreached: list[Edge]


@contextmanager
def reported_unless_interrupted() -> Iterator[None]:
    """What Hypothesis reports while a batch runs, printed when it ends, and dropped when it
    was interrupted: Ctrl-C is not a failure to reproduce, yet Hypothesis says "You can
    reproduce this failure by adding @seed(...)" for any exception."""
    held: list[object] = []
    report = current_reporter()
    with with_reporter(held.append):
        try:
            yield
        except KeyboardInterrupt:
            held.clear()
            raise
        finally:
            for message in held:
                report(message)


def run_campaign(
    console: Console,
    machine: type[PipelineFuzzer] = PipelineFuzzer,
    steps: int | None = None,
    budget_seconds: float | None = None,
    seed: int = 0,
    profile: str = "fuzz",
) -> CampaignResult:
    """Batches of ``machine``'s programs until ``steps`` states are checked or
    ``budget_seconds`` pass; ``machine`` comes configured from :func:`~.fuzzer.configured`
    (its tree, faults, log), so the campaign changes no class another caller sees."""
    TALLY.reset()
    examples, seconds, failure = run_batches(
        console, machine, lambda: TALLY.states, steps, budget_seconds, seed, profile
    )
    unreached = [edge for edge in load_spec().edges() if TALLY.edges[edge] == 0]
    return CampaignResult(TALLY.states, examples, seconds, failure, unreached)


def run_batches(
    console: Console,
    machine: type[RuleBasedStateMachine],
    states: Callable[[], int],
    steps: int | None,
    budget_seconds: float | None,
    seed: int,
    profile: str,
) -> tuple[int, float, BaseException | None]:
    """Batches of ``machine``'s programs until ``states()`` reaches ``steps`` or the budget is
    spent; returns (programs, seconds, the failure if one was found)."""
    register_profiles()
    # Hypothesis draws each run's seed from this generator when not derandomized: seeding it
    # once makes a whole campaign (every batch) repeatable from ``--seed``.
    hypothesis_core.threadlocal._hypothesis_global_random = random.Random(seed)
    started, examples, failure = time.monotonic(), 0, None
    columns = (TextColumn("fuzz"), BarColumn(), TextColumn("{task.description}"))
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("0 states", total=steps or budget_seconds)
        while failure is None:
            elapsed = time.monotonic() - started
            if steps is not None and states() >= steps:
                break
            if budget_seconds is not None and elapsed >= budget_seconds:
                break
            batch = BATCH_EXAMPLES
            if steps is not None:  # no more programs than the states still to check need
                batch = min(batch, -(-(steps - states()) // STEPS_PER_EXAMPLE))
            batch_settings = settings(
                settings.get_profile(profile),
                max_examples=batch,
                stateful_step_count=STEPS_PER_EXAMPLE,
                derandomize=False,
                database=DirectoryBasedExampleDatabase(str(DATABASE)),
            )
            try:
                with reported_unless_interrupted():
                    run_state_machine_as_test(machine, settings=batch_settings)
            except Exception as error:  # Hypothesis has printed the minimal failing program
                failure = error
            examples += batch
            progress.update(
                task,
                completed=states() if steps else time.monotonic() - started,
                description=f"{states():,} states checked",
            )
    return examples, time.monotonic() - started, failure


def failing_programs(error: BaseException) -> list[str]:
    """The minimal failing programs Hypothesis attached to ``error`` (as notes: it prints none
    itself outside pytest), one per distinct failure, each headed by the failure it shows and
    runnable as printed."""
    grouped = getattr(error, "exceptions", None)  # an exception group: one per failure
    errors = list(grouped) if isinstance(grouped, tuple) else [error]
    programs = []
    for each in errors:
        notes = getattr(each, "__notes__", None)
        if notes:
            programs.append("\n".join([f"# {type(each).__name__}: {each}", *notes]))
    return programs


def edge_table() -> Table:
    table = Table(title="spec edges reached")
    for column in ("state", "event", "guard", "hits"):
        table.add_column(column, justify="right" if column == "hits" else "left")
    for state, event, guard in load_spec().edges():
        hits = TALLY.edges[(state, event, guard)]
        table.add_row(state, event, guard, Text(f"{hits:,}", style="" if hits else "red"))
    return table
