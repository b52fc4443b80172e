"""SGLang's HTTP server (``python -m sglang.launch_server``) on 127.0.0.1, with the engine
target's arguments and stand-ins: :class:`SGLangServer`.

The server is SGLang's whole serving path as a user runs it (its FastAPI app in front of the
tokenizer manager, scheduler and detokenizer); requests go to its ``/generate`` with token ids.
It runs in a session of its own, so closing it ends every process it spawned.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..environments import Installed
from .lifetime import ClosedOnExit
from .model import shared_model
from .settings import EngineSettings, engine_environment

START_TIMEOUT_S = 180.0
FLUSH_WAIT_S = 30.0
HOST = "127.0.0.1"


class ServerFailed(RuntimeError):
    """The server did not come up, or answered an error; the message says which."""


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def flags(arguments: dict[str, Any]) -> list[str]:
    """``sglang.Engine``'s keyword arguments as ``launch_server`` flags."""
    argv = []
    for name, value in arguments.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, str(value)]
    return argv


class SGLangServer(ClosedOnExit):
    """SGLang's HTTP server serving the tiny model on a free port of 127.0.0.1."""

    def __init__(self, target: Installed, settings: EngineSettings) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="stagefate-server-"))
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        l3 = self.work / "l3"
        l3.mkdir()
        model = shared_model()
        argv = [str(target.python), "-m", "sglang.launch_server"]
        argv += flags(settings.arguments(model) | {"host": HOST, "port": self.port})
        self.log = self.work / "server.log"
        self.transitions = self.work / "transitions.jsonl"
        """stagefate's transition log, when its lifecycle is the engine's pipeline."""
        with self.log.open("w", encoding="utf-8") as log:
            self._process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=engine_environment(target.python, l3, settings, self.transitions),
                start_new_session=True,
            )
        try:
            self._wait_until_healthy()
        except BaseException:
            self.close()
            raise

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ServerFailed(
                    f"the server exited with {self._process.returncode}:\n"
                    + self.log.read_text(encoding="utf-8")[-3000:]
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1.0)
        raise ServerFailed(f"the server did not answer /health within {START_TIMEOUT_S:.0f} s")

    def post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read().decode())

    def generate(self, prompt: list[int], max_new_tokens: int = 8) -> dict[str, Any]:
        """One request to ``/generate``; SGLang's answer (``output_ids``, ``meta_info``)."""
        body = {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
        }
        return self.post("/generate", body)  # type: ignore[no-any-return]

    def flush(self) -> None:
        """``/flush_cache``, given SGLang's own wait for idle (it refuses, 400, while busy)."""
        url = f"{self.url}/flush_cache?timeout={FLUSH_WAIT_S}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=60):
                return
        except urllib.error.HTTPError as refused:
            raise ServerFailed(f"the server refused to flush its cache: {refused}") from None

    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        shutil.rmtree(self.work, ignore_errors=True)
