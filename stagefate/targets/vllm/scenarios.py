"""Runs inside vLLM's environment: a tiny local Llama served by vLLM (in-process engine, dummy
weights, fixed seed), with and without the StagefateConnector; each action answers one JSON line.

``python -m stagefate.targets.vllm.scenarios ACTION`` with the arguments as JSON on stdin:

* ``check``: one request served end to end through the connector (the install's last step);
* ``compare``: a multi-turn workload without the connector and with it, greedy outputs of both,
  then the same with every page in L3 overwritten by other KV (the loaded KV is used);
* ``shared``: requests sharing a prefix arriving together: what L3 served and what vLLM loaded;
* ``abort``: a request aborted while its load is in flight;
* ``load_failure``: the worker's copy fails once, under vLLM's ``kv_load_failure_policy``;
* ``l3_failures``: L3 fails a span's reads, whole or past its first pages, under that policy;
* ``bounce_full``: distinct prompts from L3 served together, more than the bounce buffer holds;
* ``evicted_while_queued``: a turn's requests queue on a small device pool that evicts the
  prefixes of those still waiting: how much of each prompt L3 held, and what vLLM was served.

After every action the books are checked: no live record, no IO in flight, no pin left on any
vLLM block, and every vLLM block back in the free queue once the prefix cache is reset.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from stagefate.runtime.io import ThreadedIO
from stagefate.targets.vllm.environment import COPY_PER_REQUEST, PEERS, STAGEFATE
from stagefate.targets.workloads import BLOCK, conversations

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def model_dir() -> Path:
    """A folder with only the tiny Llama's config (no weights: ``load_format='dummy'``)."""
    folder = Path(tempfile.gettempdir()) / "stagefate-tiny-llama"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(MODEL))
    return folder


PROOF_SETTINGS: dict[str, Any] = {"stagefate.decline_slower_loads": False}
"""The scenarios prove behaviours whose loads must not hang on this machine's timing: a
one-block read that measured slower than 32 tokens compute would rightly be declined (it was,
once, in a loaded run), and a test asserting "all of it served" would then flake. So the speed
decision is off in them; :func:`workload` (the benchmark, and the decision's own test) runs the
connector as shipped (``build(..., as_shipped=True)``)."""


def build(
    connector: str | None = STAGEFATE,
    settings: dict[str, Any] | None = None,
    policy: str = "fail",
    as_shipped: bool = False,
    **options: Any,
) -> Any:
    """The tiny model on vLLM, with ``connector`` (stagefate's, one of :data:`PEERS`, or none);
    stagefate's with :data:`PROOF_SETTINGS` unless ``as_shipped``."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    if connector is not None:
        if connector == STAGEFATE:
            extra: dict[str, Any] = {
                "stagefate.storage": "memory",
                **({} if as_shipped else PROOF_SETTINGS),
                **(settings or {}),
            }
            module: dict[str, Any] = {"kv_connector_module_path": "stagefate.integrations.vllm"}
        elif connector == COPY_PER_REQUEST:
            module_path = "stagefate.targets.vllm.copy_per_request"
            extra, module = {}, {"kv_connector_module_path": module_path}
        else:
            extra = PEERS[connector](tempfile.mkdtemp(prefix=f"stagefate-{connector}-"))
            module = {}
        options["kv_transfer_config"] = KVTransferConfig(
            kv_connector=connector,
            kv_role="kv_both",
            kv_load_failure_policy=policy,
            kv_connector_extra_config=extra,
            **module,
        )
    return LLM(
        model=str(model_dir()),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        seed=0,
        block_size=BLOCK,
        max_model_len=2048,
        enable_prefix_caching=True,
        distributed_executor_backend="uni",
        disable_log_stats=False,
        **options,
    )


def generate(llm: Any, prompts: list[list[int]], max_tokens: int = 8) -> list[dict[str, Any]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
    )
    return [
        {
            "tokens": list(out.outputs[0].token_ids),
            "finish": out.outputs[0].finish_reason,
            "cached": out.num_cached_tokens,
            # vLLM's own: arrival to first token, as its TTFT histogram counts it
            "ttft": out.metrics.first_token_latency if out.metrics is not None else None,
        }
        for out in outputs
    ]


def scheduler_connector(llm: Any) -> Any:
    core = llm.llm_engine.engine_core.engine_core
    return core.scheduler.connector


SETTLE_S = 10.0
"""The longest :func:`books` waits for the storage operations still in flight to land."""


def books(llm: Any) -> dict[str, Any]:
    """Where the connector's and vLLM's books stand (after the prefix cache was reset), once
    the reads still in flight landed: a read its request stopped waiting for (``outrun``)
    may land after every request finished, and vLLM's idle engine makes no step to poll it."""
    side = scheduler_connector(llm).scheduler
    pipe = side.pipeline
    io, orphaned = pipe.io, pipe.spec.group("orphaned")
    deadline = time.monotonic() + SETTLE_S
    pipe.poll()
    # past the deadline the books show what is still in flight
    while isinstance(io, ThreadedIO) and time.monotonic() < deadline:
        if not any(r.state in orphaned for r in pipe.live_records.values()):
            break
        io.wait(0.05)
        pipe.poll()
    pool = side.cache.pool
    llm.reset_prefix_cache()
    return {
        "live_records": len(pipe.live_records),
        "io_pending": pipe.io.pending(),
        "pins": len(side.cache.pinned_blocks()),
        "host_free": pipe.host_pool.available(),
        "host_total": pipe.host_pool.capacity,
        "free_blocks": pool.get_num_free_blocks(),
        "total_blocks": pool.num_gpu_blocks - 1,  # the null block is never free
        "in_flight": len(side.in_flight),
        "stats": pipe.stats.model_dump(),
        "load_errors": side.load_errors,
        "queries": side.queries,
        "queries_answered_in_pass": side.queries_answered_in_pass,
        "staged_in_pass": side.staged_in_pass,
    }


def stats_since(before: Any, after: dict[str, int]) -> dict[str, int]:
    """The connector's counters ``after`` (a :func:`books` ``stats``) less a snapshot taken
    ``before`` (the pipeline's ``stats``): what the measured part of an action counted."""
    earlier = before.model_dump()
    return {name: value - earlier[name] for name, value in after.items()}


def run_turns(llm: Any, chats: list[list[list[int]]], reset: bool) -> list[dict[str, Any]]:
    """Every conversation's turns, turn by turn (all conversations' turn k together); with
    ``reset`` vLLM's prefix cache is emptied between turns, so a turn's prefix comes from L3."""
    outputs = []
    for turn in range(len(chats[0])):
        outputs += generate(llm, [chat[turn] for chat in chats])
        if reset:
            llm.reset_prefix_cache()
    return outputs


def check(_: dict[str, Any]) -> dict[str, Any]:
    llm = build()
    prompt = conversations(1, 1)[0][0]
    first = generate(llm, [prompt])
    llm.reset_prefix_cache()
    again = generate(llm, [prompt])
    if first[0]["tokens"] != again[0]["tokens"] or again[0]["cached"] == 0:
        raise SystemExit(f"the connector did not serve the request: {first} then {again}")
    return {"tokens": again[0]["tokens"], "cached": again[0]["cached"], "books": books(llm)}


def compare(arguments: dict[str, Any]) -> dict[str, Any]:
    chats = conversations(arguments.get("conversations", 4), arguments.get("turns", 3))
    plain = run_turns(build(None), chats, reset=True)
    llm = build()
    served = run_turns(llm, chats, reset=True)
    served_books = books(llm)
    storage = scheduler_connector(llm).scheduler.storage
    pages = storage.snapshot()  # every page in L3 becomes other KV of its shape
    generator = torch.Generator().manual_seed(1)
    storage.delete(list(pages))  # L3 is content-addressed: the first write of a key wins
    storage.batch_set(
        list(pages),
        [torch.randn(page.shape, generator=generator).to(page.dtype) for page in pages.values()],
    )
    llm.reset_prefix_cache()
    wrong = run_turns(llm, chats, reset=True)
    return {
        "plain": plain,
        "served": served,
        "wrong": wrong,
        "books": served_books,
        "after": books(llm),
    }


def shared(arguments: dict[str, Any]) -> dict[str, Any]:
    count = arguments.get("requests", 20)
    rng = random.Random(2)
    prefix = [rng.randrange(3, 1000) for _ in range(8 * BLOCK)]
    prompts = [prefix + [rng.randrange(3, 1000) for _ in range(100)] for _ in range(count)]
    llm = build(settings=arguments.get("settings"))
    generate(llm, prompts[:1])  # the prefix reaches L3 through the first request
    llm.reset_prefix_cache()
    side = scheduler_connector(llm).scheduler
    before = side.pipeline.stats
    waited: list[bool] = []
    wait = side.io.wait  # steps with no forward that waited for an IO completion

    def watched(timeout_s: float) -> bool:
        waited.append(wait(timeout_s))
        return waited[-1]

    side.io.wait = watched
    outputs = generate(llm, prompts)
    side.io.wait = wait
    after = books(llm)
    return {
        "outputs": outputs,
        "before": before.model_dump(),
        "books": after,
        "prefix_tokens": len(prefix),
        "idle_steps_served_by_a_wait": sum(waited),
    }


def bounce_full(arguments: dict[str, Any]) -> dict[str, Any]:
    """Distinct prompts stored in L3, then served together: their hits fill the bounce buffer,
    so later ones park (and, past the whole buffer, are declined) while vLLM's scheduler polls
    every step. The engine must keep serving, with the outputs it gave the first time."""
    count, length = arguments.get("prompts", 9), arguments.get("tokens", 1900)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 1000) for _ in range(length)] for _ in range(count)]
    llm = build(settings=arguments.get("settings"))
    first = generate(llm, prompts)  # computed, and written through to L3
    llm.reset_prefix_cache()
    again = generate(llm, prompts)
    return {"first": first, "again": again, "books": books(llm)}


def load_failure(arguments: dict[str, Any]) -> dict[str, Any]:
    """The worker's first copy into vLLM's blocks fails; vLLM applies its policy."""
    from stagefate.integrations.vllm import kv_layout

    policy = arguments["policy"]
    prompt = conversations(1, 1)[0][0]
    plain = generate(build(None), [prompt])
    llm = build(policy=policy)
    generate(llm, [prompt])  # computed, and written through to L3
    llm.reset_prefix_cache()
    real = kv_layout.PagedKV.write_from_host
    failures: list[int] = []

    def failing(self: Any, *args: Any) -> None:
        if not failures:
            failures.append(1)
            raise OSError("injected: the copy into vLLM's blocks failed")
        real(self, *args)

    kv_layout.PagedKV.write_from_host = failing  # type: ignore[method-assign,assignment]
    try:
        failed = generate(llm, [prompt])
    finally:
        kv_layout.PagedKV.write_from_host = real  # type: ignore[method-assign]
    llm.reset_prefix_cache()
    # The failed pages left L3, so they are never offered again as they were; under
    # `recompute` the request computed them and wrote them through anew, so they are offered.
    again = generate(llm, [prompt])
    return {"plain": plain, "failed": failed, "again": again, "books": books(llm)}


def l3_failures(arguments: dict[str, Any]) -> dict[str, Any]:
    """L3 fails the reads of a stored prompt: every page (``mode="whole"``) or every page past
    the first ``good`` (``mode="mid"``: the read comes back short), under vLLM's
    ``kv_load_failure_policy``. What each request cost: its prefetches, L3 reads, blocks loaded
    and tokens vLLM computed, so a loop would show."""
    policy, mode, good = arguments["policy"], arguments["mode"], arguments.get("good", 3)
    prompt = conversations(1, 1)[0][0]
    plain = generate(build(None), [prompt, prompt])
    llm = build(policy=policy)
    generate(llm, [prompt])  # computed, and written through to L3
    llm.reset_prefix_cache()
    side = scheduler_connector(llm).scheduler
    storage, read = side.storage, side.storage.batch_get_into
    watch = LoadWatch(scheduler_connector(llm))

    def failing(keys: list[str], out: Any, dtype: Any) -> int:
        if mode == "whole":
            raise OSError("injected: L3 could not read the span")
        page = out.shape[2] // len(keys)
        return int(read(keys[:good], out[:, :, : good * page], dtype))  # then a page is lost

    storage.batch_get_into = failing
    before = side.pipeline.stats
    try:
        served = generate(llm, [prompt])
        llm.reset_prefix_cache()
        again = generate(llm, [prompt])  # the same prompt once more: nothing loops
    finally:
        storage.batch_get_into = read
    after = books(llm)
    return {
        "plain": plain,
        "served": served,
        "again": again,
        "stats": stats_since(before, after["stats"]),
        "loaded_blocks": watch.blocks,
        "books": after,
    }


def evicted_while_queued(arguments: dict[str, Any]) -> dict[str, Any]:
    """24 conversations' first two turns on a device pool of ``kv_blocks`` blocks: the second
    turn's requests ask while their first turn's prompt is still on the device (L3 holds
    nothing past it), then queue while the requests admitted before them evict it. Per request
    of the second turn: the pages of its prompt L3 held before the turn, and the tokens vLLM
    was served (its local hit and the connector's)."""
    from stagefate.runtime.hashing import ROOT_NAMESPACE, page_hashes, rank_storage_keys

    chats = conversations(24, 2, seed=3)
    llm = build(settings=arguments.get("settings"), num_gpu_blocks_override=arguments["kv_blocks"])
    side = scheduler_connector(llm).scheduler
    generate(llm, [chat[0] for chat in chats])
    second = [chat[1] for chat in chats]
    key, _ = rank_storage_keys(0, 1)

    def held_pages(prompt: list[int]) -> int:  # the pages the connector would ask L3 for
        digests = page_hashes(prompt[: len(prompt) - 1], BLOCK, ROOT_NAMESPACE)
        return int(side.storage.batch_exists([key(d) for d in digests]))

    held = [held_pages(prompt) for prompt in second]
    before = side.pipeline.stats
    served = generate(llm, second)
    after = books(llm)
    return {
        "held_pages": held,
        "cached": [answer["cached"] for answer in served],
        "stats": stats_since(before, after["stats"]),
        "books": after,
    }


def abort(_: dict[str, Any]) -> dict[str, Any]:
    """A request aborted while its load is in flight: spliced into the blocks vLLM allocated,
    its copy handed to the worker, its ``ack`` not fired (vLLM still waits for the KV). An
    asynchronous load, whose copy outlives its step: a synchronous one is made and reported
    within the step that admits it."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompt = conversations(1, 1)[0][0]
    llm = build(settings={"stagefate.synchronous_loads": False})
    generate(llm, [prompt])
    llm.reset_prefix_cache()
    engine, side = llm.llm_engine, scheduler_connector(llm).scheduler
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, detokenize=False)
    engine.add_request("doomed", TokensPrompt(prompt_token_ids=prompt), params)
    seen: list[str | None] = []
    spliced = side.pipeline.spec.group("spliced")
    deadline = time.monotonic() + 30  # the L3 read runs on the IO threads meanwhile
    while time.monotonic() < deadline:  # vLLM suffixes the id it is given: its own is "doomed-…"
        engine.step()
        ours = [rid for rid in side.pipeline.live_records if rid.startswith("doomed")]
        seen.append(side.pipeline.state(ours[0]) if ours else None)
        if seen[-1] in spliced:  # the copy is the worker's, the ack not yet fired
            break
    else:
        raise SystemExit(f"the load never went in flight: states {sorted(set(map(str, seen)))}")
    engine.abort_request(["doomed"])
    while time.monotonic() < deadline:
        if not engine.has_unfinished_requests() and not side.landed and not side.in_flight:
            break
        engine.step()
    return {"states": list(dict.fromkeys(seen)), "books": books(llm)}


def server(arguments: dict[str, Any]) -> dict[str, Any]:
    """vLLM's OpenAI server (its engine in a process of its own, so L3 in files and the bounce
    buffer in ``/dev/shm``) with the connector: each conversation's turns sent as a client
    would, the prefix cache reset between turns; then the same prompts without the connector."""
    import subprocess
    import urllib.request

    chats = conversations(arguments.get("conversations", 2), arguments.get("turns", 3))
    work = Path(tempfile.mkdtemp(prefix="stagefate-vllm-server-"))
    log = work / "transitions.jsonl"
    port, metrics_port = _free_port(), _free_port()
    transfer = {
        "kv_connector": "StagefateConnector",
        "kv_connector_module_path": "stagefate.integrations.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "stagefate.storage": f"file:{work / 'l3'}",
            **PROOF_SETTINGS,
            "stagefate.log": str(log),
            "stagefate.metrics_port": metrics_port,
        },
    }
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir()), "--load-format", "dummy", "--skip-tokenizer-init",
        "--enforce-eager", "--seed", "0", "--block-size", str(BLOCK), "--max-model-len", "2048",
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--host", "127.0.0.1", "--port", str(port),
        "--kv-transfer-config", json.dumps(transfer),
    ]  # fmt: skip
    environment = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_SERVER_DEV_MODE": "1"}
    base = f"http://127.0.0.1:{port}"

    def post(path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body or {}).encode()
        request = urllib.request.Request(
            base + path, data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            text = answer.read()
        return json.loads(text) if text.strip() else None

    output = (work / "server.log").open("w")
    process = subprocess.Popen(command, env=environment, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=5):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = (work / "server.log").read_text()[-4000:]
                    raise SystemExit(f"vLLM's server did not come up:\n{tail}") from None
                time.sleep(1)
        served = []
        for turn in range(len(chats[0])):
            for chat in chats:
                answer = post(
                    "/v1/completions",
                    {
                        "model": str(model_dir()),
                        "prompt": chat[turn],
                        "max_tokens": 8,
                        "temperature": 0,
                        "ignore_eos": True,
                        "return_token_ids": True,
                    },
                )
                choice = answer["choices"][0]
                served.append({"tokens": choice["token_ids"], "cached": _cached(answer)})
            post("/reset_prefix_cache")
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(metrics_url, timeout=30) as answer:
            exposition = answer.read().decode()
    finally:
        process.terminate()
        process.wait(timeout=60)
        output.close()
    plain = run_turns(build(None), chats, reset=True)
    metrics = [line for line in exposition.splitlines() if line.startswith("stagefate:")]
    return {"served": served, "plain": plain, "log": str(log), "metrics": metrics}


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cached(answer: dict[str, Any]) -> int:
    details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _slow_reads(storage: Any, seconds: float) -> Any:
    """Every read of ``storage`` from now on takes ``seconds`` more (an L3 far away); its own
    read is returned, to put back."""
    read = storage.batch_get_into

    def slow_read(*args: Any) -> int:
        time.sleep(seconds)
        return int(read(*args))

    storage.batch_get_into = slow_read
    return read


def computed_meanwhile(_: dict[str, Any]) -> dict[str, Any]:
    """A prefix vLLM computes while its L3 read is in flight: the staged hold is declined at
    the plan (vLLM's local hit now covers the span) and vLLM uses its own blocks.

    The L3 read is held for a second; once it is in flight, a second request with the same
    prompt that skips reading the prefix cache (``skip_reading_prefix_cache``) arrives and is
    computed meanwhile."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompt = conversations(1, 1)[0][0]
    plain = generate(build(None), [prompt])[0]["tokens"]
    llm = build()
    generate(llm, [prompt])  # its KV reaches L3
    llm.reset_prefix_cache()
    engine, side = llm.llm_engine, scheduler_connector(llm).scheduler
    read = _slow_reads(side.storage, 1.0)
    before = side.pipeline.stats
    options = {"temperature": 0, "max_tokens": 8, "ignore_eos": True, "detokenize": False}
    engine.add_request("loader", TokensPrompt(prompt_token_ids=prompt), SamplingParams(**options))
    states: list[str | None] = []
    reading = side.pipeline.spec.group("owning")  # its read committed: it owns the span's keys
    outputs: dict[str, list[int]] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(outputs) < 2:
        for out in engine.step():
            if out.finished:
                outputs[out.request_id.split("-")[0]] = list(out.outputs[0].token_ids)
        loader = [rid for rid in side.pipeline.live_records if rid.startswith("loader")]
        states.append(side.pipeline.state(loader[0]) if loader else None)
        if states[-1] in reading and not reading.intersection(states[:-1]):
            computed = SamplingParams(**options, skip_reading_prefix_cache=True)
            engine.add_request("computer", TokensPrompt(prompt_token_ids=prompt), computed)
    side.storage.batch_get_into = read
    return {
        "plain": plain,
        "outputs": outputs,
        "states": list(dict.fromkeys(states)),
        "before": before.model_dump(),
        "books": books(llm),
    }


def first_token_steps(arguments: dict[str, Any]) -> dict[str, Any]:
    """How many engine steps each request takes to its first token, stepping vLLM by hand: a
    prompt L3 holds (vLLM's cache emptied) and one nobody has seen, arriving together. The
    in-memory L3 is given 50 ms between steps (it needs microseconds), so the count is the
    connector's and vLLM's steps, not how the IO threads happened to be scheduled."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    held, fresh = (conversations(1, 1, seed=seed)[0][0] for seed in (11, 12))
    llm = build(settings=arguments.get("settings"))
    generate(llm, [held])  # its KV reaches L3
    llm.reset_prefix_cache()
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, detokenize=False)
    for name, prompt in (("held", held), ("fresh", fresh)):
        engine.add_request(name, TokensPrompt(prompt_token_ids=prompt), params)
    steps: dict[str, int] = {}
    for step in range(1, 50):
        time.sleep(0.05)
        for out in engine.step():
            if out.outputs[0].token_ids:
                steps.setdefault(out.request_id.split("-")[0], step)
        if len(steps) == 2:
            break
    return {"steps": steps, "books": books(llm)}


def instance(arguments: dict[str, Any]) -> dict[str, Any]:
    """One vLLM instance (a process of its own) serving ``prompts`` over the L3 at
    ``storage``: run twice over one L3, the second serves what the first computed.

    With ``hold`` (a folder) it writes its result there (``result.json``) and stays up until a
    file ``release`` appears there: Mooncake keeps pages in the segments its clients mount, so
    the instance that stored them must be up while another reads them."""
    llm = build(settings={"stagefate.storage": arguments["storage"]})
    outputs = generate(llm, arguments["prompts"])
    result = {"outputs": outputs, "books": books(llm)}
    hold = arguments.get("hold")
    if hold is not None:
        folder = Path(hold)
        (folder / "result.json.partial").write_text(json.dumps(result))
        (folder / "result.json.partial").rename(folder / "result.json")
        deadline = time.monotonic() + 600
        while not (folder / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    return result


class LoadWatch:
    """What any connector has vLLM load, watched on the scheduler side by vLLM's own calls:
    blocks loaded (by their vLLM block hash); within one batch of arrivals, those another
    request had loaded already (``duplicates``: the same KV brought in twice for two requests,
    what in-flight dedup is for), and those the same request loads again (``reloads``: it was
    preempted, its blocks freed, and it loads them back when it is scheduled again)."""

    def __init__(self, connector: Any) -> None:
        self.blocks = 0
        self.duplicates = 0
        self.reloads = 0
        self._local: dict[str, int] = {}
        self._batch: dict[bytes, set[str]] = {}
        """block hash -> the requests that loaded it in this batch"""
        ask, allocated = connector.get_num_new_matched_tokens, connector.update_state_after_alloc

        def watched_ask(request: Any, num_computed_tokens: int) -> Any:
            self._local[request.request_id] = num_computed_tokens
            return ask(request, num_computed_tokens)

        def watched_allocated(request: Any, blocks: Any, num_external_tokens: int) -> Any:
            if num_external_tokens > 0:
                rid = request.request_id
                first = self._local[rid] // BLOCK
                for block_hash in request.block_hashes[
                    first : first + num_external_tokens // BLOCK
                ]:
                    self.blocks += 1
                    loaders = self._batch.setdefault(block_hash, set())
                    self.reloads += rid in loaders
                    self.duplicates += bool(loaders) and rid not in loaders
                    loaders.add(rid)
            return allocated(request, blocks, num_external_tokens)

        connector.get_num_new_matched_tokens = watched_ask
        connector.update_state_after_alloc = watched_allocated

    def next_batch(self) -> None:
        self._batch.clear()


def _metrics(llm: Any) -> dict[str, float]:
    """vLLM's own counters (summed over labels) and its TTFT histogram's mean."""
    found: dict[str, float] = {}
    for metric in llm.get_metrics():
        if hasattr(metric, "value"):
            found[metric.name] = found.get(metric.name, 0) + float(metric.value)
        elif metric.name == "vllm:time_to_first_token_seconds" and metric.count:
            found["ttft_sum"] = found.get("ttft_sum", 0) + metric.sum
            found["ttft_count"] = found.get("ttft_count", 0) + metric.count
    return found


def workload(arguments: dict[str, Any]) -> dict[str, Any]:
    """Batches of prompts (arrival order, one ``generate`` each) through vLLM with a device
    pool of ``kv_blocks`` blocks (vLLM's default when absent) and ``connector`` (stagefate's
    with ``settings``); what vLLM and the connector report. ``warm`` prompts run first and
    vLLM's prefix cache is then reset: L3 warm, vLLM cold, and nothing of theirs counted."""
    connector = arguments.get("connector")
    blocks = arguments.get("kv_blocks")
    options = {} if blocks is None else {"num_gpu_blocks_override": blocks}
    llm = build(connector, settings=arguments.get("settings"), as_shipped=True, **options)
    if arguments.get("warm"):
        generate(llm, arguments["warm"], arguments["max_tokens"])
        llm.reset_prefix_cache()
    side = None if connector is None else llm.llm_engine.engine_core.engine_core.scheduler
    if side is not None and connector == STAGEFATE and arguments.get("l3_read_seconds"):
        _slow_reads(side.connector.scheduler.storage, arguments["l3_read_seconds"])
    watch = None if side is None else LoadWatch(side.connector)
    before = _metrics(llm)
    from stagefate.targets.vllm import copy_per_request  # imports vLLM: here, not at the top

    copied = dict(copy_per_request.COUNTS)
    counted = None
    if side is not None and connector == STAGEFATE:
        counted = side.connector.scheduler.pipeline.stats
    outputs = []
    start = time.perf_counter()
    for batch in arguments["batches"]:
        outputs += generate(llm, batch, arguments["max_tokens"])
        if watch is not None:
            watch.next_batch()
    wall = time.perf_counter() - start
    after = _metrics(llm)
    result: dict[str, Any] = {
        "outputs": [o["tokens"] for o in outputs],
        "ttfts": [o["ttft"] for o in outputs],
        "wall": wall,
        "metrics": {name: value - before.get(name, 0.0) for name, value in after.items()},
        "loaded_blocks": 0 if watch is None else watch.blocks,
        "duplicate_blocks": 0 if watch is None else watch.duplicates,
        "reloaded_blocks": 0 if watch is None else watch.reloads,
    }
    if connector == COPY_PER_REQUEST:  # its store is its L3: it reads what it loads
        result["copied"] = {k: v - copied[k] for k, v in copy_per_request.COUNTS.items()}
    if counted is not None:
        books_now = result["stagefate"] = books(llm)
        # the measured batches' only, not the warm-up's
        books_now["stats"] = stats_since(counted, books_now["stats"])
    return result


def main() -> None:
    actions = {
        "workload": workload,
        "instance": instance,
        "computed_meanwhile": computed_meanwhile,
        "first_token_steps": first_token_steps,
        "server": server,
        "check": check,
        "compare": compare,
        "shared": shared,
        "bounce_full": bounce_full,
        "load_failure": load_failure,
        "l3_failures": l3_failures,
        "evicted_while_queued": evicted_while_queued,
        "abort": abort,
    }
    action = sys.argv[1]
    if action not in actions:
        raise SystemExit(f"unknown action {action!r}; one of {sorted(actions)}")
    arguments = json.loads(sys.stdin.read() or "{}")
    result = actions[action](arguments)
    sys.stdout.write("\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
