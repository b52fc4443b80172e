"""A process stagefate started and must end on every path: ``with`` closes it."""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

Open = TypeVar("Open", bound="ClosedOnExit")


class ClosedOnExit:
    """``with thing:`` calls ``thing.close()`` however the block ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: Open) -> Open:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
