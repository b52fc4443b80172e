"""A minimal prefill-admission loop embedding a BufferPipeline (run by tests/test_examples.py).

A producer engine computes a prompt and writes it through to L3; a consumer engine that shares
the L3 receives the same prompt, prefetches the L3 part into its bounce buffer while the request
waits, and splices it at admission. Every pipeline call sits where a scheduler would make it.
"""

from __future__ import annotations

import torch

from stagefate import BufferPipeline, MemoryStorage, PipelineConfig

cfg = PipelineConfig(
    page_size=4, device_tokens=256, host_tokens=128, max_context_len=64, device="cpu", io="manual"
)
l3 = MemoryStorage()
producer, consumer = BufferPipeline(cfg, storage=l3), BufferPipeline(cfg, storage=l3)

prompt = list(range(100, 164))  # 64 tokens = 16 pages

# Producer: prefill computes KV into device slots, inserts them, writes through to L3.
slots = producer.device_pool.alloc(len(prompt))
assert slots is not None
producer.device_pool.kv[:, :, slots] = 7.0  # stands in for real prefill output
producer.tree.insert(prompt, slots)
producer.write_through(prompt, slots)

# Consumer, on arrival: match the device tree, prefetch what L3 may have beyond it.
waiting = ["req-1"]
match = consumer.tree.match_prefix(prompt)
consumer.prefetch_from_storage("req-1", prompt, match.length)

# Consumer, every scheduling pass: poll, re-issue due retries, admit what is ready.
for _ in range(10):
    consumer.io.complete_all()  # ManualIO: the storage "finishes" here; ThreadedIO needs nothing
    consumer.poll()
    for rid in consumer.due_retries(waiting):
        consumer.prefetch_from_storage(rid, prompt, consumer.tree.match_prefix(prompt).length)
    if consumer.state("req-1") in ("staged", "trimmed"):
        break

# Admission: charge the splice against the live prefix, then build the batch.
prefix = consumer.tree.match_prefix(prompt).device_indices
kv_tokens, swa_tokens = consumer.plan_staged_splice("req-1", prefix.numel())
tail = consumer.init_load_back("req-1", prefix) if kv_tokens else torch.empty(0, dtype=torch.int64)
req_slots = torch.cat([prefix, tail])  # the request's KV; prefill computes only the rest
waiting.remove("req-1")

# Later passes pick up the H2D ack; the pipeline then holds nothing.
while not consumer.is_idle():
    consumer.io.complete_all()
    consumer.poll()

assert req_slots.numel() == len(prompt)
assert bool((consumer.device_pool.kv[:, :, req_slots] == 7.0).all())
print(f"spliced {tail.numel()} tokens from L3; stats: filled={consumer.stats.filled}")
