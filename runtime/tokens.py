"""Token sequences as bytes: the one encoding the tree compares and the page keys digest.

A token is a signed 64-bit little-endian integer, so ``n`` tokens are ``8 n`` bytes. Comparing
a node's tokens with a request's is then one ``memcmp`` (``bytes.startswith`` at an offset)
instead of ``n`` Python int comparisons, and a page is a bytes slice that hashes in C.

Converting costs O(n) once: an int tensor converts at memory speed, a Python list at about the
cost of ``struct.pack``. Callers that match the same request several times (the pipeline does:
at issue, at the IO commit, at plan) convert once and pass the :class:`TokenKey`.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

TOKEN_BYTES = 8
_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


@dataclass(frozen=True, slots=True)
class TokenKey:
    """An encoded token sequence; build it with :meth:`of`."""

    data: bytes

    @classmethod
    def of(cls, tokens: Tokens) -> TokenKey:
        if isinstance(tokens, TokenKey):
            return tokens
        return cls(encode_tokens(tokens))

    def __len__(self) -> int:
        return len(self.data) // TOKEN_BYTES

    def prefix(self, length: int) -> TokenKey:
        """The first ``length`` tokens."""
        end = length * TOKEN_BYTES
        return self if end == len(self.data) else TokenKey(self.data[:end])

    def whole_pages(self, page_size: int) -> TokenKey:
        """Cut to whole pages: what a tree, a pool page or an L3 object can hold."""
        tokens = len(self.data) // TOKEN_BYTES
        return self.prefix(tokens - tokens % page_size)

    def tolist(self) -> list[int]:
        return list(struct.unpack(f"<{len(self)}q", self.data))


Tokens = Sequence[int] | torch.Tensor | TokenKey


@functools.lru_cache(maxsize=1024)
def _packer(count: int) -> Callable[..., bytes]:
    """The packer of ``count`` little-endian int64s, compiled once per length: a request is
    encoded at the same length again and again (its issue, its matches, its write-through)."""
    return struct.Struct(f"<{count}q").pack


def encode_tokens(tokens: Sequence[int] | torch.Tensor) -> bytes:
    """The bytes of ``tokens``; a clear error for anything that is not a 1-D run of int64s."""
    if type(tokens) is not list:  # a list, the common case, goes straight to the pack
        if isinstance(tokens, torch.Tensor):
            if tokens.dim() != 1 or tokens.dtype not in _INT_DTYPES:
                raise TypeError(
                    f"tokens must be a 1-D integer tensor, got shape {tuple(tokens.shape)} and "
                    f"dtype {tokens.dtype}; pass a list of ints or tensor.reshape(-1).long()"
                )
            array = tokens.detach().to("cpu", torch.int64).numpy()
            return array.astype("<i8", copy=False).tobytes()
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
            raise TypeError(f"tokens must be a sequence of ints, got {type(tokens).__name__}")
    try:
        return _packer(len(tokens))(*tokens)
    except struct.error as error:
        raise TypeError(
            f"tokens must contain ints only: token ids in the int64 range ({error})"
        ) from None
