"""SGLang's storage backend over a stagefate :class:`~stagefate.runtime.Storage`: the L3 an
SGLang instance shares with the others behind a router (``replay --instances N``).

SGLang's cache controller reaches its file backend through three calls, made at call time on
``cache_controller.storage_backend``: ``batch_exists`` (the prefetch's existence query),
``batch_get`` (``_generic_page_get``: a read stops at the first page that is missing) and
``batch_set`` (``_generic_page_set``: a backup's pages). The pipeline is built with its file
backend as always; :func:`attach` then puts this one in its place, so every query, read and
write SGLang makes lands in the given store under SGLang's own keys (its page hash chain). The
pages are SGLang's flat host pages, stored and handed back as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...runtime import Storage


class StorageBackend:
    """The part of SGLang's ``HiCacheStorage`` its generic page path calls, over ``storage``."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def batch_exists(self, keys: Sequence[str], extra_info: Any = None) -> int:
        return self.storage.batch_exists(keys)

    def exists(self, key: str) -> bool:
        return self.storage.batch_exists([key]) == 1

    def batch_get(
        self, keys: Sequence[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        return self.storage.batch_get(keys)

    def batch_set(
        self,
        keys: Sequence[str],
        values: Sequence[torch.Tensor] | None = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        if values is None:
            raise ValueError("batch_set: SGLang's generic page path passes the pages as values")
        self.storage.batch_set(keys, list(values))
        return True

    def get_stats(self) -> None:
        """No backend statistics (SGLang then logs empty ones)."""

    def close(self) -> None:
        """The store belongs to the caller."""


def attach(cache: Any, storage: Storage) -> None:
    """Put ``storage`` behind ``cache``'s controller in place of the backend it was built
    with (whose directory stays empty)."""
    cache.cache_controller.storage_backend = StorageBackend(storage)
