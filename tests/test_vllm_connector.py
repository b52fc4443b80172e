"""The vLLM connector: its parts here (no vLLM needed), and in a real vLLM (slow tier).

The real-vLLM tests run the tiny local Llama (dummy weights, seed 0) in vLLM's own environment,
in-process, through :mod:`stagefate.targets.vllm.scenarios`; without that environment they skip and
name `stagefate targets install vllm`.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import stagefate
from stagefate import BufferPipeline, MemoryStorage, PipelineConfig
from stagefate.integrations.vllm.kv_layout import PagedKV
from stagefate.integrations.vllm.settings import ConnectorSettings, model_layout
from stagefate.runtime.engine import EngineCache, GrantedSlots, SharedHostPool
from stagefate.runtime.pools import HostPool, KVLayout, PoolError
from stagefate.targets import TargetUnavailable
from stagefate.targets.vllm import environment as vllm_env
from stagefate.targets.workloads import convoy, documents

from .harness import DEVICES

LAYOUT = KVLayout(layers=2, kv_heads=2, head_dim=4, dtype=torch.bfloat16)
CONNECTOR_SOURCE = Path(stagefate.__file__).parent / "integrations" / "vllm" / "connector.py"
"""Read, not imported: it imports vLLM, which only vLLM's environment has."""
BLOCK = 4


# ---------------------------------------------------------------------- settings


def _vllm_config(**changes: Any) -> Any:
    """What :func:`model_layout` reads of a ``VllmConfig``: a one-worker, prefix-caching one."""
    model = SimpleNamespace(
        get_num_layers=lambda _parallel: 2,
        get_num_kv_heads=lambda _parallel: 2,
        get_head_size=lambda: 4,
        dtype=torch.bfloat16,
    )
    parallel = SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1)
    cache = SimpleNamespace(cache_dtype="auto", enable_prefix_caching=True, block_size=32)
    config = SimpleNamespace(model_config=model, parallel_config=parallel, cache_config=cache)
    for name, value in changes.items():
        part, _, field = name.partition("__")
        setattr(getattr(config, part) if field else config, field or part, value)
    return config


def test_the_model_layout_is_read_from_vllms_config() -> None:
    assert model_layout(_vllm_config()) == (LAYOUT, 32)
    assert model_layout(_vllm_config(num_hash_lookahead_tokens=0)) == (LAYOUT, 32)  # 0.33


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"parallel_config__tensor_parallel_size": 2}, "tensor_parallel_size=1"),
        ({"cache_config__cache_dtype": "fp8"}, "leave it 'auto'"),
        ({"cache_config__enable_prefix_caching": False}, "enable_prefix_caching=True"),
        # vLLM 0.33: block hashes that cover the tokens after the block (speculative decoding)
        ({"num_hash_lookahead_tokens": 1}, "disable_lookahead_block_hashes"),
    ],
)
def test_a_vllm_config_it_cannot_serve_is_refused_naming_the_fix(
    changes: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        model_layout(_vllm_config(**changes))


def test_unknown_key_is_refused_naming_it_and_the_known_ones() -> None:
    with pytest.raises(ValueError) as refused:
        ConnectorSettings.parse({"stagefate.storag": "memory", "other.key": 1})
    message = str(refused.value)
    assert "stagefate.storag" in message and "stagefate.storage" in message
    assert "other.key" not in message  # keys of other connectors are theirs


def test_bad_values_are_refused_with_the_key() -> None:
    with pytest.raises(ValueError, match=r"stagefate\.host_tokens"):
        ConnectorSettings.parse({"stagefate.host_tokens": 0})
    with pytest.raises(ValueError, match="expected 'file:PATH'"):
        ConnectorSettings.parse({"stagefate.storage": "s3://bucket"})


def test_a_bounce_buffer_below_one_block_is_refused() -> None:
    settings = ConnectorSettings.parse({"stagefate.host_tokens": 31})
    with pytest.raises(ValueError, match=r"stagefate\.host_tokens=31 holds no whole block"):
        settings.host_slots(32)
    assert ConnectorSettings.parse({"stagefate.host_tokens": 70}).host_slots(32) == 64


def test_memory_storage_across_processes_is_refused_with_the_fix() -> None:
    settings = ConnectorSettings.parse({"stagefate.storage": "memory"})
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        settings.check_storage_reachable(multiprocess=True)
    settings.check_storage_reachable(multiprocess=False)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_file_storage_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    settings = ConnectorSettings.parse({"stagefate.storage": f"file:{tmp_path}/l3"})
    with pytest.raises(ValueError, match="cannot be created"):
        settings.check_storage_reachable(multiprocess=True)


def test_unreachable_file_storage_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    settings = ConnectorSettings.parse({"stagefate.storage": f"file:{blocker}/l3"})
    with pytest.raises(ValueError, match="cannot be created"):
        settings.check_storage_reachable(multiprocess=True)


# ---------------------------------------------------------------------- the KV layout


def _caches(kind: str, blocks: int = 6, device: str = "cpu") -> dict[str, torch.Tensor]:
    heads, dim = LAYOUT.kv_heads, LAYOUT.head_dim
    shape = (blocks, heads, BLOCK, 2 * dim) if kind == "cpu" else (2, blocks, BLOCK, heads, dim)
    return {
        f"model.layers.{i}.self_attn.attn": torch.zeros(shape, dtype=LAYOUT.dtype, device=device)
        for i in reversed(range(LAYOUT.layers))  # vLLM's dict order is not the layer order
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["cpu", "split"])
def test_bounce_to_blocks_and_back_is_the_identity(kind: str, device: str) -> None:
    paged = PagedKV(_caches(kind, device=device), LAYOUT, BLOCK)
    host = HostPool(LAYOUT, 16)
    host.kv.copy_(torch.randn(host.kv.shape).to(LAYOUT.dtype))
    slots = np.arange(4, 12, dtype=np.int64)  # two blocks' worth
    paged.write_from_host(host, slots, [5, 2]).wait()
    pages = paged.pages([5, 2])
    assert torch.equal(pages[0], host.kv[:, :, 4:8])
    assert torch.equal(pages[1], host.kv[:, :, 8:12])
    untouched = paged.pages([0, 1, 3, 4])
    assert all(not page.any() for page in untouched)


def test_cpu_layout_keeps_k_then_v_in_the_last_dimension() -> None:
    caches = _caches("cpu")
    paged = PagedKV(caches, LAYOUT, BLOCK)
    host = HostPool(LAYOUT, BLOCK)
    host.kv[:, 0] = 1  # K
    host.kv[:, 1] = 2  # V
    paged.write_from_host(host, np.arange(BLOCK, dtype=np.int64), [3])
    layer = caches["model.layers.0.self_attn.attn"][3]
    assert bool((layer[..., : LAYOUT.head_dim] == 1).all())
    assert bool((layer[..., LAYOUT.head_dim :] == 2).all())


def test_a_layout_it_cannot_serve_is_refused_naming_the_shapes() -> None:
    caches = {"model.layers.0.a": torch.zeros(3, 7), "model.layers.1.a": torch.zeros(3, 7)}
    with pytest.raises(ValueError, match=r"\(3, 7\).*serves"):
        PagedKV(caches, LAYOUT, BLOCK)
    with pytest.raises(ValueError, match="attention layers"):
        PagedKV({"model.layers.0.a": torch.zeros(3)}, LAYOUT, BLOCK)


def test_a_load_needs_a_bounce_slot_per_token() -> None:
    paged = PagedKV(_caches("cpu"), LAYOUT, BLOCK)
    with pytest.raises(ValueError, match="needs 8 bounce slots"):
        paged.write_from_host(HostPool(LAYOUT, 8), np.arange(4, dtype=np.int64), [0, 1])


# ---------------------------------------------------------------------- the engine's pools


def test_granted_slots_hand_out_exactly_the_grant_and_free_nothing() -> None:
    pool = GrantedSlots(LAYOUT, torch.device("cpu"))
    assert pool.available() == 0 and pool.alloc_array(1) is None
    pool.grant(torch.tensor([8, 9, 10, 11]))
    assert pool.available() == 4
    taken = pool.alloc_array(4)
    assert taken is not None and taken.tolist() == [8, 9, 10, 11]
    assert pool.available() == 0
    pool.grant(np.array([0, 1], dtype=np.int64))
    pool.revoke()
    assert pool.available() == 0
    with pytest.raises(PoolError, match="the engine frees its own slots"):
        pool.free(np.array([8], dtype=np.int64))


def test_shared_host_pool_is_one_memory_in_two_mappings(tmp_path: Path) -> None:
    path = tmp_path / "bounce"
    owner = SharedHostPool(LAYOUT, 8, path)
    other = SharedHostPool.attach(LAYOUT, 8, path)
    owner.kv[1, 0, 3] = 7
    assert float(other.kv[1, 0, 3, 0, 0]) == 7.0
    with pytest.raises(ValueError, match="is missing or not"):
        SharedHostPool.attach(LAYOUT, 16, path)  # another engine's size
    owner.unlink()
    assert not path.exists()


def test_an_engine_cache_replaces_the_tree_and_pools_whole(tmp_path: Path) -> None:
    config = PipelineConfig(layers=2, kv_heads=2, head_dim=4, dtype=torch.bfloat16)
    engine = EngineCache(
        tree_factory=lambda page, device, aux: pytest.fail("not built"),
        device_pool=GrantedSlots(LAYOUT, torch.device("cpu")),
    )
    with pytest.raises(ValueError, match="not both"):
        BufferPipeline(config, engine=engine, tree_factory=lambda *a: pytest.fail("no"))
    windowed = config.model_copy(update={"sliding_window": 4})
    with pytest.raises(ValueError, match="sliding_window"):
        BufferPipeline(windowed, engine=engine)
    other = EngineCache(engine.tree_factory, engine.device_pool, HostPool(LAYOUT, 8))
    with pytest.raises(ValueError, match="host_tokens=64"):
        BufferPipeline(config, engine=other)


# ---------------------------------------------------------------------- in a real vLLM

needs_vllm = pytest.mark.skipif(
    not vllm_env.ready(), reason=f"vLLM is not installed here; run `{vllm_env.INSTALL_COMMAND}`"
)


def _closed(books: dict[str, object]) -> None:
    """The connector's books and vLLM's block pool are back where they started."""
    assert books["live_records"] == 0 and books["io_pending"] == 0
    assert books["pins"] == 0 and books["in_flight"] == 0
    assert books["host_free"] == books["host_total"]
    assert books["free_blocks"] == books["total_blocks"]


@pytest.mark.slow
@needs_vllm
def test_multi_turn_outputs_are_identical_and_the_loaded_kv_is_used() -> None:
    result = vllm_env.run_in_vllm("compare", {"conversations": 4, "turns": 3})
    plain, served, wrong = result["plain"], result["served"], result["wrong"]
    assert [o["tokens"] for o in served] == [o["tokens"] for o in plain]
    loaded = [i for i, o in enumerate(served) if o["cached"] > 0]
    assert len(loaded) >= len(served) - 1  # every turn but the very first found KV in L3
    changed = [i for i in loaded if wrong[i]["tokens"] != plain[i]["tokens"]]
    assert len(changed) >= len(loaded) // 2, "L3 filled with other KV must change the outputs"
    stats = result["books"]["stats"]
    assert stats["spliced_tokens"] > 0 and stats["filled"] == stats["staged"]
    _closed(result["books"])
    _closed(result["after"])


@pytest.mark.slow
@needs_vllm
def test_what_l3_answers_within_the_pass_is_acted_on_in_that_step() -> None:
    """With ``l3_wait_ms`` (ample here, so the test never races the IO threads) a prompt L3
    lacks is computed in the step that asks L3 about it, and one L3 holds is read and loaded
    into that step: both have their first token at step 1, as a local hit would. With 0,
    L3's answer and read are acted on at the pass's end: steps 2 and 3."""
    steps = {}
    for wait in (0, 1000):
        result = vllm_env.run_in_vllm(
            "first_token_steps", {"settings": {"stagefate.l3_wait_ms": wait}}
        )
        books = result["books"]
        assert books["queries_answered_in_pass"] == (books["queries"] if wait else 0)
        assert books["staged_in_pass"] == (1 if wait else 0)
        assert books["stats"]["filled"] == 1  # the held prompt was loaded either way
        _closed(books)
        steps[wait] = result["steps"]
    assert steps[0] == {"fresh": 2, "held": 3} and steps[1000] == {"fresh": 1, "held": 1}


@pytest.mark.slow
@needs_vllm
def test_a_synchronous_load_is_computed_in_the_step_that_admits_it() -> None:
    """A staged span offered as a synchronous load (the default) is copied before the forward
    of the step vLLM admits it in; offered asynchronously, vLLM admits it a step after the copy.
    Either way the load is filled and everything is given back."""
    steps = {}
    for synchronous in (False, True):
        settings = {"stagefate.synchronous_loads": synchronous, "stagefate.l3_wait_ms": 1000}
        result = vllm_env.run_in_vllm("first_token_steps", {"settings": settings})
        assert result["books"]["stats"]["filled"] == 1
        _closed(result["books"])
        steps[synchronous] = result["steps"]
    assert steps[False] == {"fresh": 1, "held": 2} and steps[True] == {"fresh": 1, "held": 1}


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("wait_ms", [0, 1000])
def test_requests_sharing_a_prefix_arriving_together_read_it_once(wait_ms: int) -> None:
    """Read within the pass that asked (``l3_wait_ms``, ample here), the prefix is loaded into
    the first request's step and the other 19 find it in vLLM's own cache in that pass. Read
    across steps (0), they wait for the first request's read (in-flight dedup) and then load
    nothing of it."""
    settings = {"stagefate.l3_wait_ms": wait_ms}
    result = vllm_env.run_in_vllm("shared", {"requests": 20, "settings": settings})
    before, books = result["before"], result["books"]
    reads = books["stats"]["l3_reads"] - before["l3_reads"]
    assert reads == 1, f"the shared prefix was read {reads} times"
    assert books["stats"]["l3_read_tokens_wasted"] == 0
    waited = books["stats"]["declined_inflight"] - before["declined_inflight"]
    assert waited >= 19 if not wait_ms else waited == 0
    prefix = result["prefix_tokens"]
    assert all(o["cached"] >= prefix for o in result["outputs"])
    if not wait_ms:
        # while the read ran vLLM stepped with nothing to compute: those steps waited for the
        # IO threads rather than spin (a spinning scheduler starved them: docs/vllm.md)
        assert result["idle_steps_served_by_a_wait"] >= 1
    _closed(books)


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize(
    ("arguments", "parked", "declined"),
    [
        # nine 1,900-token hits under the default 16,384-slot bounce, read across steps: later
        # ones park, and the re-match of their empty prefix once raised out of vLLM's
        # scheduler (issue 54). (Read within the pass that asks, each is loaded into its
        # step before vLLM's token budget lets enough in at once to fill the bounce.)
        pytest.param(
            {"prompts": 9, "tokens": 1900, "settings": {"stagefate.l3_wait_ms": 0}},
            True,
            0,
            id="defaults",
        ),
        # a 10-block hit past a 64-slot bounce: declined, computed instead, never parked
        pytest.param(
            {"prompts": 1, "tokens": 160, "settings": {"stagefate.host_tokens": 64}},
            False,
            1,
            id="oversize",
        ),
    ],
)
def test_a_full_bounce_buffer_never_stops_the_engine(
    arguments: dict[str, Any], parked: bool, declined: int
) -> None:
    result = vllm_env.run_in_vllm("bounce_full", arguments)
    assert [o["tokens"] for o in result["again"]] == [o["tokens"] for o in result["first"]]
    stats = result["books"]["stats"]
    assert (stats["parked"] > 0) == parked and stats["declined_host_oversize"] == declined
    assert stats["filled"] == arguments["prompts"] - declined  # every other hit was served
    _closed(result["books"])


@pytest.mark.slow
@needs_vllm
def test_install_check_served_a_request_through_the_connector() -> None:
    result = vllm_env.run_in_vllm("check")
    assert result["cached"] > 0
    _closed(result["books"])


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_failed_load_is_reported_never_offered_again_and_stored_anew_if_recomputed(
    policy: str,
) -> None:
    result = vllm_env.run_in_vllm("load_failure", {"policy": policy})
    plain, failed, again = result["plain"][0], result["failed"][0], result["again"][0]
    if policy == "recompute":
        assert failed["tokens"] == plain["tokens"] and failed["finish"] == "length"
    else:
        assert failed["finish"] == "error"
    stats = result["books"]["stats"]
    assert result["books"]["load_errors"] == 1
    assert stats["load_failed"] == 1, "the failed copy ended its record as one, not filled"
    assert again["tokens"] == plain["tokens"]
    if policy == "recompute":  # the failed pages were computed and stored again: loaded
        spliced = stats["spliced_tokens"]  # the failed splice, then again's
        assert again["cached"] > 0 and spliced == 2 * again["cached"] and stats["filled"] == 1
    else:  # the request failed: its pages left L3 and nothing stored them again
        assert again["cached"] == 0 and stats["filled"] == 0
    _closed(result["books"])


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("policy", ["recompute", "fail"])
@pytest.mark.parametrize("mode", ["whole", "mid"])
def test_failed_l3_reads_end_each_request_once_and_keep_the_good_prefix(
    policy: str, mode: str
) -> None:
    """L3 fails a stored prompt's reads (every page, or every page past the first 3): the
    read fails before vLLM is offered anything, so under either policy the request is served
    with vLLM's tokens: one prefetch and one read per request, nothing loops; a read cut
    mid-span is served its good prefix and computes the rest."""
    result = vllm_env.run_in_vllm("l3_failures", {"policy": policy, "mode": mode, "good": 3})
    plain, stats = result["plain"], result["stats"]
    for answer in (*result["served"], *result["again"]):
        assert answer["tokens"] == plain[0]["tokens"] and answer["finish"] == "length"
    assert stats["issued"] == stats["l3_reads"] == 2  # one each, for the two requests
    if mode == "whole":
        assert stats["discarded"] == 2 and result["loaded_blocks"] == 0
        assert all(a["cached"] == 0 for a in (*result["served"], *result["again"]))
    else:  # the good prefix, 3 blocks, loaded for each; the rest computed
        assert stats["filled"] == 2 and result["loaded_blocks"] == 2 * 3
        assert all(a["cached"] == 3 * 32 for a in (*result["served"], *result["again"]))
    _closed(result["books"])


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("wait_ms", [0, 2])
def test_a_request_whose_device_prefix_was_evicted_while_it_queued_is_served_from_l3(
    wait_ms: int,
) -> None:
    """Second turns ask while their first turn is on the device (a full miss past it), then
    queue while a 128-block pool evicts it: each asks L3 again and is served all L3 held (the
    connector once re-used the stale miss and vLLM recomputed what L3 held). That happens
    where L3's answers are acted on at the pass's end (``l3_wait_ms`` 0); acted on within the
    pass that asks, a request is admitted in that pass, so here none queues after its answer;
    either way every request is served all L3 held."""
    settings = {"stagefate.l3_wait_ms": wait_ms}
    result = vllm_env.run_in_vllm("evicted_while_queued", {"kv_blocks": 128, "settings": settings})
    held, cached, stats = result["held_pages"], result["cached"], result["stats"]
    assert all(pages > 0 for pages in held)  # L3 holds every first turn
    assert cached == [pages * 32 for pages in held]  # and all of it was served
    assert stats["l3_reads"] > 0  # read from L3
    if not wait_ms:
        assert stats["issued"] > len(held)  # re-asked
    _closed(result["books"])


@pytest.mark.slow
@needs_vllm
def test_an_abort_while_the_load_is_in_flight_leaks_nothing() -> None:
    result = vllm_env.run_in_vllm("abort")
    assert result["states"][-1] == "consumed"
    _closed(result["books"])


@pytest.mark.slow
@needs_vllm
def test_over_the_openai_server_a_conversation_gets_the_same_tokens_and_a_valid_log() -> None:
    """vLLM's server runs its engine in a process of its own: L3 in files, the bounce buffer in
    /dev/shm, the transition log written there and checked here against the spec."""
    from stagefate.spec import load_spec
    from stagefate.transition_log import validate_log

    result = vllm_env.run_in_vllm("server", {"conversations": 2, "turns": 3})
    served, plain = result["served"], result["plain"]
    assert [o["tokens"] for o in served] == [o["tokens"] for o in plain]
    assert sum(o["cached"] > 0 for o in served) >= len(served) - 1  # turns after the first
    log = Path(result["log"])
    summary = validate_log(log.read_text().splitlines(), load_spec())
    assert summary.violation is None, summary.violation
    assert summary.ended.get("filled", 0) >= len(served) - 2 and not summary.live
    # stagefate's metrics, served from vLLM's engine process: every filled record read L3
    reads = [line for line in result["metrics"] if line.startswith("stagefate:l3_reads_total")]
    assert reads and float(reads[0].rsplit(" ", 1)[1]) >= summary.ended["filled"] > 0


# ---------------------------------------------------------------------- the workloads


def test_a_scaled_trace_request_keeps_shared_blocks_shared_and_fits_the_context() -> None:
    from stagefate.sim.trace import TraceRequest
    from stagefate.targets.workloads import MAX_PROMPT, in_batches, scaled_prompt

    first = TraceRequest(0, 0.0, input_length=1000, output_length=1, hash_ids=(7, 8))
    second = TraceRequest(1, 1.0, input_length=600, output_length=1, hash_ids=(7, 9))
    a, b = scaled_prompt(first), scaled_prompt(second)
    assert len(a) == 63 and len(b) == 38  # 1000 / 16 and 600 / 16, rounded up
    assert a[:32] == b[:32] and a[32:38] != b[32:38]  # hash id 7 is one block, 8 and 9 differ
    long = TraceRequest(2, 2.0, input_length=10**6, output_length=1, hash_ids=tuple(range(2000)))
    assert len(scaled_prompt(long)) == MAX_PROMPT
    assert in_batches([a, b, a], 2) == [[a, b], [a]]


def test_conversation_turns_extend_the_last_and_share_the_system_prompt() -> None:
    from stagefate.targets.workloads import BLOCK, conversations

    chats = conversations(3, 3)
    assert all(chat[k + 1][: len(chat[k])] == chat[k] for chat in chats for k in range(2))
    assert chats[0][0][: 4 * BLOCK] == chats[1][0][: 4 * BLOCK] == chats[2][0][: 4 * BLOCK]
    assert conversations(3, 3) == chats  # seeded


def test_a_convoy_shares_prefixes_of_one_base_and_fits_the_context() -> None:
    from stagefate.targets.workloads import BLOCK, CONVOY_TAIL, MAX_PROMPT

    warm, prompts = convoy(6, [20, 40, 60])
    assert len(warm) == 60 * BLOCK + CONVOY_TAIL and len(warm) + 4 <= 2048  # 4 generated
    assert [len(p) - CONVOY_TAIL for p in prompts] == [20 * BLOCK, 40 * BLOCK, MAX_PROMPT] * 2
    assert all(p[: len(p) - CONVOY_TAIL] == warm[: len(p) - CONVOY_TAIL] for p in prompts)
    tails = {tuple(p[-CONVOY_TAIL:]) for p in prompts} | {tuple(warm[-CONVOY_TAIL:])}
    assert len(tails) == 7  # each request's own tokens, and the warm-up's
    assert convoy(6, [20, 40, 60]) == (warm, prompts)  # seeded


def test_the_convoy_percentiles_are_nearest_rank() -> None:
    from stagefate.bench.vllm import percentile

    ten = [float(v) for v in range(10, 0, -1)]
    assert (percentile(ten, 0.5), percentile(ten, 0.99)) == (5.0, 10.0)
    fifty = [float(v) for v in range(1, 51)]
    assert (percentile(fifty, 0.5), percentile(fifty, 0.99)) == (25.0, 50.0)


@pytest.mark.slow
@needs_vllm
def test_a_prefix_vllm_computes_while_its_read_is_in_flight_is_declined() -> None:
    result = vllm_env.run_in_vllm("computed_meanwhile")
    assert result["states"][-2:] == ["staged", None]  # the read landed, then the plan ended it
    assert result["outputs"] == {"loader": result["plain"], "computer": result["plain"]}
    before, stats = result["before"], result["books"]["stats"]
    assert stats["device_covered"] - before["device_covered"] == 1  # declined at the plan
    assert stats["l3_read_tokens_wasted"] - before["l3_read_tokens_wasted"] > 0  # and said so
    assert stats["spliced_tokens"] == before["spliced_tokens"]
    _closed(result["books"])


@pytest.mark.slow
@needs_vllm
def test_two_vllm_instances_share_one_l3(tmp_path: Path) -> None:
    """Instance one computes and writes through; instance two, another process over the same
    L3 (files), serves the same prompts from it with the same tokens."""
    from stagefate.targets.workloads import conversations

    prompts = [chat[0] for chat in conversations(3, 1, seed=5)]
    shared = {"storage": f"file:{tmp_path / 'l3'}", "prompts": prompts}
    first = vllm_env.run_in_vllm("instance", shared)
    second = vllm_env.run_in_vllm("instance", shared)
    _served_from_what_the_first_stored(first, second, len(prompts))


@pytest.mark.slow
@needs_vllm
def test_two_vllm_instances_at_once_share_one_mooncake_store(tmp_path: Path) -> None:
    """Instance one stores through Mooncake and stays up (the pages live in the segment it
    mounted); instance two, another process started meanwhile, serves the same prompts from
    those pages with the same tokens."""
    from stagefate.targets.workloads import conversations

    mooncake = _mooncake_or_skip()
    prompts = [chat[0] for chat in conversations(3, 1, seed=5)]
    with mooncake.LocalMaster() as master:
        cfg = master.config
        storage = f"mooncake://{cfg.master}?metrics_port={cfg.metrics_port}"
        log = tmp_path / "held.log"
        arguments = {"storage": storage, "prompts": prompts, "hold": str(tmp_path)}
        held = vllm_env.start_in_vllm("instance", arguments, log)
        try:
            first = _result_of_held(held, tmp_path / "result.json", log)
            second = vllm_env.run_in_vllm("instance", {"storage": storage, "prompts": prompts})
        finally:
            (tmp_path / "release").touch()
            held.wait(timeout=120)
    assert held.returncode == 0, log.read_text()[-4000:]
    _served_from_what_the_first_stored(first, second, len(prompts))


def _served_from_what_the_first_stored(
    first: dict[str, Any], second: dict[str, Any], prompts: int
) -> None:
    assert [o["tokens"] for o in second["outputs"]] == [o["tokens"] for o in first["outputs"]]
    # The first instance found L3 empty. (Its first prompt may still show cached tokens: while
    # its existence query is pending vLLM schedules the others, which compute the shared system
    # prompt into its prefix cache first.)
    assert first["books"]["stats"]["filled"] == 0
    assert all(o["cached"] > 0 for o in second["outputs"])
    assert second["books"]["stats"]["filled"] == prompts
    _closed(first["books"])
    _closed(second["books"])


def _mooncake_or_skip() -> Any:
    try:
        import mooncake.store
    except ImportError as error:
        pytest.skip(
            f"mooncake.store does not import ({error}); install it with "
            "`apt-get install libibverbs1 && pip install '.[mooncake]'`"
        )
    if not vllm_env.can_import("mooncake.store"):
        pytest.skip(
            "vLLM's environment has no Mooncake client: `stagefate targets install vllm "
            "--force` adds it"
        )
    from stagefate.runtime import mooncake

    return mooncake


def _result_of_held(process: subprocess.Popen[bytes], path: Path, log: Path) -> dict[str, Any]:
    """What a held instance wrote, once it did (or its output, if it ended first)."""
    deadline = time.monotonic() + 600
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise AssertionError(f"the held instance ended without a result:\n{log.read_text()}")
        time.sleep(0.2)
    result: dict[str, Any] = json.loads(path.read_text())
    return result


@pytest.mark.parametrize("device", DEVICES)
def test_the_worker_reports_a_load_once_its_copy_is_done(tmp_path: Path, device: str) -> None:
    """Bounce → vLLM's blocks through the worker (on CUDA: a side stream and an event): the
    request is reported finished once, after the KV is in the blocks, never before."""
    from types import SimpleNamespace

    from stagefate.integrations.vllm.worker_side import WorkerSide

    bounce = SharedHostPool(LAYOUT, 16, tmp_path / "bounce")  # the scheduler side's
    bounce.kv.copy_(torch.randn(bounce.kv.shape).to(LAYOUT.dtype))
    worker = WorkerSide(LAYOUT, BLOCK, MemoryStorage(), tmp_path / "bounce", 16)
    worker.register_kv_caches(_caches("split", device=device))
    assert worker.paged is not None
    copying: list[Any] = []
    launch = worker.paged.write_from_host

    def held(*args: Any) -> Any:  # the copy runs; its handle answers "not yet" until released
        handle = launch(*args)
        copying.append(handle)
        return SimpleNamespace(done=lambda: len(copying) > 1 and handle.done())

    worker.paged.write_from_host = held  # type: ignore[method-assign]
    # (a LoadOrder's fields: the metadata classes import vLLM, which this tier lacks)
    order = SimpleNamespace(
        request_id="r1", host_slots=np.arange(8, 16), block_ids=[3, 1], synchronous=False
    )
    worker.start_load_kv(_orders(order))
    assert worker.get_finished() == set()  # the copy is not done: vLLM must not run it yet
    copying.append("released")
    assert worker.get_finished() == {"r1"}
    assert worker.get_finished() == set() and worker.get_block_ids_with_load_errors() == set()
    pages = worker.paged.pages([3, 1])
    assert torch.equal(pages[0], bounce.kv[:, :, 8:12]) and torch.equal(
        pages[1], bounce.kv[:, :, 12:16]
    )
    bounce.unlink()


def _orders(*loads: Any, unloadable_blocks: tuple[int, ...] = ()) -> Any:
    """A step's metadata as the worker reads it (the metadata classes import vLLM, which this
    tier lacks)."""
    from types import SimpleNamespace

    return SimpleNamespace(loads=list(loads), unloadable={}, unloadable_blocks=[*unloadable_blocks])


@pytest.mark.parametrize("device", DEVICES)
def test_a_synchronous_load_is_in_the_blocks_when_start_load_kv_returns(
    tmp_path: Path, device: str
) -> None:
    """vLLM runs the step's forward right after ``start_load_kv`` for a synchronous load: the
    KV is in the blocks by then, the load is never in ``get_finished`` (vLLM would take it for
    an asynchronous load's), and the step's worker metadata names it once."""
    from types import SimpleNamespace

    from stagefate.integrations.vllm.worker_side import WorkerSide

    bounce = SharedHostPool(LAYOUT, 16, tmp_path / "bounce")
    bounce.kv.copy_(torch.randn(bounce.kv.shape).to(LAYOUT.dtype))
    worker = WorkerSide(LAYOUT, BLOCK, MemoryStorage(), tmp_path / "bounce", 16)
    worker.register_kv_caches(_caches("split", device=device))
    assert worker.paged is not None
    order = SimpleNamespace(
        request_id="r1", host_slots=np.arange(4, 8), block_ids=[2], synchronous=True
    )
    worker.start_load_kv(_orders(order, unloadable_blocks=(5,)))
    assert torch.equal(worker.paged.pages([2])[0].cpu(), bounce.kv[:, :, 4:8])
    assert worker.get_finished() == set() and worker.get_block_ids_with_load_errors() == {5}
    assert worker.synchronous_loads_made() == {"r1"}
    assert worker.synchronous_loads_made() == set()
    bounce.unlink()


@pytest.mark.parametrize("synchronous", [False, True])
def test_a_load_that_cannot_start_is_reported_with_its_blocks_in_error(
    tmp_path: Path, synchronous: bool
) -> None:
    """Asynchronous: reported finished, as vLLM's contract asks. Synchronous: its blocks in
    error, and named in the step's worker metadata so the scheduler side ends it failed."""
    from types import SimpleNamespace

    from stagefate.integrations.vllm.worker_side import WorkerSide

    worker = WorkerSide(LAYOUT, BLOCK, MemoryStorage(), tmp_path / "missing", 16)
    worker.register_kv_caches(_caches("split"))
    order = SimpleNamespace(
        request_id="r1", host_slots=np.arange(4), block_ids=[2], synchronous=synchronous
    )
    # (there is no bounce file to map: the load cannot start)
    worker.start_load_kv(_orders(order))
    assert worker.get_block_ids_with_load_errors() == {2}
    assert worker.get_finished() == (set() if synchronous else {"r1"})
    assert worker.synchronous_loads_made() == ({"r1"} if synchronous else set())


def test_a_failed_write_through_is_counted_not_raised(tmp_path: Path) -> None:
    """The worker keeps serving when L3 refuses a page (it is a miss later)."""
    from types import SimpleNamespace

    from stagefate.integrations.vllm.worker_side import WorkerSide

    class Refusing(MemoryStorage):
        def batch_set(self, keys: object, tensors: object) -> None:
            raise OSError("L3 is full")

    worker = WorkerSide(LAYOUT, BLOCK, Refusing(), tmp_path / "bounce", 8)
    worker.register_kv_caches(_caches("cpu"))
    meta = SimpleNamespace(saves=[SimpleNamespace(keys=["a", "b"], block_ids=[0, 1])])
    worker.wait_for_save(meta)  # type: ignore[arg-type]
    assert worker.failed_saves == 2


def test_the_load_watch_tells_two_requests_apart_from_one_request_loading_again() -> None:
    """The benchmark's count of loads: a block two requests load is what dedup saves; one
    request loading its blocks again (vLLM preempted it) is not."""
    from types import SimpleNamespace

    from stagefate.targets.vllm.scenarios import BLOCK, LoadWatch

    connector = SimpleNamespace(
        get_num_new_matched_tokens=lambda request, computed: (None, False),
        update_state_after_alloc=lambda request, blocks, external: None,
    )
    watch = LoadWatch(connector)
    a = SimpleNamespace(request_id="a", block_hashes=[b"1", b"2", b"3"])
    b = SimpleNamespace(request_id="b", block_hashes=[b"1", b"2", b"4"])

    def load(request: SimpleNamespace, local_blocks: int, blocks: int) -> None:
        connector.get_num_new_matched_tokens(request, local_blocks * BLOCK)
        connector.update_state_after_alloc(request, None, blocks * BLOCK)

    load(a, 0, 2)  # blocks 1, 2
    load(b, 1, 2)  # blocks 2 (a loaded it: a duplicate), 4
    load(a, 0, 2)  # a again, preempted meanwhile: 1, 2 reloaded
    assert (watch.blocks, watch.duplicates, watch.reloads) == (6, 1, 2)
    watch.next_batch()
    load(b, 0, 1)  # a new batch: nothing loaded in it before
    assert (watch.blocks, watch.duplicates, watch.reloads) == (7, 1, 2)


# ---------------------------------------------------------------------- vLLM's API, by release


def _methods(source: str, class_name: str) -> dict[str, tuple[list[str], set[str]]]:
    """A class's methods in ``source``: name -> (positional parameter names, decorators)."""
    (found,) = (
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.name == class_name
    )
    methods = {}
    for node in found.body:
        if isinstance(node, ast.FunctionDef):
            names = [a.arg for a in node.args.posonlyargs + node.args.args]
            decorators = {ast.unparse(d).rsplit(".", 1)[-1] for d in node.decorator_list}
            methods[node.name] = (names, decorators)
    return methods


@pytest.mark.slow
@pytest.mark.parametrize("version", [vllm_env.VERSION, "0.33.0"])
def test_the_connector_answers_vllms_connector_api_as_published(version: str) -> None:
    """Every abstract method of the release's ``KVConnectorBase_V1`` is implemented, with the
    base's parameters and kind (a classmethod stays one); where the release asks about sleep
    mode, the connector answers (vLLM 0.33: it says no). Read from the source as published,
    so a release with no CPU build is checked too."""
    try:
        base = _methods(vllm_env.connector_api(version).read_text(), "KVConnectorBase_V1")
    except TargetUnavailable as missing:
        pytest.skip(str(missing))
    ours = _methods(CONNECTOR_SOURCE.read_text(), "StagefateConnector")
    missing = [name for name, (_, marks) in base.items() if "abstractmethod" in marks]
    assert [name for name in missing if name not in ours] == []
    for name, (parameters, marks) in ours.items():
        if name in base:
            assert parameters == base[name][0], (name, parameters, base[name][0])
            assert ("classmethod" in marks) == ("classmethod" in base[name][1]), name
    if "supports_sleep_mode" in base:
        assert "supports_sleep_mode" in ours


@pytest.mark.slow
@needs_vllm
def test_the_copy_per_request_peer_serves_vllms_outputs_from_its_store() -> None:
    """The benchmark's peer (a user's first connector) serves vLLM's outputs from its store.
    It shares nothing itself, and loads a shared prefix once all the same: its loads are
    synchronous, vLLM caches their blocks as it allocates them, and the siblings scheduled
    after it in the same step find them in vLLM's cache."""
    warm, prompts = convoy(4, [8])
    arguments: dict[str, Any] = {"warm": [warm], "batches": [prompts], "max_tokens": 4}
    plain = vllm_env.run_in_vllm("workload", {**arguments, "connector": None})
    peer = vllm_env.run_in_vllm("workload", {**arguments, "connector": vllm_env.COPY_PER_REQUEST})
    assert peer["outputs"] == plain["outputs"]
    assert peer["loaded_blocks"] == peer["copied"]["loaded_blocks"] == 8
    assert peer["duplicate_blocks"] == 0


@pytest.mark.slow
@needs_vllm
def test_loads_from_a_slow_l3_are_declined_once_measured_and_vllm_computes() -> None:
    """An L3 whose every read takes half a second, against a model that prefills a 20-block
    document in a few ms (its forwards measured while the documents were written): the first
    read is made, since no read has been timed, and its request stops waiting for it once it
    has run longer than computing takes (``outrun_by_compute``); the later ones are declined
    at the IO commit (``declined_slower_than_compute``) and computed, with vLLM's outputs.
    With the decision off every hit is loaded."""
    warm, again = documents(4, 20)
    arguments: dict[str, Any] = {
        "warm": warm,
        "batches": [[prompt] for prompt in again],  # one at a time: each load is timed first
        "max_tokens": 4,
        "l3_read_seconds": 0.5,
        "connector": vllm_env.STAGEFATE,
    }
    plain = vllm_env.run_in_vllm("workload", {**arguments, "connector": None})
    deciding = vllm_env.run_in_vllm("workload", arguments)
    off = {"stagefate.decline_slower_loads": False}
    loading = vllm_env.run_in_vllm("workload", {**arguments, "settings": off})
    assert deciding["outputs"] == loading["outputs"] == plain["outputs"]
    stats = deciding["stagefate"]["stats"]
    # the read that was timed: its request computed rather than wait for it
    assert (stats["l3_reads"], stats["outrun_by_compute"], stats["filled"]) == (1, 1, 0)
    assert stats["declined_slower_than_compute"] == 3
    assert loading["stagefate"]["stats"]["declined_slower_than_compute"] == 0
    assert loading["stagefate"]["stats"]["filled"] == 4
    _closed(deciding["stagefate"])
