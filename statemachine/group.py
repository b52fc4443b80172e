"""Tensor-parallel agreement: the collective the pipeline's ranks agree through, and two groups.

Under tensor parallelism every rank runs its own pipeline (tree, pools, L3 keys) over its shard
of the KV heads, and the ranks stay identical only because every fact one rank can see and
another cannot (how many pages L3 found, how many a read delivered, whether it failed, how much
bounce room there is) is agreed before anything acts on it: the smallest value for what was
delivered, the largest for a give-up verdict (SGLang's ``_all_reduce`` in
``unified_radix_cache.py``). One protocol serves both: element-wise MIN or MAX over a list of
ints, every rank passing a list of the same length.

* :class:`LocalGroup`: N ranks in one process, each pipeline driven on a thread of its own
  (:meth:`LocalGroup.run`); a rank waits at the rendezvous for the others, so a rank that never
  arrives raises :class:`~.errors.LockstepError` after ``timeout`` seconds instead of hanging.
  Tests and the fuzzer use it; a test can patch ``all_reduce_min``/``all_reduce_max``.
* :class:`TorchGroup`: one rank per process over an initialised ``torch.distributed`` process
  group (gloo on a CPU, NCCL on a GPU), through ``all_reduce`` with ``ReduceOp.MIN``/``MAX``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, cast

import torch

from .errors import LockstepError

T = TypeVar("T")


class Group(Protocol):
    """What a pipeline needs of its ranks: who it is, how many they are, and agreement."""

    @property
    def rank(self) -> int:
        """This process's rank, from 0."""
        ...

    @property
    def size(self) -> int:
        """How many ranks the group has."""
        ...

    def all_reduce_min(self, values: Sequence[int]) -> list[int]:
        """The element-wise minimum of every rank's ``values`` (each rank the same length)."""
        ...

    def all_reduce_max(self, values: Sequence[int]) -> list[int]:
        """The element-wise maximum of every rank's ``values``."""
        ...

    def all_gather(self, value: object) -> list[object]:
        """Every rank's ``value``, in rank order (only on the error path: it is not cheap)."""
        ...


class RankMissing(LockstepError):
    """A rank waited at the agreement for one that never came (it failed, or skipped a pass)."""


class _Rendezvous:
    """Where a LocalGroup's ranks meet: each deposits, the last one in computes for all."""

    def __init__(self, size: int, timeout: float) -> None:
        self.size = size
        self.timeout = timeout
        self.deposits: list[object] = [None] * size
        self.result: object = None
        self.barrier = threading.Barrier(size)

    def exchange(
        self, rank: int, value: object, combine: Callable[[list[object]], object]
    ) -> object:
        self.deposits[rank] = value
        try:
            if self.barrier.wait(self.timeout) == 0:
                self.result = combine(list(self.deposits))
            self.barrier.wait(self.timeout)  # the result is there before anyone reads it
        except threading.BrokenBarrierError:
            raise RankMissing(
                f"rank {rank} waited at the agreement and not every rank arrived within "
                f"{self.timeout:g} s: a rank failed or skipped a pass (every rank must poll "
                "every pass)"
            ) from None
        # read before returning: the next result is computed only once every rank deposits again
        return self.result


class LocalGroup:
    """One rank of N stepped in one process; make all N with :meth:`create`."""

    def __init__(self, rank: int, rendezvous: _Rendezvous) -> None:
        self._rank = rank
        self._rendezvous = rendezvous

    @classmethod
    def create(cls, size: int, timeout: float = 30.0) -> list[LocalGroup]:
        """All ``size`` ranks, one rendezvous among them (a rank waits at most ``timeout`` s)."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"a group needs at least one rank, got size={size!r}")
        rendezvous = _Rendezvous(size, timeout)
        return [cls(rank, rendezvous) for rank in range(size)]

    @property
    def rank(self) -> int:
        """This rank's index."""
        return self._rank

    @property
    def size(self) -> int:
        """How many ranks share the rendezvous."""
        return self._rendezvous.size

    def all_reduce_min(self, values: Sequence[int]) -> list[int]:
        """As :meth:`Group.all_reduce_min`, once every rank deposited."""
        return self._reduce(values, min)

    def all_reduce_max(self, values: Sequence[int]) -> list[int]:
        """As :meth:`Group.all_reduce_max`, once every rank deposited."""
        return self._reduce(values, max)

    def all_gather(self, value: object) -> list[object]:
        """As :meth:`Group.all_gather`, once every rank deposited."""
        gathered = self._rendezvous.exchange(self._rank, value, lambda deposits: deposits)
        assert isinstance(gathered, list)
        return gathered

    def _reduce(self, values: Sequence[int], pick: Callable[[Sequence[int]], int]) -> list[int]:
        def combine(deposited: list[object]) -> object:
            deposits = cast("list[list[int]]", deposited)
            lengths = [len(d) for d in deposits]
            if len(set(lengths)) > 1:
                return LockstepError(
                    f"ranks passed lists of different lengths to one agreement ({lengths}, by "
                    "rank): they are out of lockstep"
                )
            return [pick(column) for column in zip(*deposits, strict=True)]

        result = self._rendezvous.exchange(self._rank, list(values), combine)
        if isinstance(result, LockstepError):
            raise result
        assert isinstance(result, list)
        return result

    def run(self, *steps: Callable[[], T]) -> list[T]:
        """Run one callable per rank (rank order), each on its own thread; their results.

        The first exception a rank raises is re-raised here, after every thread has ended (a
        rank that fails breaks the rendezvous, so the others stop waiting for it).
        """
        if len(steps) != self.size:
            raise ValueError(f"run takes one callable per rank: {self.size}, got {len(steps)}")
        results: list[object] = [None] * self.size
        errors: list[BaseException | None] = [None] * self.size

        def body(rank: int) -> None:
            try:
                results[rank] = steps[rank]()
            except BaseException as error:  # re-raised below, on the caller's thread
                errors[rank] = error
                self._rendezvous.barrier.abort()

        threads = [threading.Thread(target=body, args=(rank,)) for rank in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self._rendezvous.barrier.broken:
            self._rendezvous.barrier.reset()
        # a rank's own failure first: the others only saw it as a rank missing from the agreement
        raised = [error for error in errors if error is not None]
        raised.sort(key=lambda error: isinstance(error, RankMissing))
        if raised:
            raise raised[0]
        return results  # type: ignore[return-value]


class TorchGroup:
    """This process's rank of an initialised ``torch.distributed`` group (gloo or NCCL)."""

    def __init__(self, group: object | None = None, device: str = "cpu") -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "TorchGroup needs torch.distributed initialised first: call "
                "torch.distributed.init_process_group('gloo', ...) (or 'nccl' on GPUs)"
            )
        self._dist = dist
        self._group = group
        self._device = device

    @property
    def rank(self) -> int:
        """This process's rank in the torch group."""
        return int(self._dist.get_rank(self._group))  # type: ignore[arg-type]

    @property
    def size(self) -> int:
        """The torch group's world size."""
        return int(self._dist.get_world_size(self._group))  # type: ignore[arg-type]

    def all_reduce_min(self, values: Sequence[int]) -> list[int]:
        """As :meth:`Group.all_reduce_min`, one ``all_reduce`` (MIN)."""
        return self._reduce(values, self._dist.ReduceOp.MIN)

    def all_reduce_max(self, values: Sequence[int]) -> list[int]:
        """As :meth:`Group.all_reduce_max`, one ``all_reduce`` (MAX)."""
        return self._reduce(values, self._dist.ReduceOp.MAX)

    def all_gather(self, value: object) -> list[object]:
        """As :meth:`Group.all_gather`, through ``all_gather_object``."""
        gathered: list[object] = [None] * self.size
        self._dist.all_gather_object(gathered, value, group=self._group)
        return gathered

    def _reduce(self, values: Sequence[int], op: object) -> list[int]:
        tensor = torch.tensor(list(values), dtype=torch.int64, device=self._device)
        self._dist.all_reduce(tensor, op=op, group=self._group)
        return [int(v) for v in tensor.tolist()]
