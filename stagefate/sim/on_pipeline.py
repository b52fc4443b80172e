"""What the ``live`` and ``blind`` policies share: both run over a stagefate pipeline's tree,
pools, copy engine and storage."""

from __future__ import annotations

import torch

from ..runtime import TokenKey
from ..runtime.storage import ReportsDamage
from ..statemachine.pipeline import BufferPipeline
from .policy import LastSplice


class OnPipeline(LastSplice):
    """A policy over a stagefate :class:`BufferPipeline`'s tree, pools and storage."""

    def __init__(self, pipe: BufferPipeline) -> None:
        self.pipe, self.tree, self.device_pool = pipe, pipe.tree, pipe.device_pool

    def write_through(self, key: TokenKey, device_indices: torch.Tensor) -> None:
        self.pipe.write_through(key, device_indices)

    def l3_damage(self) -> str:
        storage = self.pipe.storage
        return storage.damage_report() if isinstance(storage, ReportsDamage) else ""

    def finish(self) -> None:
        """Writes through are synchronous here: nothing is left in the background."""
