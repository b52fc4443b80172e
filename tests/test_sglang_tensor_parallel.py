"""SGLang's own pipeline as two tensor-parallel ranks, one process each over gloo, per-rank faults.

Each process builds the newest installed SGLang's ``UnifiedRadixCache`` in buffer mode with
``tp_cache_group`` set and the parallel topology of a plain TP=2 deployment (the stepped driver
of docs/sglang.md, ``tp_group``), over one L3 directory, where SGLang's file backend keys each
rank's shard ``__{rank}_{size}``. The ranks make the same scheduler calls; the fault is one
rank's. Both ranks must end with the same admission and every bounce slot back
(docs/tensor-parallel.md, "SGLang under tensor parallelism").
"""

from __future__ import annotations

import os
import pathlib
from types import SimpleNamespace

import pytest

from stagefate.targets import TargetUnavailable
from stagefate.targets.sglang import require
from stagefate.testing import run_ranks_over_gloo

try:
    require()
except TargetUnavailable as missing:
    pytest.skip(f"{missing}", allow_module_level=True)

TOKENS = list(range(1, 33))  # eight pages of four


def _sglang_rank(rank: int, size: int) -> tuple[bool, int, bool]:
    """(the hold was staged, tokens admitted, every bounce slot back) on this rank."""
    import torch.distributed as dist
    from sglang.srt.utils import rank_consensus_checker

    from stagefate.targets.sglang.generations import stepped_sglang

    l3 = pathlib.Path(os.environ["STAGEFATE_SGLANG_TP_L3"])
    fault = os.environ["STAGEFATE_SGLANG_TP_FAULT"]
    group = dist.new_group(list(range(size)), backend="gloo")
    # SGLang's own checker: every @rank_consensus decision compared across the ranks (it needs
    # the scheduler's group coordinators; a stand-in with the group's cpu_group serves)
    rank_consensus_checker.configure([SimpleNamespace(cpu_group=group)])
    assert rank_consensus_checker.enabled()
    driver = stepped_sglang(page_size=4, storage_dir=l3, tp_group=group, tp_rank=rank)
    driver.produce(TOKENS, None)  # each rank writes its own shard
    dist.barrier()
    if fault == "missing" and rank == 1:  # three of rank 1's page objects gone
        names = sorted(p.name for p in l3.glob(f"*__{rank}_{size}.bin"))[:3]
        assert driver.drop_l3(lambda name: name not in names) == 3
    dist.barrier()
    driver.issue("r0", TOKENS, None)
    driver.tick()
    driver.run_existence_queries()
    driver.tick()
    driver.run_reads(failing=fault == "failed" and rank == 1)
    driver.settle()
    staged = bool(driver.consumer.cache.buffer_pipeline.has_staged(driver.requests["r0"].handle))
    admitted = driver.admit("r0")
    driver.settle()
    return staged, admitted, driver.pipeline_host_available() == driver.baseline_host


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("none", (True, 32, True)),
        # SGLang agrees the hit count with MIN: both ranks read what rank 1 has
        ("missing", (True, 4, True)),
        # a read failed on rank 1: the agreed ack drops the span on both
        ("failed", (False, 0, True)),
    ],
)
def test_sglangs_ranks_stay_in_lockstep_under_a_per_rank_fault(
    fault: str,
    expected: tuple[bool, int, bool],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STAGEFATE_SGLANG_TP_L3", str(tmp_path))
    monkeypatch.setenv("STAGEFATE_SGLANG_TP_FAULT", fault)
    monkeypatch.setenv("SGLANG_ENABLE_RANK_CONSENSUS_CHECKER", "1")
    assert run_ranks_over_gloo(_sglang_rank, 2, timeout=120) == [expected, expected]
