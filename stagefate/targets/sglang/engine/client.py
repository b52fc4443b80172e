"""SGLang's engine, started and driven from this process: :class:`SGLangEngine`.

The engine lives in a driver process (:mod:`.driver`) run by the release's interpreter, so any
release installed here can serve, whichever sglang this interpreter imports. Starting costs
about 15-35 s here (the engine spawns and imports sglang in each of its processes); tests start
one per module and share it. What the engine logs goes to a file in its folder; a failure's
message carries that log's last lines (SGLang's harmless import noise left out).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ..environments import Installed
from .batch import Batch
from .lifetime import ClosedOnExit
from .model import shared_model
from .settings import EngineSettings, engine_environment

DRIVER = "stagefate.targets.sglang.engine.driver"
LOG_TAIL = 25
IDLE_WAIT_S = 60.0
_NOISE = "Ignore import error when loading sglang.srt.models."
"""SGLang's line for each model module that needs sgl_kernel's ops (not the tiny Llama's)."""


class EngineFailed(RuntimeError):
    """The engine did not start, or a command raised in it; the message carries why."""


class SGLangEngine(ClosedOnExit):
    """One SGLang engine serving the tiny model (:mod:`.model`), with its own L3 folder.

    ``l3`` may be given to share L3 between engines (a second engine then starts warm);
    ``transitions``, where stagefate's lifecycle (when it is the pipeline) writes its transition
    log, to keep it after the engine's folder is gone."""

    def __init__(
        self,
        target: Installed,
        settings: EngineSettings,
        l3: Path | None = None,
        transitions: Path | None = None,
    ) -> None:
        self.target = target
        self.settings = settings
        self.work = Path(tempfile.mkdtemp(prefix="stagefate-engine-"))
        self.l3 = l3 if l3 is not None else self.work / "l3"
        self.l3.mkdir(parents=True, exist_ok=True)
        self.log = self.work / "engine.log"
        self.transitions = transitions or self.work / "transitions.jsonl"
        """stagefate's transition log, when its lifecycle is the engine's pipeline."""
        with self.log.open("w", encoding="utf-8") as log:
            self._process = subprocess.Popen(
                [str(target.python), "-m", DRIVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=engine_environment(target.python, self.l3, settings, self.transitions),
                text=True,
            )
        try:
            model = str(shared_model())
            self._send({"settings": settings.as_json(), "model": model, "work": str(self.work)})
            ready = self._receive()
        except BaseException:
            self.close()
            raise
        if not ready.get("ready"):
            tail = self.log_tail()
            self.close()
            raise EngineFailed(f"SGLang {target.version}'s engine did not start: {ready}\n{tail}")

    def _send(self, message: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(message) + "\n")
        self._process.stdin.flush()

    def _receive(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            status = self._process.wait()
            raise EngineFailed(
                f"SGLang {self.target.version}'s engine driver exited with status {status}; "
                f"the end of its log:\n{self.log_tail()}"
            )
        return json.loads(line)  # type: ignore[no-any-return]

    def log_tail(self, lines: int = LOG_TAIL) -> str:
        """The last ``lines`` lines the engine logged, its import noise left out."""
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        kept = [line for line in text.splitlines() if _NOISE not in line]
        return "\n".join(kept[-lines:])

    def _call(self, op: str, **arguments: Any) -> Any:
        self._send({"op": op, **arguments})
        answer = self._receive()
        if "error" in answer:
            raise EngineFailed(
                f"{op} raised in SGLang {self.target.version}'s engine:\n{answer['error']}"
            )
        return answer["ok"]

    def generate(self, batch: Batch | list[list[int]], **shape: Any) -> list[dict[str, Any]]:
        """Send a :class:`.batch.Batch` (or prompts, with its other fields by name); each
        prompt's answer (see :mod:`.driver`), in order."""
        if not isinstance(batch, Batch):
            batch = Batch(batch, **shape)
        return self._call("generate", batch=batch.as_json())  # type: ignore[no-any-return]

    def flush(self) -> None:
        """Empty the device tree and pools (not L3), as ``flush_cache`` does, once the engine is
        idle (:meth:`wait_idle`): a write-through still on its way to L3 arrives first."""
        self.wait_idle()
        if not self._call("flush"):
            raise EngineFailed("SGLang refused to flush its cache (it stayed busy)")

    def books(self, rids: list[str] | None = None) -> dict[str, Any]:
        """The scheduler's books (:mod:`.books`), naming any structure that holds ``rids``."""
        return self._call("books", rids=rids)  # type: ignore[no-any-return]

    def wait_idle(self, rids: list[str] | None = None, timeout_s: float = IDLE_WAIT_S) -> Any:
        """The books (:meth:`books`) once the scheduler is fully idle and buffer mode has
        nothing queued, staged or in flight (its write-throughs to L3 included)."""
        deadline = time.monotonic() + timeout_s
        while True:
            books = self.books(rids)
            pipeline = books["pipeline"]
            if books["fully_idle"] and (pipeline is None or pipeline["idle"]):
                return books
            if time.monotonic() > deadline:
                raise EngineFailed(f"the engine did not go idle in {timeout_s:.0f} s: {books}")
            time.sleep(0.1)

    def close(self) -> None:
        """Shut the engine down and remove its folder (an L3 given by the caller stays)."""
        process = self._process
        if process.poll() is None:
            try:
                self._send({"op": "shutdown"})
                process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        shutil.rmtree(self.work, ignore_errors=True)
