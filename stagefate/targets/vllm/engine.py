"""Runs inside vLLM's environment: a tiny local Llama served by vLLM (in-process engine, dummy
weights, fixed seed), with and without the StagefateConnector; each action answers one JSON line.

``python -m stagefate.targets.vllm.engine ACTION`` with the arguments as JSON on stdin:

* ``check``: one request served end to end through the connector (the install's last step);
* ``compare``: a multi-turn workload without the connector and with it, greedy outputs of both,
  then the same with every page in L3 overwritten by other KV (the loaded KV is used);
* ``shared``: requests sharing a prefix arriving together: what L3 served and what vLLM loaded;
* ``abort``: a request aborted while its load is in flight;
* ``load_failure``: the worker's copy fails once, under vLLM's ``kv_load_failure_policy``.

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

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

BLOCK = 32
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


def build(connector: bool, **extra: Any) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    options: dict[str, Any] = {}
    if connector:
        policy = extra.pop("kv_load_failure_policy", "fail")
        settings = {"stagefate.storage": "memory", **extra}
        options["kv_transfer_config"] = KVTransferConfig(
            kv_connector="StagefateConnector",
            kv_connector_module_path="stagefate.integrations.vllm",
            kv_role="kv_both",
            kv_load_failure_policy=policy,
            kv_connector_extra_config=settings,
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
        }
        for out in outputs
    ]


def conversations(count: int, turns: int, seed: int = 0) -> list[list[list[int]]]:
    """``count`` conversations sharing a system prompt; turn k's prompt is turn k-1's prompt,
    its answer stand-in and a new message (the answer itself is not known before the run, so a
    fixed stand-in keeps the prompts the same with and without the connector)."""
    rng = random.Random(seed)
    system = [rng.randrange(3, 1000) for _ in range(4 * BLOCK)]
    chats = []
    for _ in range(count):
        prompt = system + [rng.randrange(3, 1000) for _ in range(rng.randrange(40, 200))]
        chat = [prompt]
        for _ in range(turns - 1):
            prompt = prompt + [rng.randrange(3, 1000) for _ in range(rng.randrange(40, 200))]
            chat.append(prompt)
        chats.append(chat)
    return chats


def scheduler_connector(llm: Any) -> Any:
    core = llm.llm_engine.engine_core.engine_core
    return core.scheduler.connector


def books(llm: Any) -> dict[str, Any]:
    """Where the connector's and vLLM's books stand (after the prefix cache was reset)."""
    side = scheduler_connector(llm).scheduler
    pipe = side.pipeline
    pipe.poll()
    pool = side.cache.pool
    llm.reset_prefix_cache()
    return {
        "live_records": len(pipe.records),
        "io_pending": pipe.io.pending(),
        "pins": len(side.cache.pinned_blocks()),
        "host_free": pipe.host_pool.available(),
        "host_total": pipe.host_pool.capacity,
        "free_blocks": pool.get_num_free_blocks(),
        "total_blocks": pool.num_gpu_blocks - 1,  # the null block is never free
        "in_flight": len(side.in_flight),
        "stats": pipe.stats.model_dump(),
        "load_errors": side.load_errors,
    }


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
    llm = build(True)
    prompt = conversations(1, 1)[0][0]
    first = generate(llm, [prompt])
    llm.reset_prefix_cache()
    again = generate(llm, [prompt])
    if first[0]["tokens"] != again[0]["tokens"] or again[0]["cached"] == 0:
        raise SystemExit(f"the connector did not serve the request: {first} then {again}")
    return {"tokens": again[0]["tokens"], "cached": again[0]["cached"], "books": books(llm)}


def compare(arguments: dict[str, Any]) -> dict[str, Any]:
    chats = conversations(arguments.get("conversations", 4), arguments.get("turns", 3))
    plain = run_turns(build(False), chats, reset=True)
    llm = build(True)
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
    llm = build(True)
    generate(llm, prompts[:1])  # the prefix reaches L3 through the first request
    llm.reset_prefix_cache()
    before = scheduler_connector(llm).scheduler.pipeline.stats
    outputs = generate(llm, prompts)
    after = books(llm)
    return {
        "outputs": outputs,
        "before": before.model_dump(),
        "books": after,
        "prefix_tokens": len(prefix),
    }


def load_failure(arguments: dict[str, Any]) -> dict[str, Any]:
    """The worker's first copy into vLLM's blocks fails; vLLM applies its policy."""
    from stagefate.integrations.vllm import kv_layout

    policy = arguments["policy"]
    prompt = conversations(1, 1)[0][0]
    plain = generate(build(False), [prompt])
    llm = build(True, kv_load_failure_policy=policy)
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
    again = generate(llm, [prompt])  # the failed pages are gone from L3: not offered again
    return {"plain": plain, "failed": failed, "again": again, "books": books(llm)}


def abort(_: dict[str, Any]) -> dict[str, Any]:
    """A request aborted while its load is in flight: spliced into the blocks vLLM allocated,
    its copy handed to the worker, its ``ack`` not fired (vLLM still waits for the KV)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompt = conversations(1, 1)[0][0]
    llm = build(True)
    generate(llm, [prompt])
    llm.reset_prefix_cache()
    engine, side = llm.llm_engine, scheduler_connector(llm).scheduler
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, detokenize=False)
    engine.add_request("doomed", TokensPrompt(prompt_token_ids=prompt), params)
    seen: list[str | None] = []
    deadline = time.monotonic() + 30  # the L3 read runs on the IO threads meanwhile
    while time.monotonic() < deadline:  # vLLM suffixes the id it is given: its own is "doomed-…"
        engine.step()
        ours = [rid for rid in side.pipeline.records if rid.startswith("doomed")]
        seen.append(side.pipeline.state(ours[0]) if ours else None)
        if seen[-1] == "consumed":  # spliced: the copy is the worker's, the ack not yet fired
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
    import socket
    import subprocess
    import urllib.request

    chats = conversations(arguments.get("conversations", 2), arguments.get("turns", 3))
    work = Path(tempfile.mkdtemp(prefix="stagefate-vllm-server-"))
    log = work / "transitions.jsonl"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    transfer = {
        "kv_connector": "StagefateConnector",
        "kv_connector_module_path": "stagefate.integrations.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "stagefate.storage": f"file:{work / 'l3'}",
            "stagefate.log": str(log),
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
    finally:
        process.terminate()
        process.wait(timeout=60)
        output.close()
    plain = run_turns(build(False), chats, reset=True)
    return {"served": served, "plain": plain, "log": str(log)}


def _cached(answer: dict[str, Any]) -> int:
    details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def main() -> None:
    actions = {
        "server": server,
        "check": check,
        "compare": compare,
        "shared": shared,
        "load_failure": load_failure,
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
