"""Prometheus metrics: a scrape of the registry says what ``pipe.stats`` says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stagefate import BufferPipeline, FileStorage

from .harness import config, make_pair, seq_of, settle

prometheus_client = pytest.importorskip(
    "prometheus_client", reason="the metrics extra: pip install 'stagefate[metrics]'"
)
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from stagefate.metrics import PipelineMetrics  # noqa: E402

LABELS = {"model_name": "test-model", "tp_rank": "0"}


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(f"stagefate:{name}", {**LABELS, **labels})


def _check(registry: CollectorRegistry, pipe: BufferPipeline) -> None:
    stats = pipe.stats
    for reason in pipe.spec.reasons:
        assert _sample(registry, "prefetch_outcomes_total", reason=reason) == getattr(stats, reason)
    for event in ("issued", "locked", "no_anchor", "cap_skip", "parked", "staged"):
        assert _sample(registry, "prefetch_events_total", event=event) == getattr(stats, event)
    assert _sample(registry, "l3_reads_total") == stats.l3_reads
    assert _sample(registry, "l3_read_tokens_total") == stats.l3_read_tokens
    wasted = pipe.wasted_by_reason()
    assert sum(reads for reads, _ in wasted.values()) == stats.l3_reads_wasted
    for reason, (reads, tokens) in wasted.items():
        assert _sample(registry, "l3_read_tokens_wasted_total", reason=reason) == tokens
        if reads:
            assert _sample(registry, "l3_reads_wasted_total", reason=reason) == reads
    assert _sample(registry, "prefetch_retries_total", outcome="armed") == stats.retries_armed
    for state in ("locked", "reading", "staged", "trimmed", "consumed", "parked"):
        live = sum(1 for r in pipe.live_records.values() if r.state == state)
        assert _sample(registry, "prefetch_records", state=state) == live
    assert _sample(registry, "anchor_pinned_tokens") == pipe.pinned_tokens
    assert _sample(registry, "anchor_pin_cap_tokens") == pipe.cap
    used = pipe.host_pool.capacity - pipe.host_pool.available()
    assert _sample(registry, "host_bounce_used_tokens") == used
    assert _sample(registry, "host_bounce_total_tokens") == pipe.host_pool.capacity


def test_a_scrape_agrees_with_the_pipeline_at_every_stage() -> None:
    pair = make_pair(config(4, host_tokens=64))
    consumer, registry = pair.consumer, CollectorRegistry()
    metrics = PipelineMetrics(consumer, registry, labels=LABELS)
    seq, other = seq_of(5, 4), seq_of(5, 4, start=500)
    pair.publish(seq, mark=9)
    pair.publish(other, mark=8)
    pair.sibling_insert(seq[:4], mark=3)  # an anchor to pin
    consumer.prefetch_from_storage("a", seq, 4)
    consumer.prefetch_from_storage("b", other, 0)
    consumer.prefetch_from_storage("miss", seq_of(5, 4, start=900), 0)
    consumer.io.complete_all()  # type: ignore[attr-defined]
    consumer.poll()
    _check(registry, consumer)  # reads in flight, a revoked miss, an anchor pinned
    assert _sample(registry, "prefetch_records", state="reading") == 2
    settle(consumer)
    _check(registry, consumer)  # staged holds in the bounce
    pair.sibling_insert(seq[:8], mark=3)  # "a"'s head is published: a trim
    prefix = consumer.tree.match_prefix(seq)
    assert consumer.plan_staged_splice("a", prefix.length) == (12, 0)
    consumer.init_load_back("a", prefix.device_indices)
    consumer.release_aborted_request("b")
    _check(registry, consumer)
    settle(consumer)
    metrics.refresh()
    _check(registry, consumer)
    text = generate_latest(registry).decode()
    assert 'stagefate:l3_read_tokens_wasted_total{model_name="test-model",reason="trimmed"' in text
    assert "# TYPE stagefate:prefetch_records gauge" in text


def test_a_file_l3_exports_the_pages_it_found_damaged(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    producer = BufferPipeline(config(4), storage=storage)
    seq = seq_of(4, 4)
    slots = producer.device_pool.alloc(len(seq))
    assert slots is not None
    producer.write_through(seq, slots)
    for page in tmp_path.glob("*/*"):
        page.write_bytes(page.read_bytes()[:-1])
    consumer, registry = BufferPipeline(config(4), storage=storage), CollectorRegistry()
    PipelineMetrics(consumer, registry, labels=LABELS)
    consumer.prefetch_from_storage("r", seq, 0)
    settle(consumer)
    assert _sample(registry, "l3_pages_damaged_total") == 1  # the read stops at the first
    assert _sample(registry, "l3_pages_unreadable_total") == 0
    assert consumer.stats.discarded == 1
    assert _sample(registry, "prefetch_outcomes_total", reason="discarded") == 1


def test_without_prometheus_client_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "prometheus_client", None)
    pipe = BufferPipeline(config())
    with pytest.raises(RuntimeError, match=r"pip install 'stagefate\[metrics\]'"):
        PipelineMetrics(pipe)
    assert pipe.instruments == []  # nothing was attached
    assert torch.equal(
        pipe.tree.match_prefix([1]).device_indices, torch.empty(0, dtype=torch.int64)
    )
