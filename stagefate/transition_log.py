"""A transition log (one JSON line per transition) and its validation against a spec.

:class:`TransitionLog` is an instrument: attach it to a pipeline and every transition becomes a
line ``{"seq", "request", "source", "event", "guard", "target", "reason"}`` (``guard`` is the
branch taken: its guard's name, or ``else``; ``reason`` is null unless the record ended).
:func:`validate_log` reads such a file and checks it against the spec's table:

* ``seq`` increases strictly from line to line;
* a request with no live record starts one at the spec's initial state (a request id may be
  used again once its record ended);
* every step leaves the request's current state by an edge of the table (source, event, guard),
  reaches that edge's target and names that edge's reason;
* a record ends once: after its terminal step, the next step of that request must start anew;
* the log ends with its closing record, ``{"end": true, "transitions": N}`` (N the lines before
  it), which :meth:`TransitionLog.close` writes: a log without one was cut short (a crash, a
  Ctrl-C, a server killed), and :attr:`LogSummary.closed` says so.

The first step that breaks a rule is reported with its line number. Any implementation that
writes this format (another engine's pipeline, a replayed production log) can be checked the same
way: the log is the ground truth of what happened, the spec of what may happen. Tensor-parallel
ranks in lockstep write identical logs (:func:`first_difference` names where two part).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import IO

from .output_files import AtomicFile, OutputLock
from .spec.schema import BranchSpec, LifecycleSpec
from .statemachine.record import TransitionEvent

FIELDS = ("seq", "request", "source", "event", "guard", "target", "reason")
END = "end"
"""The closing record's key: ``{"end": true, "transitions": N}``."""


class TransitionLog:
    """Writes one JSON line per transition of the pipelines it is attached to, and a closing
    record at :meth:`close` (:meth:`abandon` for a run that stopped short: none)."""

    def __init__(
        self, sink: IO[str], output: AtomicFile | None = None, lock: OutputLock | None = None
    ) -> None:
        self.sink = sink
        self.seq = 0
        self.spec: Path | None = None
        """The spec whose words its lines are in, when not stagefate's own (a design's: the
        observer that writes them sets it)."""
        self._output, self._lock = output, lock
        self._closed = False

    @classmethod
    def open(cls, path: Path | str, line_buffered: bool = False) -> TransitionLog:
        """A log of a run: written beside ``path`` and renamed onto it at :meth:`close`, so
        ``path`` never holds a half-written log. ``line_buffered``: a live log instead, written
        in place line by line (a server's, read while it runs and stopped by a signal: it then
        has no closing record, and ``stagefate validate`` says it was cut short)."""
        if line_buffered:
            lock = OutputLock(path).acquire()
            try:
                sink = Path(path).open("w", encoding="utf-8", buffering=1)  # noqa: SIM115 (the log owns it)
            except BaseException:
                lock.release()
                raise
            return cls(sink, lock=lock)
        output = AtomicFile(path)
        return cls(output.handle, output)

    def __call__(self, event: TransitionEvent) -> None:
        o = event.outcome
        self.record(event.request_id, o.source, o.event, o.guard or "else", o.target, o.reason)

    def record(
        self, request: str, source: str, event: str, guard: str, target: str, reason: str | None
    ) -> None:
        """One transition as a line (what another implementation's observer writes too)."""
        self.seq += 1
        line = {
            "seq": self.seq,
            "request": request,
            "source": source,
            "event": event,
            "guard": guard,
            "target": target,
            "reason": reason,
        }
        self.sink.write(json.dumps(line) + "\n")

    def close(self) -> None:
        """The run is over: the closing record, then the log takes its name."""
        if self._closed:
            return
        self._closed = True
        self.sink.write(self.closing_record())
        self._finish(self._output.commit if self._output else self.sink.close)

    def closing_record(self) -> str:
        """The line that ends a whole log of the :attr:`seq` transitions written so far."""
        return json.dumps({END: True, "transitions": self.seq}) + "\n"

    def abandon(self) -> None:
        """The run stopped short: no closing record; a log of a run is removed, a live log
        is left as it is (cut short)."""
        if self._closed:
            return
        self._closed = True
        self._finish(self._output.abandon if self._output else self.sink.close)

    def _finish(self, end: Callable[[], None]) -> None:
        try:
            end()
        finally:
            if self._lock is not None:
                self._lock.release()


@contextlib.contextmanager
def closing_logs(logs: Iterable[TransitionLog]) -> Iterator[None]:
    """Close ``logs`` when the block ends, or abandon them if it raises (Ctrl-C included): a
    run that stopped short leaves no log under its final name."""
    opened = list(logs)
    try:
        yield
    except BaseException:
        for log in opened:
            log.abandon()
        raise
    for log in opened:
        log.close()


class LogFormatError(ValueError):
    """A line is not a transition record; the message names the line and the fix."""


@dataclass(frozen=True)
class Violation:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class LogSummary:
    lines: int = 0
    records: int = 0
    ended: Counter[str] = field(default_factory=Counter)
    """Records ended, by reason."""
    live: Counter[str] = field(default_factory=Counter)
    """Records still live at the end of the log, by state."""
    edges: set[tuple[str, str, str]] = field(default_factory=set)
    """``(state, event, guard)`` edges the log took."""
    violation: Violation | None = None
    closed: bool = False
    """The log ends with its closing record (False: the run that wrote it was cut short)."""


@dataclass(frozen=True)
class Step:
    """One parsed line of a transition log."""

    seq: int
    request: str
    source: str
    event: str
    guard: str
    target: str
    reason: str | None


@dataclass(frozen=True)
class ClosingRecord:
    """The last line of a whole log: how many transitions it holds."""

    transitions: int


def validate_log(lines: Iterable[str], spec: LifecycleSpec) -> LogSummary:
    """Check a transition log against ``spec``; stops at the first violation (its line).

    Raises :class:`LogFormatError` for a line that is not a transition record at all.
    """
    branches = {
        (state, event, branch.guard or "else"): branch
        for state, event, row_branches in spec.rows()
        for branch in row_branches
    }
    summary = LogSummary()
    current: dict[str, str] = {}
    last_seq: int | None = None
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        if summary.closed:
            summary.violation = Violation(number, "a line after the log's closing record")
            break
        step = parse_step(number, text)
        if isinstance(step, ClosingRecord):
            if step.transitions != summary.lines:
                summary.violation = Violation(
                    number,
                    f"the closing record counts {step.transitions} transitions, the log holds "
                    f"{summary.lines}",
                )
                break
            summary.closed = True
            continue
        summary.lines += 1
        if last_seq is not None and step.seq <= last_seq:
            summary.violation = Violation(number, f"seq {step.seq} does not follow {last_seq}")
            break
        last_seq = step.seq
        problem = _check_step(step, current.get(step.request), branches, spec)
        if problem is not None:
            summary.violation = Violation(number, problem)
            break
        if step.request not in current:
            summary.records += 1
        summary.edges.add((step.source, step.event, step.guard))
        if spec.states[step.target].terminal:
            current.pop(step.request, None)
            summary.ended[step.reason or ""] += 1
        else:
            current[step.request] = step.target
    summary.live = Counter(current.values())
    return summary


def parse_step(number: int, text: str) -> Step | ClosingRecord:
    """Line ``number`` of a log as a :class:`Step` or its :class:`ClosingRecord`; a clear error
    when it is neither."""
    where = f"line {number}"
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise LogFormatError(f"{where}: not JSON ({error.msg}); one JSON object a line") from None
    if not isinstance(raw, dict):
        raise LogFormatError(f"{where}: expected a JSON object with {', '.join(FIELDS)}")
    if END in raw:
        if raw != {END: True, "transitions": raw.get("transitions")} or not isinstance(
            raw["transitions"], int
        ):
            raise LogFormatError(
                f'{where}: a closing record is {{"end": true, "transitions": N}}, got {text!r}'
            )
        return ClosingRecord(raw["transitions"])
    missing = [name for name in FIELDS if name not in raw]
    if missing:
        raise LogFormatError(f"{where}: missing field(s) {', '.join(missing)}")
    if not isinstance(raw["seq"], int) or isinstance(raw["seq"], bool):
        raise LogFormatError(f"{where}: seq must be an integer, got {raw['seq']!r}")
    for name in ("request", "source", "event", "guard", "target"):
        if not isinstance(raw[name], str):
            raise LogFormatError(f"{where}: {name} must be a string, got {raw[name]!r}")
    if raw["reason"] is not None and not isinstance(raw["reason"], str):
        raise LogFormatError(f"{where}: reason must be a string or null, got {raw['reason']!r}")
    return Step(**{name: raw[name] for name in FIELDS})


def _check_step(
    step: Step,
    state: str | None,
    branches: dict[tuple[str, str, str], BranchSpec],
    spec: LifecycleSpec,
) -> str | None:
    """Why ``step`` may not follow a record in ``state`` (None: no live record), or None."""
    if state is None and step.source != spec.initial:
        return (
            f"request {step.request!r} has no live record (it never started, or it ended), so "
            f"its step must start a record at {spec.initial!r}, not at {step.source!r}"
        )
    if state is not None and step.source != state:
        return f"request {step.request!r} is in {state!r}, but the step leaves {step.source!r}"
    edge = f"{step.source} --{step.event} [{step.guard}]-->"
    branch = branches.get((step.source, step.event, step.guard))
    if branch is None:
        return f"{edge} is not an edge of the spec"
    wanted = spec.target_of(step.source, branch)
    if step.target != wanted:
        return f"{edge} leads to {wanted!r}, not {step.target!r}"
    if step.reason != branch.reason:
        return f"{edge} ends with reason {branch.reason!r}, not {step.reason!r}"
    return None


def first_difference(first: Path, second: Path) -> str | None:
    """Where two logs part (``line N: …`` with both lines, or which one is longer), or None
    when they are identical: tensor-parallel ranks in lockstep write identical logs."""
    with first.open(encoding="utf-8") as a, second.open(encoding="utf-8") as b:
        steps = (filter(_is_step, a), filter(_is_step, b))  # closing records count apart
        for number, (mine, theirs) in enumerate(zip_longest(*steps), start=1):
            if mine == theirs:
                continue
            if mine is None or theirs is None:
                shorter = first if mine is None else second
                return f"line {number}: {shorter} ends there, the other goes on"
            return f"line {number}: {mine.strip()} against {theirs.strip()}"
    return None


def _is_step(line: str) -> bool:
    return not line.startswith('{"' + END + '"')
