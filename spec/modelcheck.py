"""Exhaustive model checking of the lifecycle spec over a small abstract world.

Theory of operation
-------------------
The checker runs the spec's own transition table (rows, ordered guarded branches, effects and
reasons, exactly as ``lifecycle.yaml`` declares them) against an abstract world small enough to
enumerate, and explores every interleaving breadth first.

The world is one token line of ``pages`` pages in one namespace, positions instead of nodes:

* ``device``: the line's prefix on the device (pages);
* ``host_free``: free bounce pages out of ``host_pages``; the device pool holds ``device_pages``;
* one record slot per request; request ``i`` wants the first ``pages - i`` pages, so spans
  overlap wholly or partly.

L3 is adversarial rather than a position: an existence query or a read finds any prefix of what
it asked for (all of it, none, an error, or any number of pages between). That covers every
pattern of L3 losing pages between any two steps, including a drop between a request's query and
its read, without a position that would multiply every state. A node split changes no position,
so it is the identity here (anchors are re-matched by position); the stateful fuzzer covers real
splits, namespaces and the sliding-window aux pool, which this world leaves out (the ``aux_cut``
branches are listed as not modelled).

Actions are the scheduler's (issue with the live match or a stale one, lock, the IO commit, plan
and consume against the live prefix, abort, release a hold) and the world's (an IO operation
completes; evict a page; a sibling publishes a page). After every new state the invariants of
docs/design.md §4 that the abstraction can state are checked, including the resources each
state must hold per the spec. BFS makes the first counterexample a shortest one; it is printed
as numbered steps. Every state and edge of the spec must also be reached ("sometimes" checks).

What keeps the bounds of docs/design.md §7 (5 pages × 3 requests × 2 issues each) under a minute:

* **Dead fields are cleared** before a state is stored (the hit once the read is sized; all but
  the bounce of an abandoned read), so states differing only there are one. Exact: no later
  step reads them.
* **Compact states**: each distinct request slot is numbered once, and a state is the tuple
  ``(device, host_free, slot numbers…)``: a few small ints to hash, compare and keep.
* **Memoised steps**: a request's step reads its own slot, the two positions and the pinned
  total; the IO commit also reads the other records. Its outcome is kept under exactly that, so
  the spec's rows run once per distinct situation rather than once per state; a step reading
  another record outside the commit meets :data:`.model_world.HIDDEN` and fails loudly instead
  of being memoised wrongly. Each request's own invariants are likewise checked once per
  (slot, device).

Symmetry reduction was tried and left out: requests are interchangeable only when they want the
same span, and a world where two do has more states than sorting them saves (54,140 against
26,400 at 4 pages × 3 requests × 1 issue).

``spec/`` imports no torch and no runtime: guards and effects are re-stated over positions in
:mod:`.model_rules`, one small function each, next to the pipeline's names; the world's types
are :mod:`.model_world`'s, the search :mod:`.search`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import cast

from .model_rules import EFFECTS, EXITS, GUARDS, _live_fields
from .model_world import (
    NOT_MODELLED_GUARDS,
    Args,
    Bounds,
    Edge,
    Fired,
    Rec,
    Slot,
    State,
    Step,
    Violation,
    World,
    _Draft,
)
from .schema import SAME, ApiCall, BranchSpec, CompletionKind, LifecycleSpec
from .search import Search, StateT, StepT, attempts, breadth_first, path_to

_EVICT = Step("world", -1, "evict")
_PUBLISH = Step("world", -1, "publish")
_DRAIN_PLACE = {
    move: place
    for place, move in enumerate(
        ("load", "read", "exists", "commit", "consume", "plan_consume", "plan", "evict")
    )
}
"""The progress check's drain (:meth:`ModelChecker.progress_failure`), each move's place in it:
IO completing in full first, then the pass's IO commit, then admission (a consume before a
plan, so a planned hold is taken rather than re-planned), and last the eviction a scheduler
makes when admission is short of device memory."""


@dataclass
class Result:
    states: int
    edges: set[Edge]
    states_reached: set[str]
    counterexample: list[str] | None = None
    violation: str | None = None
    invariant: str | None = None
    """The spec id of the invariant ``violation`` broke (None: the spec could not run a step)."""
    truncated: bool = False
    unreached_edges: list[Edge] = field(default_factory=list)
    unreached_states: list[str] = field(default_factory=list)


_LIVE_CALLS: dict[str, tuple[ApiCall, ...]] = {
    "plan": ("plan_staged_splice",),
    "consume": ("init_load_back",),
    "plan_consume": ("plan_staged_splice", "init_load_back"),
}
"""The calls a step against the live prefix makes (``plan_consume``: both in one pass)."""


class ModelChecker:
    def __init__(self, spec: LifecycleSpec, bounds: Bounds | None = None) -> None:
        self.spec = spec
        self.bounds: Bounds = bounds or Bounds()
        self.host_capacity: int = self.bounds.host_pages
        """The bounce pool's configured size, which ``span_oversize`` reads: the ranks share one
        config, so a rank whose pool is fuller (:mod:`.modelcheck_ranks`) still has this size."""
        self._rows = {(state, event): branches for state, event, branches in spec.rows()}
        self.effects = EFFECTS
        # a design without these has no such states (blind dedups and parks nothing)
        self.owning = spec.group("owning", required=False)
        self.waiting_for_room: frozenset[str] = spec.group("waiting_for_room", required=False)
        self.orphaned = spec.group("orphaned", required=False)
        self.pre_commit = spec.group("pre_commit")
        self.holds = spec.group("hold")
        self.draws_speeds = "load_slower_than_compute" in spec.guards
        """Whether the issue and the IO commit read the measured speeds: then they are drawn
        both ways."""
        self.give_up = spec.calls.get("give_up_slow_read", ("",))[0]
        """The event ``give_up_slow_read`` fires ("" for a design without the call): drawn both
        ways, with the read outlasting computing and not."""
        self._levels = {
            name: (state.level("pin").value, state.level("bounce").value)
            for name, state in spec.states.items()
        }
        self._targets = {
            (state, event, branch.guard or "else"): spec.target_of(state, branch)
            for state, event, branches in spec.rows()
            for branch in branches
        }
        missing = (
            (set(spec.guards) - set(GUARDS))
            | (set(spec.effects) - set(EFFECTS))
            | (set(spec.exits) - set(EXITS))
        )
        if missing:
            raise ValueError(
                f"the model checker has no abstract meaning for {sorted(missing)}; add one to "
                "spec/model_rules.py next to the pipeline's implementation"
            )
        self._exits = {
            (source, target): tuple(EXITS[name] for name in spec.exits_on(source, target))
            for source in spec.states
            for target in spec.states
        }
        self._wants = [self.bounds.want(i) for i in range(self.bounds.requests)]
        self._call_of = {events[-1]: call for call, events in spec.calls.items()}
        """The scheduler call each event is fired by (a call's last event names it)."""
        self._calls = spec.calls
        """The events each scheduler call fires: the model steps on the spec's calls."""
        self._plan_then_consume = ("plan", "consume") in spec.atomic
        self._reads_others = frozenset({"commit"})
        """Steps that read other requests' records (in-flight dedup): memoised with them."""
        self._memo: dict[tuple[object, ...], tuple[int, int, int, bool]] = {}
        self._steps: dict[tuple[int, int, bool], tuple[Step, ...]] = {}
        self._woken: dict[int, int] = {}
        self._slots: list[Slot] = []
        self._slot_ids: dict[Slot, int] = {}
        self._pin_charge: list[int] = []
        self._pin_at: list[int] = []
        self._record_ids: dict[Rec | None, int] = {}
        self._record_of: list[int] = []
        self._bounce_of: list[int] = []
        self._owning: list[bool] = []
        self._waiting_of: list[int] = []
        self._checked: set[tuple[int, int, int]] = set()
        """(request, slot number, device) whose own invariants held."""

    # ------------------------------------------------------------------ firing

    def _fire(
        self, draft: _Draft, index: int, event: str, args: Args, edges: set[Edge]
    ) -> str | None:
        """Run ``event`` on request ``index``; return the reason it ended with, if any."""
        record = draft.records[index]
        assert record is not None
        branches = self._rows.get((record.state, event))
        if branches is None:
            raise Violation(None, f"r{index}: event {event!r} fired in state {record.state!r}")
        branch = self._choose(draft, index, record, branches, args)
        guard = branch.guard or "else"
        edges.add((record.state, event, guard))
        self._note_choice(draft, index, record, event, branches, branch, args, edges)
        source = record.state
        for effect in branch.effects:
            record = self.effects[effect](self, draft, index, record, args)
            draft.records[index] = record
        target = source if branch.to == SAME else branch.to
        if draft.fired is not None:
            draft.fired.append(Fired(index, source, event, guard, target, branch.reason))
        record = record._replace(state=target)
        draft.records[index] = record
        for exit_hook in self._exits[source, target]:
            exit_hook(self, draft, index)
        if branch.reason is None:
            return None
        if source in self.pre_commit and (record.bounce or record.read):
            raise Violation(
                "pure_revoke",
                f"r{index} ended {branch.reason} at or before the IO commit "
                f"holding {record.bounce} bounce pages / having read {record.read}",
            )
        if branch.reason == "filled" and draft.device < record.span_end:
            raise Violation(
                "splice_correctness", f"r{index} filled but the device ends at {draft.device}"
            )
        if record.pin != -1 or record.bounce:
            raise Violation(
                "exactly_once_end",
                f"r{index} ended {branch.reason} still holding "
                f"{'a pin' if record.pin != -1 else ''} {record.bounce or ''} bounce pages".strip(),
            )
        draft.records[index] = None
        return branch.reason

    def _choose(
        self, draft: _Draft, index: int, record: Rec, branches: tuple[BranchSpec, ...], args: Args
    ) -> BranchSpec:
        for branch in branches:
            if branch.guard is None or GUARDS[branch.guard](self, draft, index, record, args):
                return branch
        raise Violation(
            None, f"r{index}: no branch of ({record.state}) applies and there is no else"
        )

    def _note_choice(
        self,
        draft: _Draft,
        index: int,
        record: Rec,
        event: str,
        branches: tuple[BranchSpec, ...],
        branch: BranchSpec,
        args: Args,
        edges: set[Edge],
    ) -> None:
        """Called with every branch taken, before its effects run; the witness search
        (:mod:`.witnesses`) notes there which later guards also held."""

    # ------------------------------------------------------------------ actions

    def initial(self) -> State:
        b = self.bounds
        return (0, b.host_pages, *[self._intern(Slot(None, 0, -1))] * b.requests)

    def _intern(self, slot: Slot) -> int:
        """The number of ``slot`` (given once, on first sight)."""
        number = self._slot_ids.get(slot)
        if number is None:
            number = self._slot_ids[slot] = len(self._slots)
            self._slots.append(slot)
            record = slot.record
            self._pin_charge.append(0 if record is None else record.pin_charge)
            self._pin_at.append(-1 if record is None else record.pin)
            self._record_of.append(self._record_ids.setdefault(record, len(self._record_ids)))
            self._bounce_of.append(0 if record is None else record.bounce)
            self._owning.append(record is not None and record.state in self.owning)
            self._waiting_of.append(slot.waiting_on)
        return number

    def decode(self, state: State) -> World:
        return World(state[0], state[1], tuple(self._slots[number] for number in state[2:]))

    def actions(self, state: State) -> list[Step]:
        """Every action enabled in ``state``."""
        out: list[Step] = []
        device = state[0]
        pinned_at = 0
        for i, number in enumerate(state[2:]):
            key = (i, number, device < self._wants[i])
            steps = self._steps.get(key)
            if steps is None:
                steps = self._steps[key] = self._request_steps(i, self._slots[number], key[2])
            out += steps
            pinned_at = max(pinned_at, self._pin_at[number])
        if device > pinned_at:
            out.append(_EVICT)
        if device < self.bounds.pages and device < self.bounds.device_pages:
            out.append(_PUBLISH)
        return out

    def _request_steps(self, i: int, slot: Slot, below_want: bool) -> tuple[Step, ...]:
        """The steps request ``i`` can take from ``slot`` (memoised: few distinct slots)."""
        record = slot.record
        if record is None:
            return self._issue_steps(i, slot, below_want)
        out: list[Step] = []
        state = record.state
        lock = self._first_event("try_lock_anchor")
        if (state, lock) in self._rows:
            out.append(Step("event", i, lock))
        commit = self._first_event("poll")
        if (
            (state, commit) in self._rows
            and not record.op
            and (record.hit >= 0 or state in self.waiting_for_room)
        ):
            out.append(Step("event", i, commit))
            if self.draws_speeds:
                out.append(Step("event", i, commit, slower=True))
        if state in self.holds:
            out.append(Step("live", i, "plan"))
            if self._plan_then_consume:  # one pass plans and consumes back to back, or plans
                out.append(Step("live", i, "plan_consume"))
            elif record.plan >= 0:
                out.append(Step("live", i, "consume"))
        # (a design may have no call for these in some states: blind never releases a hold)
        for call in ("release_staged_hold", "release_aborted_request"):
            event = self._first_event(call)
            if (state, event) in self._rows:
                out.append(Step("event", i, event))
        if (state, self.give_up) in self._rows:
            out += [Step("event", i, self.give_up), Step("event", i, self.give_up, slower=True)]
        if record.op == "load":  # the copy into the device completes, or fails (never short)
            out += [Step("load", i, "full"), Step("load", i, "error")]
        elif record.op:  # L3 may have lost any tail of what is asked: every prefix is an outcome
            asked = record.span_end - record.matched if record.op == "exists" else record.read
            out += [Step(record.op, i, "full"), Step(record.op, i, "error")]
            out += [Step(record.op, i, "short", pages) for pages in range(1, asked)]
        return tuple(out)

    def _issue_steps(self, i: int, slot: Slot, below_want: bool) -> tuple[Step, ...]:
        """The issues request ``i`` can make, its record having ended (or never begun)."""
        if slot.issues >= self.bounds.issues_per_request:
            return ()
        issues = [Step("issue", i, "live")]
        if below_want:
            issues.append(Step("issue", i, "stale"))
        if self.draws_speeds:  # speeds that say even the whole span loads too slowly
            issues += [step._replace(slower=True) for step in issues]
        return tuple(issues)

    def describe(self, step: Step) -> str:
        """``step`` for a counterexample."""
        kind, what = step.kind, step.what
        if kind == "world":
            return {
                "evict": "world: evict one page",
                "publish": "world: a sibling publishes the next page",
            }[what]
        call = self._call_of  # the scheduler call the spec binds each step's event to
        text = {
            ("issue", "live"): "prefetch_from_storage",
            ("issue", "stale"): "prefetch_from_storage with a matched_len one page past the "
            "live prefix (stale)",
            ("event", "commit"): f"IO commit ({call.get('commit', 'poll')})",
            ("live", "plan"): f"{call.get('plan', 'plan')}(live prefix)",
            ("live", "consume"): f"{call.get('consume', 'consume')}(live prefix)",
            ("live", "plan_consume"): f"plan, then {call.get('consume', 'consume')} in the "
            "same pass",
            ("load", "full"): "H2D copy acknowledged",
        }.get((kind, what))
        if text is None:  # a call's event, or an existence query's or a read's completion
            text = call.get(what, what) if kind == "event" else f"{kind} completes {what}"
        if what == "short":
            text += f" ({step.pages} page{'s' if step.pages > 1 else ''} found)"
        if step.slower and what == self.give_up:
            text += ", the read has run longer than computing its tokens takes"
        elif step.slower:
            text += ", loads measured slower than computing"
        return f"r{step.request}: {text}"

    def successor(self, state: State, step: Step, edges: set[Edge], pinned: int = -1) -> State:
        """The stored state after ``step`` (its edges added to ``edges``).

        A request's step reads its own slot, the positions and the pinned total; the IO commit
        also reads the other records (in-flight dedup). The outcome is memoised under exactly
        that, so the spec's rows run once per distinct situation, not once per state; a step
        that reads another record outside the commit fails loudly
        (:data:`.model_world.HIDDEN`). ``pinned``: the state's pinned total, when the caller has
        it.
        """
        kind, i, what = step.kind, step.request, step.what
        if kind == "world":  # no record changes: the state stays canonical
            return (state[0] + (1 if what == "publish" else -1), *state[1:])
        own = state[2 + i]
        reads_others = what in self._reads_others
        if reads_others:  # the other records, not whom they wait on or how often they issued
            records = self._record_of
            key: tuple[object, ...] = (
                step,
                state[0],
                state[1],
                own,
                *[records[n] for n in state[2:]],
            )
        else:
            charges = self._pin_charge
            if pinned < 0:
                pinned = sum([charges[number] for number in state[2:]])
            key = (step, state[0], state[1], pinned - charges[own], own)
        outcome = self._memo.get(key)
        if outcome is None:
            draft = _Draft.of(self.decode(state), -1 if reads_others else i)
            fired: set[Edge] = set()
            self.apply(draft, step, fired)
            edges |= fired
            slot = Slot(_live_fields(self, draft.records[i]), draft.issues[i], draft.waiting_on[i])
            outcome = (self._intern(slot), draft.device, draft.host_free, draft.woke)
            self._memo[key] = outcome
        number, device, host_free, woke = outcome
        changed = [device, host_free, *state[2:]]
        changed[2 + i] = number
        if woke:
            waiting = self._waiting_of
            for j in range(2, len(changed)):
                if waiting[changed[j]] == i:
                    changed[j] = self._wake(changed[j])
        return tuple(changed)

    def _wake(self, number: int) -> int:
        """Slot ``number`` with its wait over."""
        woken = self._woken.get(number)
        if woken is None:
            woken = self._woken[number] = self._intern(self._slots[number]._replace(waiting_on=-1))
        return woken

    def apply(self, draft: _Draft, step: Step, edges: set[Edge]) -> None:
        """Run a request's ``step`` on ``draft`` through the spec's rows."""
        kind, i, what = step.kind, step.request, step.what
        if kind == "issue":
            self._issue(draft, i, what == "stale", step.slower, edges)
        elif kind == "event":
            self._fire(draft, i, what, Args(host_slack=step.slack, slower=step.slower), edges)
        elif kind == "live":
            args = Args(prefix=draft.device)
            for call in _LIVE_CALLS[what]:  # each call's events in order, until one ends it
                for event in self._calls[call]:
                    if self._fire(draft, i, event, args, edges) is not None:
                        return
                record = draft.records[i]
                if record is None or record.state not in self.holds:
                    return  # the plan released the hold, or the splice moved it on
        else:
            self._complete(draft, i, step, edges)

    def _first_event(self, call: ApiCall) -> str:
        """The first event the spec binds to ``call`` ("" for a call the design lacks)."""
        return self._calls.get(call, ("",))[0]

    def _issue(
        self, draft: _Draft, index: int, stale: bool, slower: bool, edges: set[Edge]
    ) -> None:
        """Issue as a scheduler does, with the live match or one measured before an eviction."""
        want = self._wants[index]
        draft.issues[index] += 1
        draft.waiting_on[index] = -1
        matched = min(draft.device + stale, want)
        draft.records[index] = Rec(self.spec.initial, matched, want)
        if self._fire(draft, index, self.spec.issue_event, Args(slower=slower), edges) is None:
            record = draft.records[index]
            assert record is not None
            draft.records[index] = record._replace(op="exists")

    def _complete(self, draft: _Draft, index: int, step: Step, edges: set[Edge]) -> None:
        """Request ``index``'s operation of kind ``step.kind`` completes as ``step.what`` says;
        it fires the event the spec's ``completions`` names."""
        record = draft.records[index]
        assert record is not None
        kind, mode = cast(CompletionKind, step.kind), step.what
        if mode == "short":
            found = step.pages
        elif mode == "error" or kind == "load":
            found = 0
        else:
            found = record.span_end - record.matched if kind == "exists" else record.read
        draft.records[index] = record._replace(op="")
        event = self.spec.completions[kind]
        self._fire(draft, index, event, Args(tokens=found, error=mode == "error"), edges)

    # ------------------------------------------------------------------ invariants

    def check(self, state: State, host_pages: int = -1) -> None:
        """The invariants of one state: the pools and the cap over all requests, then each
        request's own (remembered per request, slot and device: they read nothing else).
        ``host_pages``: the bounce capacity, where a rank's differs from the bounds'."""
        b = self.bounds
        host_pages = b.host_pages if host_pages < 0 else host_pages
        device, host_free, numbers = state[0], state[1], state[2:]
        if not 0 <= device <= min(b.pages, b.device_pages):
            raise Violation(
                "aux_and_ownership", f"device conservation: device holds {device} pages"
            )
        bounce = sum([self._bounce_of[number] for number in numbers])
        if host_free < 0 or host_free + bounce != host_pages:
            raise Violation(
                "hold_release", f"{host_free} free + {bounce} owned != {host_pages} host pages"
            )
        pinned = sum([self._pin_charge[number] for number in numbers])
        if pinned > b.cap_pages:
            raise Violation("pin_balance", f"{pinned} pinned pages over the cap")
        for i, number in enumerate(numbers):
            waiting_on = self._waiting_of[number]
            if waiting_on >= 0 and not self._owning[numbers[waiting_on]]:
                raise Violation("dedup_waiters", f"r{i} waits on r{waiting_on}, which owns nothing")
            if (i, number, device) not in self._checked:
                self._check_request(i, self._slots[number], device)
                self._checked.add((i, number, device))

    def _check_request(self, i: int, slot: Slot, device: int) -> None:
        record, issues, _waiting_on = slot
        if issues > self.bounds.issues_per_request or (record is not None and not issues):
            raise Violation("exactly_once_end", f"r{i} is live after {issues} issues")
        if record is None:
            return
        if record.pin > device:
            raise Violation(
                "pin_safety", f"r{i} pins position {record.pin} but the device ends at {device}"
            )
        levels = self._levels[record.state]
        for resource, level, held in (
            ("pin", levels[0], record.pin >= 0),
            ("bounce", levels[1], record.bounce > 0),
        ):
            if (level == "always" and not held) or (level == "none" and held):
                if resource == "pin":
                    invariant = "pin_balance"
                else:
                    invariant = "pure_revoke" if record.state in self.pre_commit else "hold_release"
                raise Violation(
                    invariant,
                    f"r{i} in {record.state!r} {'holds' if held else 'lacks'} its "
                    f"{resource} (the spec says {level})",
                )

    # ------------------------------------------------------------------ search

    def run(self) -> Result:
        """Breadth first over canonical states (:func:`breadth_first`), then progress from
        every state reached (:meth:`progress_failure`)."""
        edges: set[Edge] = set()
        search = self.explore(edges)
        if search.failure is None and not search.truncated:
            search.failure = self.progress_failure(search)
        return self.result(search, edges, self.describe)

    # ------------------------------------------------------------------ progress

    def progress_failure(self, search: Search[State, Step]) -> tuple[list[Step], Violation] | None:
        """The ``progress`` invariant: from every state reached, with no new issue, abort,
        release or publish, the IO completing and the scheduler polling and admitting (evicting
        for it) lead every live record to its end.

        The drain's IO commits never find loads slower than computing: a record that ends
        only if the measured speeds decline it is a record that may never end.

        From each state (breadth first, so the first failure has the shortest prefix) the drain
        takes the first move of :data:`_DRAIN_PLACE` that changes the state, until no record is
        live; a state whose drain ended is remembered, so each state is drained once. A drain
        that finds no move, or comes back to a state it passed, is a record that never ends:
        the path to the state, then the drain's moves, is the counterexample."""
        drained: set[State] = set()
        scratch: set[Edge] = set()
        for start in search.parents:
            state, passed, moves = start, list[State](), list[Step]()
            while state not in drained and self._live(state):
                move = self._drain_move(state, scratch)
                if move is None or state in passed:
                    records = [self._slots[number].record for number in state[2:]]
                    live = [f"r{i} in {r.state!r}" for i, r in enumerate(records) if r is not None]
                    parent = search.parents[start]
                    path = [] if parent is None else path_to(search.parents, *parent)
                    return path + moves, Violation(
                        "progress",
                        f"{', '.join(live)} never end{'s' if len(live) == 1 else ''}: with "
                        "every IO operation completing and the scheduler polling and admitting, "
                        f"{'it comes back to a state it passed' if move else 'nothing moves'}",
                    )
                passed.append(state)
                moves.append(move[0])
                state = move[1]
            drained.update(passed)
        return None

    def _live(self, state: State) -> bool:
        return any(self._slots[number].record is not None for number in state[2:])

    def _drain_move(self, state: State, edges: set[Edge]) -> tuple[Step, State] | None:
        """The drain's move from ``state`` and where it leads (None: no move changes it)."""
        place = _DRAIN_PLACE
        moves = sorted(
            (place[step.kind if step.what == "full" else step.what], order, step)
            for order, step in enumerate(self.actions(state))
            if (step.what in ("full", "commit", "evict") or step.kind == "live")
            and not step.slower  # the speeds may never say a load is slower: no way out
        )
        for _, _, step in moves:
            if (after := self.successor(state, step, edges)) != state:
                return step, after
        return None

    def explore(self, edges: set[Edge]) -> Search[State, Step]:
        """Every reachable state, the edges fired on the way added to ``edges``."""
        return breadth_first(
            self.initial(),
            lambda world: self._successors(world, edges),
            self.check,
            self.bounds.max_states,
        )

    def _successors(
        self, world: State, edges: set[Edge]
    ) -> Iterator[tuple[Step, State | Violation]]:
        pinned = sum([self._pin_charge[number] for number in world[2:]])
        return attempts(
            self.actions(world), lambda step: self.successor(world, step, edges, pinned)
        )

    def result(
        self, search: Search[StateT, StepT], edges: set[Edge], describe: Callable[[StepT], str]
    ) -> Result:
        """What ``search`` found: its counterexample as numbered steps, or what it reached."""
        reached = {state for edge in edges for state in (edge[0], self._targets[edge])}
        result = Result(len(search.parents), edges, reached, truncated=search.truncated)
        if search.failure is not None:
            path, violation = search.failure
            result.counterexample = [describe(taken) for taken in path]
            result.violation, result.invariant = str(violation), violation.invariant
            if violation.invariant != "progress":
                return result  # the search stopped there: what it reached is not everything
        result.unreached_edges = [
            edge
            for edge in self.all_edges()
            if edge not in edges and edge[2] not in NOT_MODELLED_GUARDS
        ]
        result.unreached_states = [s for s in self.spec.states if s not in reached]
        return result

    def all_edges(self) -> list[Edge]:
        return self.spec.edges()
