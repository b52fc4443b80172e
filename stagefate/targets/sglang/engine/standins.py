"""What SGLang's engine needs on a CPU beyond :mod:`..shim`, in place in every process it spawns.

The engine spawns its scheduler, detokenizer and (for the HTTP server) its tokenizer manager as
fresh interpreters (``mp.set_start_method("spawn")``), each importing sglang at once. A stand-in
must therefore exist before the first import of sglang in every one of them: the engine's
processes start with ``boot/`` on ``PYTHONPATH``, whose ``sitecustomize`` calls :func:`install`
at interpreter start (:mod:`.launch` sets that up; nothing is written into the environment).

* ``triton`` and ``torchvision``: :func:`..shim.install`, as for the pipeline target.
* ``sgl_kernel``: ``SGLANG_USE_CPU_ENGINE=1`` (the switch for SGLang's CPU platform) makes
  modules import sgl_kernel's CPU build at import (``mem_cache/allocation.py`` and
  ``kernels/ops/kvcache/cache_move.py``, by name). The only one a run here calls is
  ``assign_req_to_token_pool_cpu`` (every extend and decode writes a request's slots into its
  row of ``req_to_token``): a torch version of it stands in. Every other top-level name is a
  function that raises if called, naming itself: a CPU run that reaches one took a path this
  target does not stand in for. Its submodules (``sgl_kernel.scalar_type``, say) are absent, so
  SGLang's own fallbacks for a missing sgl_kernel run, as they were written to. No
  ``torch.ops.sgl_kernel`` op is registered, so ``cpu_has_amx_support()`` stays False and
  layers take their torch paths.
* The buffer-mode patches of :func:`..shim.patch_for_cpu` (an unpinned host pool, a torch
  ``transfer_kv_direct``), applied in the scheduler's process once its module is imported (the
  host pool is built after that, in ``Scheduler.__init__``).
* stagefate's lifecycle as the buffer-mode pipeline, where ``STAGEFATE_SGLANG`` asks for it
  (:func:`stagefate.integrations.sglang.pipeline.install`, at the seam where SGLang builds it).
* :mod:`.probe` on every scheduler once it is built (the pipeline's time per step, its L3
  reads), read with the books.
* :mod:`.books`' methods on SGLang's ``Scheduler`` (``stagefate_books``), called over SGLang's
  own ``collective_rpc``: stagefate's look at SGLang's books from inside the process that holds
  them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

from .. import shim

SCHEDULER = "sglang.srt.managers.scheduler"
"""The module whose import means "this is (or may become) a scheduler process"."""


def assign_req_to_token_pool_cpu(
    req_pool_indices: Any,
    req_to_token: Any,
    start_offset: Any,
    end_offset: Any,
    out_cache_loc: Any,
    pool_len: int,
) -> None:
    """sgl_kernel's op in torch: request ``i``'s row gets, at ``start_offset[i]:end_offset[i]``,
    the next ``end - start`` slots of ``out_cache_loc`` (requests' slots lie back to back)."""
    taken = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        length = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + length].to(req_to_token.dtype)
        taken += length


class _KernelModule(types.ModuleType):
    """``sgl_kernel``: one op in torch, every other name a function that refuses to run."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        self.__version__ = "0.0.0+stagefate"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                f"{full} called on a CPU: SGLang took a path that needs sgl_kernel's CPU build, "
                "which the stagefate engine target does not stand in for"
            )

        refuse.__name__ = name
        setattr(self, name, refuse)
        return refuse


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``sgl_kernel`` with the stand-in, and runs ``after_import`` once the scheduler's
    module is imported (its loader wrapped; the module itself is SGLang's, unchanged)."""

    def __init__(self, after_import: Callable[[], None]) -> None:
        self.after_import = after_import

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "sgl_kernel":
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if fullname != SCHEDULER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            original(module)
            self.after_import()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _KernelModule(spec.name)
        module.assign_req_to_token_pool_cpu = assign_req_to_token_pool_cpu  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module is built whole by :meth:`create_module`."""


def stagefate_close(self: Any) -> None:
    """A ``Scheduler`` method the driver calls over ``collective_rpc`` before it shuts the
    engine down (which kills the scheduler's process): stagefate's lifecycle, where it is the
    pipeline, stops its IO threads and closes its transition log with its closing record."""
    close = getattr(self.tree_cache.buffer_pipeline, "close", None)
    if close is not None:
        close()


def _scheduler_imported() -> None:
    shim.patch_for_cpu()
    from sglang.srt.managers.scheduler import Scheduler

    from ....integrations.sglang import pipeline
    from . import books, probe

    books.attach()
    Scheduler.stagefate_close = stagefate_close
    pipeline.install()
    built = Scheduler.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        built(self, *args, **kwargs)
        probe.attach(self)

    Scheduler.__init__ = __init__


_installed = False


def install() -> None:
    """Put every stand-in in place (once per process), before sglang is imported."""
    global _installed
    if _installed:
        return
    shim.install()
    sys.meta_path.insert(0, _Finder(_scheduler_imported))
    _installed = True
