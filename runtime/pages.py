"""Pages read into a run of bounce slots: the shape of one page in the run, and the copy of
page tensors into it (shared by the storage backends, so none imports another)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from .pools import numpy_view


def page_shape_in(out: np.ndarray, pages: int) -> tuple[int, tuple[int, ...]]:
    """Tokens per page and the NumPy shape of one page, for ``pages`` pages read into ``out``."""
    page_tokens = out.shape[2] // pages
    return page_tokens, (*out.shape[:2], page_tokens, *out.shape[3:])


def copy_pages_into(
    pages: Iterable[torch.Tensor | None], out: np.ndarray, dtype: torch.dtype, count: int
) -> int:
    """:meth:`Storage.batch_get_into` over page tensors already fetched (``count`` of them)."""
    if not count:
        return 0
    page_tokens, expected = page_shape_in(out, count)
    copied = 0
    for tensor in pages:
        if tensor is None or tensor.dtype != dtype:
            break
        view = numpy_view(tensor)
        if view.shape != expected:
            break
        out[:, :, copied * page_tokens : (copied + 1) * page_tokens] = view
        copied += 1
    return copied
