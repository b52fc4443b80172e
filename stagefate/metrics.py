"""Prometheus metrics of a pipeline (optional extra: ``pip install 'stagefate[metrics]'``).

:class:`PipelineMetrics` is an instrument: the pipeline calls it after every transition, on the
scheduler's thread, and it takes a snapshot there (counters, records per state, pinned tokens,
bounce occupancy). A scrape, on the HTTP server's thread, only reads the latest snapshot, so it
never walks the pipeline while the scheduler changes it.

Names and labels follow SGLang's HiCache metrics (``sglang:storage_prefetch_…_total`` with the
engine's constant labels plus a ``reason``): every metric is ``stagefate:…``, counters end in
``_total`` in the exposition, and the engine's labels (model, rank, …) are added to each sample.

===========================================  =======  =========================================
metric                                       type     labels
===========================================  =======  =========================================
``stagefate:prefetch_outcomes_total``        counter  ``reason``: how records ended (spec)
``stagefate:prefetch_events_total``          counter  ``event``: attempts, issued, locked, …
``stagefate:l3_reads_total``                 counter
``stagefate:l3_read_tokens_total``           counter
``stagefate:l3_reads_wasted_total``          counter  ``reason``: why nothing was spliced
``stagefate:l3_read_tokens_wasted_total``    counter  ``reason`` (also ``trimmed``, ``short_read``)
``stagefate:prefetch_retries_total``         counter  ``outcome``: armed, exhausted
``stagefate:prefetch_records``               gauge    ``state``: live records in each state
``stagefate:anchor_pinned_tokens``           gauge
``stagefate:anchor_pin_cap_tokens``          gauge
``stagefate:host_bounce_used_tokens``        gauge
``stagefate:host_bounce_total_tokens``       gauge
``stagefate:l3_pages_damaged_total``         counter  (a store that verifies pages: files)
``stagefate:l3_pages_unreadable_total``      counter  (the same: reads the file system refused)
===========================================  =======  =========================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .runtime.storage import ReportsDamage
from .spec import LifecycleSpec
from .statemachine.pipeline import BufferPipeline
from .statemachine.record import TransitionEvent

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

_RETRY_COUNTERS = {"armed": "retries_armed", "exhausted": "retries_exhausted"}
_L3_COUNTERS = ("l3_reads", "l3_read_tokens", "l3_reads_wasted", "l3_read_tokens_wasted")
"""Counters exported as families of their own (the wasted ones by reason, from the books)."""


def event_counters(spec: LifecycleSpec) -> list[str]:
    """The spec's counters exported under ``prefetch_events``: every declared one that has no
    family of its own (reasons go to ``prefetch_outcomes``)."""
    own = {*_L3_COUNTERS, *_RETRY_COUNTERS.values()}
    return [name for name in spec.counters if name not in own]


def exported_counters(spec: LifecycleSpec) -> set[str]:
    """Every counter some family exports: a test holds it equal to the spec's counters."""
    return {*spec.reasons, *event_counters(spec), *_L3_COUNTERS, *_RETRY_COUNTERS.values()}


@dataclass(frozen=True)
class _Snapshot:
    counts: dict[str, int]
    wasted: dict[str, tuple[int, int]]
    states: dict[str, int]
    pinned_tokens: int
    host_used_tokens: int


class PipelineMetrics:
    """Registers a collector for ``pipe`` in ``registry`` and keeps it current as an instrument.

    ``labels`` are constant labels on every sample (SGLang passes ``model_name``, ``tp_rank``…).
    """

    def __init__(
        self,
        pipe: BufferPipeline,
        registry: CollectorRegistry | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        try:
            from prometheus_client import REGISTRY
        except ImportError:
            raise RuntimeError(
                "stagefate.metrics needs prometheus_client: pip install 'stagefate[metrics]'"
            ) from None
        self.pipe = pipe
        self.labels = dict(labels or {})
        self._snapshot = self._take()
        pipe.instruments.append(self._on_transition)
        self.registry = REGISTRY if registry is None else registry
        self.registry.register(self)

    def _on_transition(self, _event: TransitionEvent) -> None:
        self._snapshot = self._take()

    def refresh(self) -> None:
        """Take a snapshot now (a scheduler may call it once per pass; transitions do anyway)."""
        self._snapshot = self._take()

    def _take(self) -> _Snapshot:
        pipe = self.pipe
        return _Snapshot(
            counts=pipe.stats.model_dump(),
            wasted=pipe.wasted_by_reason(),
            states=dict(Counter(record.state for record in pipe.live_records.values())),
            pinned_tokens=pipe.pinned_tokens,
            host_used_tokens=pipe.host_pool.capacity - pipe.host_pool.available(),
        )

    # ------------------------------------------------------------------ the collector

    def describe(self) -> list[Metric]:
        """Nothing at registration: the families are built at each scrape."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The pipeline's counters and gauges as of this scrape, with the collector's labels."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap, spec = self._snapshot, self.pipe.spec
        names = list(self.labels)
        values = list(self.labels.values())

        def counter(name: str, doc: str, extra: str | None = None) -> CounterMetricFamily:
            labels = [*names, extra] if extra else names
            return CounterMetricFamily(f"stagefate:{name}", doc, labels=labels)

        outcomes = counter("prefetch_outcomes", "Prefetch records ended, by end reason.", "reason")
        for reason in spec.reasons:
            outcomes.add_metric([*values, reason], snap.counts[reason])
        yield outcomes
        events = counter(
            "prefetch_events",
            "The spec's counters other than end reasons, L3 and retries.",
            "event",
        )
        for name in event_counters(spec):
            events.add_metric([*values, name], snap.counts[name])
        yield events
        reads = counter("l3_reads", "L3 reads launched into the host bounce.")
        reads.add_metric(values, snap.counts["l3_reads"])
        yield reads
        read_tokens = counter("l3_read_tokens", "Tokens the launched L3 reads asked for.")
        read_tokens.add_metric(values, snap.counts["l3_read_tokens"])
        yield read_tokens
        wasted_reads = counter(
            "l3_reads_wasted", "L3 reads nothing was spliced from, by end reason.", "reason"
        )
        wasted_tokens = counter(
            "l3_read_tokens_wasted",
            "Tokens read from L3 and not spliced, by reason (trimmed heads, short tails too).",
            "reason",
        )
        for reason, (reads_n, tokens_n) in sorted(snap.wasted.items()):
            if reads_n:
                wasted_reads.add_metric([*values, reason], reads_n)
            wasted_tokens.add_metric([*values, reason], tokens_n)
        yield wasted_reads
        yield wasted_tokens
        retries = counter("prefetch_retries", "Paced retries armed and given up.", "outcome")
        for outcome, name in _RETRY_COUNTERS.items():
            retries.add_metric([*values, outcome], snap.counts[name])
        yield retries
        records = GaugeMetricFamily(
            "stagefate:prefetch_records",
            "Live prefetch records per state.",
            labels=[*names, "state"],
        )
        for state, spec_state in spec.states.items():
            if not spec_state.terminal:
                records.add_metric([*values, state], snap.states.get(state, 0))
        yield records
        for name, doc, value in (
            ("anchor_pinned_tokens", "Tokens pinned by prefetch anchor locks.", snap.pinned_tokens),
            ("anchor_pin_cap_tokens", "The anchor-pin cap.", self.pipe.cap),
            (
                "host_bounce_used_tokens",
                "Host bounce slots owned by records.",
                snap.host_used_tokens,
            ),
            ("host_bounce_total_tokens", "Host bounce capacity.", self.pipe.host_pool.capacity),
        ):
            gauge = GaugeMetricFamily(f"stagefate:{name}", doc, labels=names)
            gauge.add_metric(values, value)
            yield gauge
        storage = self.pipe.storage
        if isinstance(storage, ReportsDamage):  # plain ints the IO threads bump: read as they are
            damaged = counter("l3_pages_damaged", "L3 pages found damaged when read, removed.")
            damaged.add_metric(values, storage.damaged)
            yield damaged
            unreadable = counter("l3_pages_unreadable", "L3 pages the file system refused.")
            unreadable.add_metric(values, storage.unreadable)
            yield unreadable


def serve(
    pipe: BufferPipeline, port: int, address: str, labels: Mapping[str, str], setting: str
) -> PipelineMetrics:
    """``pipe``'s metrics on an HTTP endpoint of their own (an engine's own ``/metrics`` is
    often served by another process than its scheduler's); ``setting`` names where the port
    was given, for the error a port that cannot be served raises."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    metrics = PipelineMetrics(pipe, registry, labels=labels)
    try:
        start_http_server(port, address, registry)
    except OSError as error:
        raise ValueError(
            f"{setting}={port} on {address} cannot be served ({error}); pick a free port"
        ) from None
    return metrics
