"""Page keys: a SHA-256 chain over page tokens, seeded by the request namespace.

``key[i] = sha256(key[i-1] || page_i tokens)`` with ``key[-1] = sha256(namespace)``, so a page's
key commits to every token before it and to ``(extra_key, cache_salt)``: equal tokens under
different namespaces never share a key, in the tree or in L3.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

from .tokens import TOKEN_BYTES, TokenKey, Tokens

Namespace = tuple[str | None, str | None]
ROOT_NAMESPACE: Namespace = (None, None)


def namespace_of(extra_key: str | None, cache_salt: str | None) -> Namespace:
    """A request's namespace (docs/design.md §2), checked: each part a str or None."""
    if extra_key is None and cache_salt is None:
        return ROOT_NAMESPACE
    for name, value in (("extra_key", extra_key), ("cache_salt", cache_salt)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None, got {type(value).__name__}")
    return (extra_key, cache_salt)


@functools.lru_cache(maxsize=1024)
def namespace_seed(namespace: Namespace) -> bytes:
    """The digest a namespace's page-key chain starts from: one namespace never names another's
    pages."""
    extra_key, cache_salt = namespace
    text = f"stagefate/v1\x00{extra_key!r}\x00{cache_salt!r}"
    return hashlib.sha256(text.encode()).digest()


def page_hashes(
    tokens: Tokens, page_size: int, namespace: Namespace, seed: bytes | None = None
) -> list[bytes]:
    """Chained digests of every whole page of ``tokens`` (a trailing partial page is ignored).

    ``seed`` continues a chain (the digest of the page before ``tokens``); by default the chain
    starts at the namespace seed.
    """
    previous = namespace_seed(namespace) if seed is None else seed
    return chain_digests(TokenKey.of(tokens).data, page_size * TOKEN_BYTES, previous)


def chain_digests(data: bytes, page_bytes: int, previous: bytes) -> list[bytes]:
    """:func:`page_hashes` on encoded tokens, continuing the chain from ``previous``."""
    digests = []
    sha256 = hashlib.sha256
    for start in range(0, len(data) - page_bytes + 1, page_bytes):
        previous = sha256(previous + data[start : start + page_bytes]).digest()
        digests.append(previous)
    return digests


storage_key: Callable[[bytes], str] = bytes.hex
"""A page's L3 object key: its digest in hex (a C method: ``map`` over it runs no Python)."""


def aux_storage_key(digest: bytes) -> str:
    """The key of a page's sliding-window (aux) KV, stored beside its main KV."""
    return digest.hex() + ".aux"


def rank_storage_keys(
    rank: int, size: int
) -> tuple[Callable[[bytes], str], Callable[[bytes], str]]:
    """A tensor-parallel rank's (main, aux) L3 key of a page: each rank stores its own shard
    (its KV heads) under keys of its own, suffixed ``_{rank}_{size}`` (SGLang's HiCacheFile
    appends ``_{model}_{rank}_{size}``); a single rank keeps the bare keys."""
    if size == 1:
        return storage_key, aux_storage_key
    suffix = f"_{rank}_{size}"
    return (lambda digest: digest.hex() + suffix), (lambda digest: aux_storage_key(digest) + suffix)
