"""The process that holds one SGLang engine and answers commands, one JSON line each way.

Run by a release's interpreter (``python -m stagefate.targets.sglang.engine.driver``) with the
environment of :func:`.settings.engine_environment`, so the engine's spawned processes find the
stand-ins at interpreter start. Its first line in is ``{"settings": {...}, "model": FOLDER,
"work": FOLDER}``; it answers ``{"ready": true}`` once the engine
serves. Then each line in is a command, each line out its answer (``{"error": TRACEBACK}`` when
it raised; the engine keeps serving):

* ``generate``: ``{"batch": Batch}`` (:class:`.batch.Batch`); per prompt its output ids, their
  logprobs, SGLang's cache split and finish reason, its latency and, streamed, its time to the
  first token. A request not answered within the batch's
  ``timeout_s`` (:data:`ANSWER_TIMEOUT_S` unless given) is aborted and reported ``timed_out``:
  one SGLang never answers must not hold the driver for ever;
* ``flush``: ``flush_cache()``, retried until SGLang accepts it (it refuses while busy);
* ``books``: the scheduler's :mod:`.books` report over ``collective_rpc``, with ``rids``;
* ``shutdown`` (stagefate's lifecycle, where it is the pipeline, closed first).

SGLang prints to standard output too; the answers travel on a copy of the original descriptor
and everything else, the engine's children included, writes to standard error.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from .batch import Batch
from .settings import EngineSettings

FLUSH_TRIES = 50
ANSWER_TIMEOUT_S = 120.0


class Driver:
    """One ``sglang.Engine`` serving the model, and the commands of the module's docstring."""

    def __init__(self, settings: EngineSettings, model: Path, work: Path) -> None:
        import sglang

        self.work = work
        self.engine = sglang.Engine(**settings.arguments(model))

    def generate(self, batch: Batch) -> list[dict[str, Any]]:
        engine = self.engine
        prompts = batch.prompts
        sampling = {"max_new_tokens": batch.max_new_tokens, "temperature": 0.0}
        answered = [asyncio.Event() for _ in prompts]
        waits = batch.start_after or [None] * len(prompts)
        salted = batch.salts or [None] * len(prompts)
        timeout_s = batch.timeout_s or ANSWER_TIMEOUT_S

        async def one(index: int, prompt: list[int], rid: str | None) -> dict[str, Any]:
            first = waits[index]
            if first is not None:
                await answered[first].wait()
            try:
                answer = ask(prompt, rid, salted[index])
                return await asyncio.wait_for(answer, timeout_s)
            except TimeoutError:
                if rid is not None:
                    engine.tokenizer_manager.abort_request(rid=rid)
                return {"rid": rid, "timed_out": True}
            finally:
                answered[index].set()

        async def ask(prompt: list[int], rid: str | None, salt: str | None) -> dict[str, Any]:
            sent = time.perf_counter()
            first_at = None
            asked = dict(sampling_params=sampling, return_logprob=True, rid=rid, cache_salt=salt)
            if batch.stream:  # the last chunk holds the whole answer (non-incremental)
                out: dict[str, Any] = {}
                async for chunk in await engine.async_generate(
                    input_ids=prompt, stream=True, **asked
                ):
                    first_at = time.perf_counter() if first_at is None else first_at
                    out = chunk
            else:
                out = await engine.async_generate(input_ids=prompt, **asked)
            done = time.perf_counter()
            meta = out["meta_info"]
            return {
                "rid": meta.get("id", rid),
                "output_ids": out["output_ids"],
                "logprobs": [entry[0] for entry in meta.get("output_token_logprobs", [])],
                "cached": meta.get("cached_tokens_details"),
                "cached_tokens": meta.get("cached_tokens"),
                "finish_reason": meta.get("finish_reason"),
                "ttft_s": None if first_at is None else first_at - sent,
                "latency_s": done - sent,
            }

        async def abort(rid: str, after: float) -> None:
            await asyncio.sleep(after)
            engine.tokenizer_manager.abort_request(rid=rid)

        async def everything() -> list[dict[str, Any]]:
            names: list[str | None] = list(batch.rids) if batch.rids else [None] * len(prompts)
            aborts = [abort(rid, after) for rid, after in (batch.abort_after_s or {}).items()]
            results = await asyncio.gather(
                *(one(i, p, r) for i, (p, r) in enumerate(zip(prompts, names, strict=True))),
                *aborts,
            )
            return list(results[: len(prompts)])

        return engine.loop.run_until_complete(everything())  # type: ignore[no-any-return]

    def flush(self) -> bool:
        for _ in range(FLUSH_TRIES):
            answer = self.engine.flush_cache()
            if getattr(answer, "success", True):
                return True
            time.sleep(0.1)
        return False

    def books(self, rids: list[str] | None = None) -> dict[str, Any]:
        handle, name = tempfile.mkstemp(dir=self.work, suffix=".json")
        os.close(handle)
        try:
            self.engine.collective_rpc("stagefate_books", path=name, rids=list(rids or []))
            return json.loads(Path(name).read_text(encoding="utf-8"))  # type: ignore[no-any-return]
        finally:
            os.unlink(name)

    def shutdown(self) -> None:
        try:
            self.engine.collective_rpc("stagefate_close")  # standins.stagefate_close
        finally:
            self.engine.shutdown()


def _answer(driver: Driver, command: dict[str, Any]) -> Any:
    op = command.pop("op")
    if op == "generate":
        return driver.generate(Batch(**command["batch"]))
    if op == "flush":
        return driver.flush()
    if op == "books":
        return driver.books(**command)
    raise ValueError(f"unknown command {op!r}")


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # SGLang's prints, and every child's, go to stderr
    sys.stdout = sys.stderr
    first = json.loads(sys.stdin.readline())
    driver = Driver(EngineSettings(**first["settings"]), Path(first["model"]), Path(first["work"]))

    def say(value: Any) -> None:
        answers.write(json.dumps(value) + "\n")
        answers.flush()

    say({"ready": True})
    try:
        for line in sys.stdin:
            command = json.loads(line)
            if command.get("op") == "shutdown":
                break
            try:
                say({"ok": _answer(driver, command)})
            except Exception:
                say({"error": traceback.format_exc()})
    finally:
        driver.shutdown()
        say({"closed": True})


if __name__ == "__main__":
    main()
