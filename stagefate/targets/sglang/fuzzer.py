"""A Hypothesis state machine over SGLang's buffer-mode pipeline, with the invariants of
docs/design.md §10.

The world is the one stagefate's own fuzzer plays (:mod:`stagefate.fuzz.fuzzer`), on SGLang's
code through :class:`~.pipeline_driver.SteppedSGLang` (the driver of the installed release's API
generation): three token sequences sharing heads (anchors collide, nodes split) written to L3
under two namespaces before the program starts; rules issue
(with the live match or a stale one), run the existence queries, run the reads (whole, or every
page failing as an IO error; a read is short when L3 lost part of its span), answer one query or
land one read while the others are held past it (and past whatever moves come between), grow
the running batch's decode (its KV competes with the tree and admissions for the device pool,
and retracts a request when nothing is left to evict), retract a running request, tick the
scheduler, admit (and abort it while its load back is in flight), abort (a live request, or
one whose read an earlier abort abandoned), evict, publish the head, half or whole of a
sequence as a sibling would, and drop L3 objects. The invariants are what any correct
implementation keeps, read from SGLang's own state:

* pinned tokens equal the sum of the anchor locks, and stay within the cap;
* an admission loads only what the device lacks of the staged span (the trim);
* a locked anchor is never evicted;
* every device slot of every sequence holds its mark (bytes spliced equal the producer's, and
  no splice crosses namespaces: the namespaces' marks differ);
* every device slot and every slot of the host bounce buffer has exactly one owner: free, or
  held by the tree or by one of SGLang's operations and books (:mod:`.slot_owners`);
* SGLang's own ``sanity_check`` passes;
* at quiescence (everything aborted or admitted, the pipeline settled): no anchor lock, no
  prefetch in flight, no staged hold, the host pool back at its baseline, every device slot
  either free or in the tree, ``is_idle``, no structure of SGLang's naming a request, and
  SGLang's own count of prefetches issued equal to the existence queries the world was given,
  and (0.5.20 on) the storage-hit tokens it exports, less those it exports as unfulfilled,
  equal to what the world's admissions loaded plus what aborts and retractions left out of its
  metrics (:mod:`.hit_accounting`);
* SGLang's run follows its own design: the transition log its decisions write
  (:mod:`.design_log`) is valid against the design its release and knobs follow
  (``spec/designs/``) and every record in it ended (``fuzz --target sglang --log FILE`` keeps
  each program's log).

:data:`OUTCOMES` counts what SGLang decided over a campaign (its ``try_lock_anchor`` outcomes,
its prefetch outcome counters, and the tokens of storage hits left undelivered by its drop
reason), so a report says which of its branches were reached.
"""

from __future__ import annotations

import io
import logging
import zlib
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hypothesis import reject, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from rich.console import Console

from ...fuzz.world import NAMESPACES, sequences
from ...output_files import write_atomically
from ...transition_log import TransitionLog, validate_log
from . import require
from .design_log import design_path, load_design, watch_design
from .fuzz_config import PAGE, FuzzConfig, configurations
from .generations import stepped_sglang
from .hit_accounting import HitMetrics, keeps_hit_metrics
from .pipeline_driver import SteppedSGLang, Undeployable
from .request_books import per_request_books
from .waste import (
    RELEASE,
    WASTE,
    Call,
    Comparison,
    ReadTokens,
    RecordingDriver,
    Waste,
    WastedMore,
    replay,
    spliced,
    twin_config,
)

SEQUENCES = sequences(PAGE, shared_pages=(4, 2), tails=(200, 300))
"""The fuzz world's sequences at SGLang's page size: 8 pages each, sharing 4 and 2 pages."""
OUTCOMES: Counter[str] = Counter()
"""SGLang's decisions seen over a campaign: ``lock:<outcome>`` and its prefetch counters."""
STATES = Counter[str]()
"""``steps`` (checked states) and ``programs`` of a campaign."""
ADMISSION_PASSES = 40
"""Scheduling passes (with the IO keeping up and every live request tried for admission) in
which every request must admit or end: 0.5.20 and later defer a hold up to 32 times
(``defer_staged_admission``)."""
RETRY_PASSES = 200
"""Scheduling passes the retry bound is checked over (25 paced intervals at SGLang's default)."""
DESIGNED_STOP_POLICY = "wait_complete"
"""The one stop policy SGLang's designs (spec/designs/) describe: they leave the deadline of
``timeout`` and ``best_effort`` out, so a program under those keeps every other invariant but is
not held to a design."""
DESIGN_EDGES: dict[Path, set[tuple[str, str, str]]] = {}
"""Each design SGLang's runs were checked against (a release and its knobs: 0.5.19 with the
anchor lock on follows another), with the edges the programs' validated logs took."""


def fuzz_world(
    config: FuzzConfig, namespaces: tuple[str | None, ...] = NAMESPACES, core: str = "python"
) -> SteppedSGLang:
    """SGLang deployed as ``config`` says (on its ``core`` tree), every sequence in L3 under
    ``namespaces``."""
    driver = stepped_sglang(**config.driver_settings(), core=core)
    for namespace in namespaces:
        for tokens in SEQUENCES:
            driver.produce(tokens, namespace)
    return driver


@dataclass(frozen=True)
class KeepL3:
    """Which L3 objects a ``drop_l3`` move keeps: about seven in eight, by name and seed (a
    value, not a closure, so a recorded program pickles to another release's process)."""

    seed: int

    def __call__(self, name: str) -> bool:
        return (zlib.crc32(name.encode()) + self.seed) % 8 != 0


class SGLangPipelineFuzzer(RuleBasedStateMachine):
    core = "python"
    sanity_check = True
    """Call SGLang's own ``sanity_check`` after every step (``fuzz --set-aside sanity_check``
    turns it off, to look past a release's known failure of it: docs/sglang-findings.md)."""
    namespaces: tuple[str | None, ...] = NAMESPACES
    """The namespaces requests and publishes use (``--set-aside namespaces``: the root only, to
    look past 0.5.19's L3 keys that ignore the namespace)."""
    log_path: str | None = None
    """Where each program's design log is written (the last one's that fired a transition under
    the designed stop policy, or the failing one's)."""
    pins: Mapping[str, Any] = MappingProxyType({})
    """The :class:`~.fuzz_config.FuzzConfig` fields every program keeps (``fuzz --config``)."""
    compare: tuple[str, Any] | None = None
    """``(field, value)``: replay each program on a twin whose configuration differs in that
    field, and compare their waste (:mod:`.waste`; ``fuzz --compare``)."""
    waste_fails: str | None = None
    """``drawn`` or ``twin``: a program in which that side wastes more than the other fails
    (:class:`~.waste.WastedMore`), so Hypothesis shrinks it (``fuzz --waste-fails``)."""
    driver: SteppedSGLang
    """Built by :meth:`configure`, the program's first move."""

    def __init__(self) -> None:
        super().__init__()
        self.issued = 0
        STATES["programs"] += 1

    @initialize(data=st.data())
    def configure(self, data: st.DataObject) -> None:
        """The program's deployment (:mod:`.fuzz_config`), then the world: every sequence in L3
        under both namespaces."""
        self.config = data.draw(configurations(self.pins), label="config")
        try:
            driver = fuzz_world(self.config, self.namespaces, self.core)
        except Undeployable:
            reject()  # SGLang would not start with this deployment: not a program of the world
        self.recorder = RecordingDriver(driver) if self.compare else None
        self.driver = driver if self.recorder is None else self.recorder  # type: ignore[assignment]
        self.pipeline = driver.consumer.cache.buffer_pipeline
        self._count_lock_outcomes()
        cache = driver.consumer.cache
        cache.enable_storage_metrics = True  # SGLang's own hit accounting runs, reasons counted
        self.hit_metrics = HitMetrics()
        cache.storage_metrics_collector = self.metrics = ReadTokens(passed_on=self.hit_metrics)
        self.design_log = io.StringIO()
        self.design_transitions = TransitionLog(self.design_log)
        watch_design(driver, self.design_transitions)
        self.queries_queued = 0
        queries = cache.cache_controller.prefetch_queue
        put = queries.put

        def counted(*args: Any, **kwargs: Any) -> None:
            self.queries_queued += 1  # what the world saw: an L3 existence query to answer
            put(*args, **kwargs)

        queries.put = counted

    def _count_lock_outcomes(self) -> None:
        try_lock = self.pipeline.try_lock_anchor

        def counted(*args: Any) -> Any:
            result = try_lock(*args)  # 0.5.19: the outcome; later: (outcome, matched)
            outcome = result if isinstance(result, str) else result[0]
            OUTCOMES[f"try_lock_anchor: {outcome}"] += 1
            return result

        self.pipeline.try_lock_anchor = counted

    def _retractable(self) -> list[str]:
        """Admitted requests whose prefill ran: their load back (if any) was acked, so they
        decode, and a growing batch can retract them."""
        return [rid for rid in self._in("admitted") if not self.driver.loading(rid)]

    def _in(self, state: str) -> list[str]:
        """The requests the scheduler has ``waiting``, ``admitted`` or ``aborted``."""
        return [rid for rid, request in self.driver.requests.items() if request.state == state]

    # ------------------------------------------------------------------ the scheduler

    @rule(
        sequence=st.integers(0, len(SEQUENCES) - 1),
        namespace=st.sampled_from(NAMESPACES),
        stale=st.booleans(),
    )
    def issue(self, sequence: int, namespace: str | None, stale: bool) -> None:
        rid = f"r{self.issued}"
        self.issued += 1
        self.driver.issue(rid, SEQUENCES[sequence], self._namespace(namespace), stale)

    def _sglangs_retraction_choice(self) -> str:
        """The running request SGLang retracts first (``ScheduleBatch.
        _get_decode_retraction_order``, its default policy): the fewest output tokens, then the
        longest input. The world never retracts another: that order is the scheduler's."""
        decoded = self.driver.decoding

        def kept_before(rid: str) -> tuple[int, int]:
            held = decoded.get(rid)
            return (0 if held is None else len(held), -len(self.driver.requests[rid].tokens))

        return min(self._retractable(), key=kept_before)

    @precondition(lambda self: bool(self._retractable()))
    @rule()
    def retract(self) -> None:
        """The running batch grew and SGLang retracts the request it picks
        (``SteppedSGLang.retract``: re-issued under the same handle, whatever of its earlier
        attempt is in flight)."""
        self.driver.retract(self._sglangs_retraction_choice())

    @precondition(lambda self: bool(self._retractable()))
    @rule(data=st.data(), pages=st.sampled_from((1, 16, 64)))
    def decode(self, data: st.DataObject, pages: int) -> None:
        """A running request decodes ``pages`` pages more: the running batch's KV competes
        with the tree and with admissions' loads for the device pool (the scheduler evicts
        first); when even that leaves no room, SGLang retracts the request it picks."""
        rid = data.draw(st.sampled_from(self._retractable()), label="request")
        if not self.driver.decode(rid, pages * PAGE):
            OUTCOMES["world: retracted, no room to decode"] += 1
            self.driver.retract(self._sglangs_retraction_choice())

    @precondition(lambda self: bool(self._in("aborted")))
    @rule(
        data=st.data(),
        sequence=st.integers(0, len(SEQUENCES) - 1),
        namespace=st.sampled_from(NAMESPACES),
    )
    def reuse_id(self, data: st.DataObject, sequence: int, namespace: str | None) -> None:
        """A new request under an aborted request's id (a client's retry keeps its id), while
        the aborted attempt's query, read or ack may still be in flight."""
        rid = data.draw(st.sampled_from(self._in("aborted")), label="request")
        self.driver.issue(rid, SEQUENCES[sequence], self._namespace(namespace), fresh=True)

    @rule()
    def retry_due(self) -> None:
        """The scheduler's retry sweep over its waiting queue (in issue order), re-issuing what
        the release makes due as its scheduler does."""
        for rid, hit_end in self.driver.due_retries(self._in("waiting")):
            request = self.driver.requests[rid]
            self.driver.issue(rid, request.tokens, request.namespace, storage_hit_end=hit_end)

    @precondition(
        lambda self: self.config.prefetch_policy == "timeout" and bool(self._in("waiting"))
    )
    @rule(data=st.data())
    def expire_wait(self, data: st.DataObject) -> None:
        """``timeout``: the world's clock says a request's prefetch wait is over."""
        rid = data.draw(st.sampled_from(self._in("waiting")), label="request")
        self.driver.expire_wait(rid)

    def _namespace(self, drawn: str | None) -> str | None:
        return drawn if drawn in self.namespaces else None

    @rule()
    def run_existence_queries(self) -> None:
        self.driver.run_existence_queries()

    @rule(failing=st.sampled_from((False, False, False, True)))  # one read in four fails
    def run_reads(self, failing: bool) -> None:
        self.driver.run_reads(failing)

    # SGLang answers existence queries on one thread (``prefetch_thread_func``) and reads on
    # another (``prefetch_io_aux_func``), each taking its queue first in first out, cancelled
    # operations included: one of each may be done while the rest wait, never a later one
    # before an earlier one (docs/sglang.md, "The fuzzer's world").
    @precondition(lambda self: self._queued("prefetch_queue") > 1)
    @rule()
    def answer_next_query(self) -> None:
        """The oldest existence query is answered, the others still queued."""
        self.driver.run_existence_queries(only_oldest=True)

    @precondition(lambda self: self._queued("prefetch_buffer") > 1)
    @rule(failing=st.sampled_from((False, False, False, True)))
    def land_next_read(self, failing: bool) -> None:
        """The oldest read lands, the others still queued."""
        self.driver.run_reads(failing, only_oldest=True)

    def _queued(self, name: str) -> int:
        return int(getattr(self.driver.consumer.cache.cache_controller, name).qsize())

    @rule()
    def tick(self) -> None:
        self.driver.tick()

    @rule()
    def pump(self) -> None:
        """A scheduler pass with the IO threads keeping up: queries, commits, reads, acks."""
        self.driver.settle(rounds=1)

    @precondition(lambda self: bool(self._in("waiting")))
    @rule(data=st.data(), abort_loading=st.sampled_from((False, False, False, True)))
    def admit(self, data: st.DataObject, abort_loading: bool) -> None:
        """Admission, then the next pass (which acks the load back); ``abort_loading``: the
        request is aborted while its load back is in flight, before that pass."""
        rid = data.draw(st.sampled_from(self._in("waiting")), label="request")
        loaded = self.driver.admit(rid)
        lacking = self.driver.requests[rid].lacking_tokens
        assert loaded <= lacking, (
            f"{rid}: admission loaded {loaded} tokens but the device lacked only {lacking} of "
            "the staged span: the part a sibling published since was not trimmed"
        )
        if abort_loading:
            self.driver.abort(rid)
        self.driver.tick()

    @precondition(lambda self: bool(self._in("waiting")))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self._in("waiting")), label="request")
        self.driver.abort(rid)

    @precondition(lambda self: bool(self.driver.abandoned()))
    @rule(data=st.data())
    def abort_abandoned(self, data: st.DataObject) -> None:
        """An abort again, of a request whose read an earlier abort abandoned: SGLang must let
        the read land and free its bounce once."""
        rid = data.draw(st.sampled_from(self.driver.abandoned()), label="request")
        self.driver.abort(rid)

    # ------------------------------------------------------------------ the world

    @rule(pages=st.integers(1, 8))
    def evict(self, pages: int) -> None:
        self.driver.evict(pages * PAGE)

    @rule(
        sequence=st.integers(0, len(SEQUENCES) - 1),
        namespace=st.sampled_from(NAMESPACES),
        part=st.sampled_from(("head", "half", "whole")),
    )
    def publish(self, sequence: int, namespace: str | None, part: str) -> None:
        tokens = SEQUENCES[sequence]
        length = {"head": PAGE, "half": len(tokens) // 2, "whole": len(tokens)}[part]
        self.driver.publish(tokens[:length], self._namespace(namespace))

    @rule(seed=st.integers(0, 7))
    def drop_l3(self, seed: int) -> None:
        """Drop about one L3 object in eight (which ones: a function of the name and seed)."""
        self.driver.drop_l3(KeepL3(seed))

    # ------------------------------------------------------------------ invariants

    @invariant()
    def pins_are_the_anchor_locks(self) -> None:
        STATES["steps"] += 1
        locks = self.pipeline.anchor_locks
        pinned = sum(lock.tokens for lock in locks.values())
        assert self.pipeline.anchor_locked_tokens_ == pinned, (
            f"anchor_locked_tokens_={self.pipeline.anchor_locked_tokens_} but the locks hold "
            f"{pinned}"
        )
        assert pinned <= self.pipeline.anchor_lock_cap_tokens, (
            f"{pinned} tokens pinned over the cap {self.pipeline.anchor_lock_cap_tokens}"
        )
        tree = self.driver.consumer.cache.tree_core
        for handle, lock in locks.items():
            assert not tree.is_full_device_evicted(lock.node_id), (
                f"{handle}: its locked anchor {lock.node_id} was evicted"
            )

    @invariant()
    def device_slots_hold_their_marks(self) -> None:
        for namespace in NAMESPACES:
            for tokens in SEQUENCES:
                length, held = self.driver.device_marks(tokens, namespace)
                assert held, (
                    f"the device holds {length} tokens of a sequence under {namespace!r} whose "
                    "slots do not hold their KV (a splice wrote bytes of another span or "
                    "namespace)"
                )

    @invariant()
    def every_slot_has_one_owner(self) -> None:
        problems = self.driver.slot_problems()
        assert not problems, "; ".join(problems)

    @invariant()
    def sglang_sanity_check(self) -> None:
        if self.sanity_check:
            self.driver.consumer.cache.sanity_check()

    def _liveness(self) -> None:
        """Before anything is aborted, the scheduler keeps going (a pass, then an admission
        try of every live request, as its adder does): within :data:`ADMISSION_PASSES`
        passes every request has admitted or ended (a prefetch that waits for ever, or a hold
        that never admits nor is released, blocks admission); over :data:`RETRY_PASSES`
        passes no request gets more retries than the release's own budget."""
        for passes in range(ADMISSION_PASSES):
            self.driver.settle(rounds=1)
            if not self._in("waiting"):
                break
            for rid in self._in("waiting"):
                if self.config.prefetch_policy == "timeout" and passes >= ADMISSION_PASSES // 2:
                    self.driver.expire_wait(rid)  # the deadline passes, as wall time does
                self.driver.admit(rid)
        assert not self._in("waiting"), (
            f"still waiting after {ADMISSION_PASSES} passes of the IO keeping up and every "
            f"request tried for admission: {self._in('waiting')}"
        )
        waiting = list(self.driver.requests)
        retried: Counter[str] = Counter()
        for _ in range(RETRY_PASSES):
            for rid, _hit_end in self.driver.due_retries(waiting):
                retried[rid] += 1
        budget = self.driver.retry_budget()
        over = {rid: n for rid, n in retried.items() if n > budget}
        assert not over, f"retries beyond the budget of {budget}: {over}"

    def teardown(self) -> None:
        """Quiescence: liveness first, then abort what is live, settle, then nothing may be
        held, and no structure of SGLang's may still name a request."""
        if "driver" not in vars(self):
            return  # the configuration was refused: nothing was built
        program_end = 0 if self.recorder is None else len(self.recorder.calls)
        try:
            for rid in list(self.driver.decoding):
                self.driver.stop_decoding(rid)  # the running batch finishes: the system idles
            self._liveness()
            for rid in self._in("waiting"):
                self.driver.abort(rid)
            rounds = self.driver.settle_until_idle()
            cache = self.driver.consumer.cache
            stats = cache._prefetch_outcome_stats
            for name, value in stats.items():
                OUTCOMES[f"outcome: {name}"] += int(value)
            assert stats["issued"] == self.queries_queued, (
                f"SGLang counts {int(stats['issued'])} prefetches issued, but the world was "
                f"given {self.queries_queued} existence queries to answer"
            )
            for reason, tokens in self.hit_metrics.unfulfilled.items():
                OUTCOMES[f"unfulfilled tokens: {reason}"] += tokens
            if keeps_hit_metrics(cache):
                problem = self.hit_metrics.problem(self.driver.world_loads)
                assert problem is None, problem
            pipeline = self.pipeline
            assert not self._in("waiting"), f"requests never ended: {self._in('waiting')}"
            assert not pipeline.anchor_locks, f"anchor locks left: {pipeline.anchor_locks}"
            assert not cache.ongoing_prefetch, f"prefetches left: {list(cache.ongoing_prefetch)}"
            assert pipeline.is_idle(), (
                f"the pipeline is not idle after {rounds} rounds at quiescence: "
                f"{_busy_structures(pipeline)}"
            )
            available = self.driver.pipeline_host_available()
            assert available == self.driver.baseline_host, (
                f"host pool leaked: {available} free of {self.driver.baseline_host} at start"
            )
            for pool, counts in (
                ("device", self.driver.device_books()),
                ("SWA device", self.driver.swa_books()),
            ):
                if counts is not None:
                    free, cached, size = counts
                    assert free + cached == size, (
                        f"{pool} slots leaked: {free} free + {cached} in the tree != {size}"
                    )
            requests = {*self.driver.requests, *(r.handle for r in self.driver.requests.values())}
            books = per_request_books({"cache": cache}, requests)
            assert not books, f"per-request state left at quiescence: {books}"
            if self.config.prefetch_policy == DESIGNED_STOP_POLICY:
                self._follows_its_design()
            if self.recorder is not None:
                self._compare_waste(self.recorder.calls, program_end)
        finally:
            self.driver.close()

    def _compare_waste(self, calls: list[Call], program_end: int) -> None:
        """The program again on a twin whose configuration differs in :attr:`compare`'s field
        (``calls``: the program's, then quiescence's from ``program_end``, so both sides end
        settled); each side's waste into :data:`~.waste.WASTE`, and Hypothesis steered towards
        programs where the two differ most."""
        assert self.compare is not None
        drawn = Waste(self.metrics.tokens, spliced(calls))
        if self.compare[0] == RELEASE:  # the twin runs in another process, after the campaign
            WASTE.pending.append((self.config, list(calls), drawn, program_end))  # not close
            return
        twin_deployment = twin_config(self.config, *self.compare)
        other, skipped = replayed(twin_deployment, calls, self.namespaces, self.core)
        WASTE.skipped_calls += skipped
        WASTE.add(self.config, calls[:program_end], drawn, other)
        more = {"drawn": drawn.wasted - other.wasted, "twin": other.wasted - drawn.wasted}
        target(float(abs(more["drawn"])), label="waste difference (tokens)")
        if self.waste_fails is not None and more[self.waste_fails] > 0:
            raise WastedMore(
                f"the {self.waste_fails} deployment wasted {more[self.waste_fails]} tokens more "
                f"(drawn {drawn}, {self.config}; twin {other}, {twin_deployment})"
            )

    def _follows_its_design(self) -> None:
        lines = self.design_log.getvalue()
        if self.log_path is not None and lines:  # (a program that fired nothing keeps the last)
            write_atomically(self.log_path, lines + self.design_transitions.closing_record())
        path = design_path(self.pipeline)
        summary = validate_log(lines.splitlines(), load_design(path))
        assert summary.violation is None, (
            f"SGLang's run leaves its design ({path.name}) at {summary.violation}"
        )
        assert not summary.live, f"records its design log never ended: {dict(summary.live)}"
        DESIGN_EDGES.setdefault(path, set()).update(summary.edges)


def replayed(
    config: FuzzConfig, calls: list[Call], namespaces: tuple[str | None, ...], core: str
) -> tuple[Waste, int]:
    """``calls`` replayed on a fresh world deployed as ``config``: its waste, and the calls it
    could not take."""
    twin = fuzz_world(config, namespaces, core)
    try:
        twin.consumer.cache.enable_storage_metrics = True
        twin.consumer.cache.storage_metrics_collector = read = ReadTokens()
        loaded, skipped = replay(calls, twin)
    finally:
        twin.close()
    return Waste(read.tokens, loaded), skipped


def _busy_structures(pipeline: Any) -> dict[str, int]:
    """The pipeline's non-empty containers by name (for the message of a pipeline not idle)."""
    return {
        name: len(value)
        for name, value in vars(pipeline).items()
        if isinstance(value, (dict, list, set, deque)) and value
    }


@dataclass(frozen=True)
class TargetCampaign:
    states: int
    programs: int
    seconds: float
    failure: BaseException | None
    outcomes: dict[str, int]
    design_edges: dict[Path, list[tuple[str, str, str]]]
    """Each design the programs' logs were checked against, with the edges they took."""
    waste: Comparison | None = None
    """With ``compare``: each program's waste against its twin's."""


def run_target_campaign(
    console: Console,
    steps: int | None,
    budget_seconds: float | None,
    seed: int,
    core: str = "python",
    profile: str = "fuzz",
    sanity_check: bool = True,
    namespaced: bool = True,
    log_path: str | None = None,
    pins: dict[str, Any] | None = None,
    fixes: Sequence[Callable[[], AbstractContextManager[None]]] = (),
    compare: tuple[str, Any] | None = None,
    waste_fails: str | None = None,
) -> TargetCampaign:
    """``stagefate fuzz --target sglang``: batches of programs over SGLang's pipeline, with
    ``fixes`` (patches to SGLang, :attr:`~.findings.Finding.proposed_fix`) applied throughout;
    ``compare``: each program replayed on a twin with that field changed, or recorded for
    another release (:mod:`.twins`), and ``waste_fails``: the side whose extra waste fails a
    program."""
    from ...fuzz.campaign import run_batches

    namespaces = NAMESPACES if namespaced else (None,)
    settings = {
        "log_path": log_path,
        "core": core,
        "sanity_check": sanity_check,
        "namespaces": namespaces,
        "pins": pins or {},
        "compare": compare,
        "waste_fails": waste_fails,
    }
    machine = type("SGLangPipelineFuzzer", (SGLangPipelineFuzzer,), settings)
    OUTCOMES.clear()
    STATES.clear()
    DESIGN_EDGES.clear()
    WASTE.start(*compare or ("", None))
    # SGLang logs every L3 miss and fallback it handles; the campaign reports outcomes instead.
    logging.getLogger("sglang").setLevel(logging.CRITICAL)
    with ExitStack() as patched:
        require()  # SGLang imported behind its CPU patches before a fix imports it
        for fix in fixes:
            patched.enter_context(fix())
        programs, seconds, failure = run_batches(
            console, machine, lambda: STATES["steps"], steps, budget_seconds, seed, profile
        )
    return TargetCampaign(
        STATES["steps"],
        programs,
        seconds,
        failure,
        dict(sorted(OUTCOMES.items())),
        {path: sorted(edges) for path, edges in sorted(DESIGN_EDGES.items())},
        WASTE if compare else None,
    )
