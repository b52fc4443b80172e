"""N tensor-parallel ranks in spawned processes joined by ``torch.distributed`` over gloo: what
the rank fuzzer runs its programs on and what an engine's own tests may run their ranks on
(re-exported by :mod:`stagefate.testing`)."""

from __future__ import annotations

import multiprocessing
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

T = TypeVar("T")


def run_ranks_over_gloo(
    body: Callable[[int, int], T], size: int, timeout: float = 120.0
) -> list[T]:
    """``body(rank, size)`` in ``size`` spawned processes joined by ``torch.distributed`` (gloo
    on 127.0.0.1, so a :class:`~stagefate.TorchGroup` can be built there); the results in rank
    order. ``body`` must be importable by name (it is pickled into the processes); a rank that
    raises, or a run past ``timeout`` seconds, raises here with the rank's traceback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    ranks = [
        context.Process(target=_gloo_rank, args=(body, rank, size, port, timeout, out))
        for rank in range(size)
    ]
    for process in ranks:
        process.start()
    try:
        reports = [out.get(timeout=timeout) for _ in ranks]
    finally:
        for process in ranks:
            process.join(10)
            if process.is_alive():
                process.kill()
    failed = [(rank, error) for rank, _result, error in reports if error is not None]
    if failed:
        rank, error = min(failed)
        raise RuntimeError(f"rank {rank} of {size} failed:\n{error}")
    return [result for _rank, result, _error in sorted(reports, key=lambda r: r[0])]


def _gloo_rank(
    body: Callable[[int, int], Any], rank: int, size: int, port: int, timeout: float, out: Any
) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=timeout),
    )
    try:
        out.put((rank, body(rank, size), None))
    except BaseException:
        out.put((rank, None, traceback.format_exc()))
    finally:
        dist.destroy_process_group()
