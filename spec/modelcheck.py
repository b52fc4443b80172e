"""Exhaustive model checking of the lifecycle spec over a small abstract world.

Theory of operation
-------------------
The checker runs the spec's own transition table (rows, ordered guarded branches, effects and
reasons, exactly as ``lifecycle.yaml`` declares them) against an abstract world small enough to
enumerate, and explores every interleaving breadth first.

The world is one token line of ``pages`` pages in one namespace, positions instead of nodes:

* ``device``: the line's prefix on the device (pages); ``l3``: its prefix in L3;
* ``host_free``: free bounce pages out of ``host_pages``; the device pool holds ``device_pages``;
* one record slot per request; request ``i`` wants the first ``pages - i`` pages, so spans
  overlap wholly or partly.

A node split changes no position, so it is the identity here (anchors are re-matched by
position); the stateful fuzzer covers real splits, namespaces and the sliding-window aux pool,
which this world leaves out (the ``aux_cut`` branches are listed as not modelled).

Actions are the scheduler's (issue, lock, the IO commit, plan and consume against the live
prefix, abort, release a hold) and the world's (an IO operation completes fully, short or with an
error; evict a page; a sibling publishes a page; L3 drops a page). After every action the
invariants of DESIGN §4 that the abstraction can state are checked, including the resources each
state must hold per the spec. BFS makes the first counterexample a shortest one; it is printed
as numbered steps. Every state and edge of the spec must also be reached ("sometimes" checks).

``spec/`` imports no torch and no runtime: guards and effects are re-stated here over positions,
one small function each, next to the pipeline's names.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from .schema import SAME, BranchSpec, LifecycleSpec

OWNING = frozenset({"reading", "staged", "trimmed", "consumed"})
PRE_COMMIT = frozenset({"issued", "locked", "no_anchor", "cap_skip", "anchor_lost", "parked"})
HOLDS = ("staged", "trimmed")
NOT_MODELLED_GUARDS = frozenset({"aux_cut"})
"""Guards of parts the abstract world leaves out (no sliding-window aux pool)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The size of the abstract world; the defaults reach every modelled edge in seconds."""

    pages: int = 4
    requests: int = 2
    host_pages: int = 2
    device_pages: int = 3
    cap_pages: int = 2
    threshold_pages: int = 2
    issues_per_request: int = 2
    max_states: int = 5_000_000


class Rec(NamedTuple):
    """One live record over positions (a tuple: copied with ``_replace`` on every effect)."""

    state: str
    matched: int
    span_end: int
    pin: int = -1
    """Pinned position (-1: none); an anchor pin is charged ``matched`` pages to the cap."""
    pin_charge: int = 0
    hit: int = -1
    bounce: int = 0
    read: int = 0
    plan: int = -1
    op: str | None = None


@dataclass(frozen=True, slots=True)
class World:
    device: int
    l3: int
    host_free: int
    records: tuple[Rec | None, ...]
    issues: tuple[int, ...]
    ends: tuple[int, ...]
    retry: tuple[bool, ...]
    waiting_on: tuple[int, ...]

    def pinned_total(self) -> int:
        return sum(r.pin_charge for r in self.records if r is not None)


@dataclass(frozen=True, slots=True)
class Args:
    tokens: int = 0
    error: bool = False
    prefix: int = 0


class Violation(Exception):
    """An invariant failed; ``str`` names it."""


@dataclass(slots=True)
class _Draft:
    """A mutable copy of a :class:`World` while one action runs."""

    device: int
    l3: int
    host_free: int
    records: list[Rec | None]
    issues: list[int]
    ends: list[int]
    retry: list[bool]
    waiting_on: list[int]

    @classmethod
    def of(cls, world: World) -> _Draft:
        return cls(
            world.device,
            world.l3,
            world.host_free,
            list(world.records),
            list(world.issues),
            list(world.ends),
            list(world.retry),
            list(world.waiting_on),
        )

    def freeze(self) -> World:
        return World(
            self.device,
            self.l3,
            self.host_free,
            tuple(self.records),
            tuple(self.issues),
            tuple(self.ends),
            tuple(self.retry),
            tuple(self.waiting_on),
        )

    def pinned_total(self) -> int:
        return sum(r.pin_charge for r in self.records if r is not None)


Guard = Callable[["ModelChecker", _Draft, int, Rec, Args], bool]
Effect = Callable[["ModelChecker", _Draft, int, Rec, Args], Rec]
Edge = tuple[str, str, str]


@dataclass
class Result:
    states: int
    edges: dict[Edge, int]
    states_reached: set[str]
    counterexample: list[str] | None = None
    violation: str | None = None
    truncated: bool = False
    unreached_edges: list[Edge] = field(default_factory=list)
    unreached_states: list[str] = field(default_factory=list)


class ModelChecker:
    def __init__(self, spec: LifecycleSpec, bounds: Bounds | None = None) -> None:
        self.spec = spec
        self.bounds = bounds or Bounds()
        self._rows = {(state, event): branches for state, event, branches in spec.rows()}
        self._levels = {
            name: (state.level("pin").value, state.level("bounce").value)
            for name, state in spec.states.items()
        }
        self._targets = {
            (state, event, branch.guard or "else"): spec.target_of(state, branch)
            for state, event, branches in spec.rows()
            for branch in branches
        }
        missing = (set(spec.guards) - set(GUARDS)) | (set(spec.effects) - set(EFFECTS))
        if missing:
            raise ValueError(
                f"the model checker has no abstract meaning for {sorted(missing)}; add one to "
                "spec/modelcheck.py next to the pipeline's implementation"
            )

    # ------------------------------------------------------------------ firing

    def _fire(
        self, draft: _Draft, index: int, event: str, args: Args, edges: set[Edge]
    ) -> str | None:
        """Run ``event`` on request ``index``; return the reason it ended with, if any."""
        record = draft.records[index]
        assert record is not None
        branches = self._rows.get((record.state, event))
        if branches is None:
            raise Violation(f"r{index}: event {event!r} fired in state {record.state!r}")
        branch = self._choose(draft, index, record, branches, args)
        edges.add((record.state, event, branch.guard or "else"))
        source = record.state
        for effect in branch.effects:
            record = EFFECTS[effect](self, draft, index, record, args)
            draft.records[index] = record
        target = source if branch.to == SAME else branch.to
        record = record._replace(state=target)
        draft.records[index] = record
        if source in OWNING and target not in OWNING:
            self._wake_waiters(draft, index)
        if branch.reason is None:
            return None
        if source in PRE_COMMIT and (record.bounce or record.read):
            raise Violation(
                f"pure_revoke: r{index} ended {branch.reason} at or before the IO commit "
                f"holding {record.bounce} bounce pages / having read {record.read}"
            )
        if branch.reason == "filled" and draft.device < record.span_end:
            raise Violation(
                f"splice_correctness: r{index} filled but the device ends at {draft.device}"
            )
        if record.pin != -1 or record.bounce:
            raise Violation(
                f"exactly_once_end: r{index} ended {branch.reason} still holding "
                f"{'a pin' if record.pin != -1 else ''} {record.bounce or ''} bounce pages".strip()
            )
        draft.records[index] = None
        draft.ends[index] += 1
        return branch.reason

    def _choose(
        self, draft: _Draft, index: int, record: Rec, branches: tuple[BranchSpec, ...], args: Args
    ) -> BranchSpec:
        for branch in branches:
            if branch.guard is None or GUARDS[branch.guard](self, draft, index, record, args):
                return branch
        raise Violation(f"r{index}: no branch of ({record.state}) applies and there is no else")

    def _wake_waiters(self, draft: _Draft, index: int) -> None:
        for waiter, sibling in enumerate(draft.waiting_on):
            if sibling == index:
                draft.waiting_on[waiter] = -1  # its retry (armed) is due at once

    # ------------------------------------------------------------------ actions

    def initial(self) -> World:
        b = self.bounds
        k = b.requests
        return World(
            0, b.pages, b.host_pages, (None,) * k, (0,) * k, (0,) * k, (False,) * k, (-1,) * k
        )

    def want(self, index: int) -> int:
        return self.bounds.pages - index

    def actions(self, world: World) -> list[tuple[str, Callable[[_Draft, set[Edge]], None]]]:
        """Every action enabled in ``world``, with a label for counterexamples."""
        out: list[tuple[str, Callable[[_Draft, set[Edge]], None]]] = []
        b = self.bounds
        for i, record in enumerate(world.records):
            if record is None:
                if world.issues[i] < b.issues_per_request:
                    out.append((f"r{i}: prefetch_from_storage", self._issue(i, stale=False)))
                    if world.device < self.want(i):
                        stale = "with a matched_len one page past the live prefix (stale)"
                        out.append((f"r{i}: prefetch_from_storage {stale}", self._issue(i, True)))
                continue
            state = record.state
            if (state, "lock") in self._rows:
                out.append((f"r{i}: try_lock_anchor", self._event(i, "lock", Args())))
            if (
                (state, "commit") in self._rows
                and record.op is None
                and (record.hit >= 0 or state == "parked")
            ):
                out.append((f"r{i}: IO commit (poll)", self._event(i, "commit", Args())))
            if state in HOLDS:
                out.append((f"r{i}: plan_staged_splice(live prefix)", self._live(i, "plan")))
                if record.plan >= 0:
                    out.append((f"r{i}: init_load_back(live prefix)", self._live(i, "consume")))
                out.append((f"r{i}: release_staged_hold", self._event(i, "release_hold", Args())))
            out.append((f"r{i}: release_aborted_request", self._event(i, "abort", Args())))
            if record.op is not None:
                out += self._completions(world, i, record)
        if world.device > max([r.pin for r in world.records if r is not None] + [0]):
            out.append(("world: evict one page", self._evict))
        if world.device < b.pages and world.device < b.device_pages:
            out.append(("world: a sibling publishes the next page", self._publish))
        if world.l3 > 0:
            out.append(("world: L3 drops its last page", self._drop))
        return out

    def _issue(self, index: int, stale: bool) -> Callable[[_Draft, set[Edge]], None]:
        """Issue as a scheduler does, with the live match or one measured before an eviction."""

        def run(draft: _Draft, edges: set[Edge]) -> None:
            want = self.want(index)
            draft.issues[index] += 1
            draft.retry[index] = False
            draft.waiting_on[index] = -1
            matched = min(draft.device + stale, want)
            draft.records[index] = Rec("issued", matched, want)
            if self._fire(draft, index, "lock", Args(), edges) is None:
                record = draft.records[index]
                assert record is not None
                draft.records[index] = record._replace(op="exists")

        return run

    def _event(self, index: int, event: str, args: Args) -> Callable[[_Draft, set[Edge]], None]:
        def run(draft: _Draft, edges: set[Edge]) -> None:
            self._fire(draft, index, event, args, edges)

        return run

    def _live(self, index: int, event: str) -> Callable[[_Draft, set[Edge]], None]:
        def run(draft: _Draft, edges: set[Edge]) -> None:
            self._fire(draft, index, event, Args(prefix=draft.device), edges)

        return run

    def _completions(
        self, world: World, index: int, record: Rec
    ) -> list[tuple[str, Callable[[_Draft, set[Edge]], None]]]:
        op = record.op
        if op == "load":
            return [(f"r{index}: H2D copy acknowledged", self._complete(index, "ack", "full"))]
        event = "hit" if op == "exists" else "read_done"
        return [
            (f"r{index}: {op} completes {mode}", self._complete(index, event, mode))
            for mode in ("full", "short", "error")
        ]

    def _complete(self, index: int, event: str, mode: str) -> Callable[[_Draft, set[Edge]], None]:
        def run(draft: _Draft, edges: set[Edge]) -> None:
            record = draft.records[index]
            assert record is not None
            if event == "hit":
                found = max(0, min(draft.l3, record.span_end) - record.matched)
            elif event == "read_done":
                found = max(0, min(draft.l3 - record.matched, record.read))
            else:
                found = 0
            if mode == "short":
                found = max(0, found - 1)
            draft.records[index] = record._replace(op=None)
            self._fire(draft, index, event, Args(tokens=found, error=mode == "error"), edges)

        return run

    @staticmethod
    def _evict(draft: _Draft, edges: set[Edge]) -> None:
        draft.device -= 1

    @staticmethod
    def _publish(draft: _Draft, edges: set[Edge]) -> None:
        draft.device += 1

    @staticmethod
    def _drop(draft: _Draft, edges: set[Edge]) -> None:
        draft.l3 -= 1

    # ------------------------------------------------------------------ invariants

    def check(self, world: World) -> None:
        b = self.bounds
        if not 0 <= world.device <= min(b.pages, b.device_pages):
            raise Violation(f"device_conservation: device holds {world.device} pages")
        bounce = sum(r.bounce for r in world.records if r is not None)
        if world.host_free < 0 or world.host_free + bounce != b.host_pages:
            raise Violation(
                f"hold_release: {world.host_free} free + {bounce} owned "
                f"!= {b.host_pages} host pages"
            )
        if world.pinned_total() > b.cap_pages:
            raise Violation(f"pin_balance: {world.pinned_total()} pinned pages over the cap")
        for i, record in enumerate(world.records):
            if world.ends[i] + (record is not None) != world.issues[i]:
                raise Violation(
                    f"exactly_once_end: r{i} issued {world.issues[i]}, ended {world.ends[i]}"
                )
            if world.waiting_on[i] >= 0:
                owner = world.records[world.waiting_on[i]]
                if owner is None or owner.state not in OWNING:
                    raise Violation(
                        f"dedup: r{i} waits on r{world.waiting_on[i]}, which owns nothing"
                    )
            if record is None:
                continue
            if record.pin > world.device:
                raise Violation(
                    f"pin_safety: r{i} pins position {record.pin} but the device ends at "
                    f"{world.device}"
                )
            levels = self._levels[record.state]
            for resource, level, held in (
                ("pin", levels[0], record.pin >= 0),
                ("bounce", levels[1], record.bounce > 0),
            ):
                if (level == "always" and not held) or (level == "none" and held):
                    raise Violation(
                        f"holds: r{i} in {record.state!r} {'holds' if held else 'lacks'} its "
                        f"{resource} (the spec says {level})"
                    )

    # ------------------------------------------------------------------ search

    def run(self) -> Result:
        start = self.initial()
        parents: dict[World, tuple[World, str] | None] = {start: None}
        edges: dict[Edge, int] = {}
        reached: set[str] = set()
        queue = deque([start])
        truncated = False
        while queue:
            world = queue.popleft()
            for label, action in self.actions(world):
                draft = _Draft.of(world)
                fired: set[Edge] = set()
                try:
                    action(draft, fired)
                    successor = draft.freeze()
                    self.check(successor)
                except Violation as violation:
                    return self._failed(parents, world, label, str(violation), edges, reached)
                for edge in fired:
                    edges[edge] = edges.get(edge, 0) + 1
                    reached.update((edge[0], self._targets[edge]))
                if successor not in parents:
                    if len(parents) >= self.bounds.max_states:
                        truncated = True
                        continue
                    parents[successor] = (world, label)
                    queue.append(successor)
        result = Result(len(parents), edges, reached, truncated=truncated)
        result.unreached_edges = [
            edge
            for edge in self.all_edges()
            if edge not in edges and edge[2] not in NOT_MODELLED_GUARDS
        ]
        result.unreached_states = [s for s in self.spec.states if s not in reached]
        return result

    def all_edges(self) -> list[Edge]:
        return self.spec.edges()

    def _failed(
        self,
        parents: dict[World, tuple[World, str] | None],
        world: World,
        label: str,
        violation: str,
        edges: dict[Edge, int],
        reached: set[str],
    ) -> Result:
        steps = [label]
        node: World | None = world
        while node is not None:
            parent = parents[node]
            if parent is None:
                break
            node, step = parent
            steps.append(step)
        steps.reverse()
        return Result(len(parents), edges, reached, steps, violation)


# ---------------------------------------------------------------------- guards over positions


def _read_pages(record: Rec) -> int:
    return min(record.hit, record.span_end - record.matched)


def _owns(other: Rec | None, j: int, i: int, start: int, end: int) -> bool:
    """Record ``j`` (not ``i``) owns pages ``[start, end)`` for in-flight dedup."""
    if j == i or other is None or other.state not in OWNING or not other.read or end <= start:
        return False
    return other.matched <= start and end <= min(other.matched + other.read, other.span_end)


def _span_inflight(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> bool:
    start, end = r.matched, r.matched + _read_pages(r)
    return any(_owns(other, j, i, start, end) for j, other in enumerate(d.records))


GUARDS: dict[str, Guard] = {
    "below_threshold": lambda mc, d, i, r, a: r.span_end - r.matched < mc.bounds.threshold_pages,
    "root_prefix": lambda mc, d, i, r, a: r.matched == 0,
    "live_match_short": lambda mc, d, i, r, a: d.device < r.matched,
    "over_cap": lambda mc, d, i, r, a: d.pinned_total() + r.matched > mc.bounds.cap_pages,
    "zero_pages": lambda mc, d, i, r, a: a.error or a.tokens == 0,
    "hit_below_threshold": lambda mc, d, i, r, a: a.tokens < mc.bounds.threshold_pages,
    "device_covers_span": lambda mc, d, i, r, a: d.device >= r.span_end,
    "span_inflight": _span_inflight,
    "host_short": lambda mc, d, i, r, a: d.host_free < _read_pages(r),
    "read_empty": lambda mc, d, i, r, a: a.error or a.tokens == 0,
    "prefix_shrank": lambda mc, d, i, r, a: a.prefix < r.matched,
    "span_device_resident": lambda mc, d, i, r, a: a.prefix >= r.span_end,
    "aux_cut": lambda mc, d, i, r, a: False,
    "trim_positive": lambda mc, d, i, r, a: a.prefix > r.matched,
    "plan_stale": lambda mc, d, i, r, a: a.prefix != r.plan,
    "device_short": lambda mc, d, i, r, a: mc.bounds.device_pages - d.device < r.span_end - r.plan,
}


# ---------------------------------------------------------------------- effects over positions


def _pin_if_possible(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    if r.pin >= 0 or r.matched == 0 or d.device < r.matched:
        return r
    if d.pinned_total() + r.matched > mc.bounds.cap_pages:
        return r
    return r._replace(pin=r.matched, pin_charge=r.matched)


def _alloc_bounce(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    pages = _read_pages(r)
    d.host_free -= pages
    return r._replace(bounce=r.bounce + pages)


def _stage_read(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    kept = min(a.tokens, r.bounce)
    d.host_free += r.bounce - kept
    return r._replace(bounce=kept, span_end=r.matched + kept)


def _free_bounce(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    d.host_free += r.bounce
    return r._replace(bounce=0)


def splice(d: _Draft, i: int, base: int, end: int) -> None:
    """Insert pages ``[base, end)``: add-only, so the device must end exactly at ``base``."""
    if end <= base:
        raise Violation(f"splice: r{i} splices pages [{base}, {end}): nothing, or backwards")
    if d.device != base:
        raise Violation(
            f"add_only_insert: r{i} splices pages [{base}, {end}) but the device holds "
            f"{d.device}: it would overwrite a sibling's pages or leave a hole"
        )
    d.device = end


def _insert_tail(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    splice(d, i, r.plan, r.span_end)
    return r


def _wait_for_sibling(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    start, end = r.matched, r.matched + _read_pages(r)
    for j, other in enumerate(d.records):
        if _owns(other, j, i, start, end):
            d.waiting_on[i] = j
            return r
    raise Violation(f"dedup: r{i} declined in flight but no sibling owns its span")


def _arm_retry(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    d.retry[i] = True
    return r


EFFECTS: dict[str, Effect] = {
    "pin_anchor": lambda mc, d, i, r, a: r._replace(pin=r.matched, pin_charge=r.matched),
    "pin_if_possible": _pin_if_possible,
    "unpin": lambda mc, d, i, r, a: r._replace(pin=-1, pin_charge=0),
    "arm_retry": _arm_retry,
    "record_hit": lambda mc, d, i, r, a: r._replace(hit=a.tokens),
    "enqueue_parked": lambda mc, d, i, r, a: r,
    "alloc_bounce": _alloc_bounce,
    "launch_read": lambda mc, d, i, r, a: r._replace(read=_read_pages(r), op="read"),
    "stage_read": _stage_read,
    "free_bounce": _free_bounce,
    "record_plan": lambda mc, d, i, r, a: r._replace(plan=a.prefix),
    "alloc_device": lambda mc, d, i, r, a: r,  # the device pool is `device`: insert_tail grows it
    "queue_h2d": lambda mc, d, i, r, a: r._replace(op="load"),
    "insert_tail": _insert_tail,
    "move_pin": lambda mc, d, i, r, a: r._replace(pin=r.span_end, pin_charge=0),
    "wait_for_sibling": _wait_for_sibling,
}
