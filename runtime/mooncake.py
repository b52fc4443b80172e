"""L3 on Mooncake Store: a distributed KV store that several serving instances share.

Theory of operation
-------------------
Pages go through ``mooncake.store.MooncakeDistributedStore``, set up as SGLang's HiCache does
(``P2PHANDSHAKE`` metadata, a master address, tcp or rdma). Data moves on the zero-copy path
only: a staging buffer is registered once (``register_buffer``) and pages are copied into it and
put with ``batch_put_from``, or fetched into it with ``batch_get_into``; both return a byte count
or an error code per key. (Plain ``get`` returns ``b""`` for every failure, so it cannot tell a
miss from an error.) The bounce pool itself cannot be registered instead: it is plane-major
(``[layers, 2, slots, ...]``), so a page is not contiguous there.

Semantics the store imposes, and what this class does with them:

* a put of an existing key keeps the old value: keys are content addressed, so that is correct;
* a full store answers ``-200``: the page is skipped and counted (``full_skips``);
* ``remove`` answers ``-706`` while a read lease is held: it is retried with ``force=True``;
* a master restart loses every key: reads become misses, nothing else breaks;
* a dead data holder answers ``-800`` or ``-704``: that page is a miss (counted), which ends a
  read short and the pipeline releases what it held;
* ``setup`` against a master that is not up blocks for about 90 s: the master's ``/health``
  (on its metrics port) is asked first, and an unanswered one fails at once, naming the address.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np
import torch

from .pages import copy_pages_into
from .pools import KVLayout

FULL = -200
LEASE_HELD = -706
DEFAULT_METRICS_PORT = 9003
"""mooncake_master's default ``--metrics_port`` (its ``/health`` lives there)."""


class MooncakeUnavailable(RuntimeError):
    """The Mooncake client or master cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class MooncakeConfig:
    """Where Mooncake Store's master is and how a client joins it (parsed from
    ``mooncake://HOST:PORT``)."""

    master: str
    """``HOST:PORT`` of the master's RPC service."""
    metrics_port: int = DEFAULT_METRICS_PORT
    local_hostname: str = "127.0.0.1"
    protocol: str = "tcp"
    rdma_devices: str = ""
    global_segment_size: int = 256 * 2**20
    local_buffer_size: int = 64 * 2**20

    @classmethod
    def from_url(cls, url: str, environ: dict[str, str] | None = None) -> MooncakeConfig:
        """``mooncake://HOST:PORT[?metrics_port=Q]``, completed by the MOONCAKE_* variables."""
        env = dict(os.environ if environ is None else environ)
        parsed = urlparse(url)
        if parsed.scheme != "mooncake" or not parsed.hostname or not parsed.port:
            raise ValueError(
                f"storage {url!r}: expected mooncake://HOST:PORT (the master's RPC address), "
                "e.g. mooncake://127.0.0.1:50051"
            )
        query = parse_qs(parsed.query)
        metrics = query.get("metrics_port", [env.get("MOONCAKE_METRICS_PORT", "")])[0]
        return cls(
            master=f"{parsed.hostname}:{parsed.port}",
            metrics_port=int(metrics) if metrics else DEFAULT_METRICS_PORT,
            local_hostname=env.get("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1"),
            protocol=env.get("MOONCAKE_PROTOCOL", "tcp"),
            rdma_devices=env.get("MOONCAKE_DEVICE", ""),
            global_segment_size=int(env.get("MOONCAKE_GLOBAL_SEGMENT_SIZE", 256 * 2**20)),
            local_buffer_size=int(env.get("MOONCAKE_LOCAL_BUFFER_SIZE", 64 * 2**20)),
        )

    @property
    def health_url(self) -> str:
        return f"http://{self.master.rsplit(':', 1)[0]}:{self.metrics_port}/health"


def master_is_healthy(config: MooncakeConfig, timeout: float = 2.0) -> bool:
    """Whether the Mooncake master answers its health check within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(config.health_url, timeout=timeout) as response:
            return bool(json.loads(response.read() or b"{}").get("status") == "ok")
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _import_store() -> type:
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as error:
        raise MooncakeUnavailable(
            f"cannot import mooncake.store ({error}); install the extra "
            "(pip install 'stagefate[mooncake]': mooncake-transfer-engine-non-cuda on CPU "
            "machines, the CUDA package on GPU ones) and the system library libibverbs1 "
            "(apt-get install libibverbs1), which it needs even without RDMA"
        ) from None
    store_class: type = MooncakeDistributedStore
    return store_class


class MooncakeStorage:
    """The :class:`~stagefate.runtime.storage.Storage` interface on a Mooncake cluster."""

    def __init__(
        self,
        config: MooncakeConfig,
        layout: KVLayout,
        page_size: int,
        staging_pages: int = 64,
    ) -> None:
        store_class = _import_store()
        if not master_is_healthy(config):
            raise MooncakeUnavailable(
                f"the Mooncake master at {config.master} does not answer {config.health_url}; "
                "start mooncake_master there (or pass ?metrics_port= if its --metrics_port is "
                "not the default), then retry"
            )
        self.config = config
        self.page_shape = layout.shape(page_size)
        self.dtype = layout.dtype
        self.page_bytes = page_size * layout.bytes_per_token
        self._store = store_class()
        code = self._store.setup(
            config.local_hostname,
            "P2PHANDSHAKE",
            config.global_segment_size,
            config.local_buffer_size,
            config.protocol,
            config.rdma_devices,
            config.master,
        )
        if code != 0:
            raise MooncakeUnavailable(f"Mooncake setup against {config.master} failed ({code})")
        self._staging_pages = staging_pages
        self._staging = torch.zeros(staging_pages * self.page_bytes, dtype=torch.uint8)
        if torch.cuda.is_available():
            self._staging = self._staging.pin_memory()
        self._base = self._staging.data_ptr()
        code = self._store.register_buffer(self._base, self._staging.numel())
        if code != 0:
            raise MooncakeUnavailable(f"register_buffer of the staging buffer failed ({code})")
        self._lock = threading.Lock()  # one staging buffer: one batch at a time
        self.full_skips = 0
        self.errors = 0
        self.misses = 0

    def _chunks(self, count: int) -> Iterator[range]:
        for start in range(0, count, self._staging_pages):
            yield range(start, min(count, start + self._staging_pages))

    def _slots(self, count: int) -> tuple[list[int], list[int]]:
        return (
            [self._base + i * self.page_bytes for i in range(count)],
            [self.page_bytes] * count,
        )

    def batch_exists(self, keys: Sequence[str]) -> int:
        """Consecutive keys present from the first (an error counts as absent)."""
        found = 0
        for present in self._store.batch_is_exist(list(keys)) if keys else []:
            if present != 1:
                break
            found += 1
        return found

    def batch_get(self, keys: Sequence[str]) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = []
        with self._lock:
            for chunk in self._chunks(len(keys)):
                names = [keys[i] for i in chunk]
                pointers, sizes = self._slots(len(names))
                results = self._store.batch_get_into(names, pointers, sizes)
                for position, result in enumerate(results):
                    if result != self.page_bytes:
                        self.misses += 1
                        out.append(None)
                        continue
                    start = position * self.page_bytes
                    raw = self._staging[start : start + self.page_bytes].clone()
                    out.append(raw.view(self.dtype).reshape(self.page_shape))
        return out

    def batch_get_into(self, keys: Sequence[str], out: np.ndarray, dtype: torch.dtype) -> int:
        return copy_pages_into(self.batch_get(keys), out, dtype, len(keys))

    def batch_set(self, keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
        if len(keys) != len(tensors):
            raise ValueError(f"batch_set: {len(keys)} keys but {len(tensors)} pages")
        with self._lock:
            for chunk in self._chunks(len(keys)):
                names = [keys[i] for i in chunk]
                for position, i in enumerate(chunk):
                    page = tensors[i].to("cpu", self.dtype).contiguous().view(torch.uint8)
                    if page.numel() != self.page_bytes:
                        raise ValueError(
                            f"batch_set: page {keys[i]!r} has {page.numel()} bytes, "
                            f"expected {self.page_bytes} (shape {self.page_shape})"
                        )
                    start = position * self.page_bytes
                    self._staging[start : start + self.page_bytes].copy_(page.reshape(-1))
                pointers, sizes = self._slots(len(names))
                for result in self._store.batch_put_from(names, pointers, sizes):
                    if result == FULL:
                        self.full_skips += 1
                    elif result < 0:
                        self.errors += 1

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            if self._store.remove(key) == LEASE_HELD:
                self._store.remove(key, True)

    def close(self) -> None:
        self._store.close()


# ---------------------------------------------------------------------- a local master


def free_port() -> int:
    """A TCP port free on the loopback now (for a master started by a test or a replay)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LocalMaster:
    """``mooncake_master`` on loopback (free ports picked here), for tests and benchmarks.

    The binary's defaults bind 0.0.0.0 and ``--rpc_port=0`` is not "any port", so both addresses
    are given; a taken port makes the master exit with code 1 without a word, which is detected.
    Stopped by PID (SIGTERM, then SIGKILL); use it as a context manager.
    """

    def __init__(self, lease_ttl_ms: int = 200, client_ttl_s: int = 5) -> None:
        self.binary = _master_binary()
        self.config = MooncakeConfig(master=f"127.0.0.1:{free_port()}", metrics_port=free_port())
        self._flags = [f"--default_kv_lease_ttl={lease_ttl_ms}", f"--client_ttl={client_ttl_s}"]
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> None:
        rpc = self.config.master.rsplit(":", 1)[1]
        self._process = process = subprocess.Popen(
            [
                str(self.binary),
                "--rpc_address=127.0.0.1",
                f"--rpc_port={rpc}",
                "--metrics_host=127.0.0.1",
                f"--metrics_port={self.config.metrics_port}",
                "--logtostderr",
                *self._flags,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while not master_is_healthy(self.config, timeout=0.5):
            if process.poll() is not None:
                raise MooncakeUnavailable(
                    f"mooncake_master exited with code {process.returncode} before answering "
                    f"on {self.config.master} (port taken?)"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise MooncakeUnavailable(f"mooncake_master did not answer within {timeout_s} s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self._process is not None:
            _stop(self._process)
            self._process = None

    def restart(self) -> None:
        """Stop and start again on the same ports: every key is lost."""
        self.stop()
        self.start()

    def __enter__(self) -> LocalMaster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _master_binary() -> Path:
    try:
        import mooncake
    except ImportError:
        _import_store()  # raises the install message
        raise
    binary = Path(mooncake.__file__).parent / "mooncake_master"
    if not binary.is_file():
        raise MooncakeUnavailable(f"{binary} is missing from the mooncake package")
    return binary
