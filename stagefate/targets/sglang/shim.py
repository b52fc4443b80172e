"""What SGLang 0.5.23 needs to import and run on a CPU, replaced here and nowhere else.

Each stand-in says what it replaces and why; none of them decides anything SGLang decides.

* ``triton`` (imported by ``sglang/srt/utils/common.py`` and by kernels at module level): there
  is no CPU build. A stand-in package answers any attribute: names that look like classes are
  empty classes (so ``isinstance``/``except``/subclassing work), anything else is a module that,
  called, is a decorator (``@triton.jit``, ``@triton.autotune(...)``) turning the kernel into
  one that raises if it is ever launched: a CPU run that reaches a kernel has taken a GPU path,
  and must say so rather than run a kernel's Python body. It claims a version, because torch's
  inductor reads ``triton.__version__`` on import. torch's own "is triton there?" probes are
  answered *before* the stand-in exists, so torch keeps believing it is absent and never tries
  to compile with it.
* ``torchvision`` (imported by ``sglang/srt/configs/deepseek_ocr.py``, reached through the
  memory pools' imports): PyPI's torchvision does not load beside the CPU torch 2.13 wheel. A
  stand-in like the above, with a real ``InterpolationMode`` enum and torchvision 0.28's
  version. Under transformers 5.19 and later (0.5.22 onwards) transformers' own "is torchvision
  there?" check is cached as False first, so transformers never uses it. Under transformers 5.12
  (the pin of 0.5.19 to 0.5.21) ``AutoImageProcessor`` is a placeholder that refuses to work without
  torchvision, and 0.5.19's configs register image processors through it at import: there the
  check finds the stand-in (and reads its version), and nothing on the CPU paths processes an
  image.
* Classes of either stand-in accept any arguments (0.5.19's fp8 kernel module builds
  ``triton.Config({...}, num_warps=...)`` at import) and keep none.

Five patches let the buffer-mode pipeline and the engine run on a CPU (:func:`patch_for_cpu`,
applied by the pipeline driver and, in the engine's scheduler process, by
:mod:`.engine.standins`):

* ``host_memory_budget_bytes`` refuses a host pool larger than the machine's free memory (less
  a reserve, split among local ranks). The pools here hold one layer, one head and one dim (a
  few bytes a token), so the machine's memory is not the question, yet a run died in that check
  ("Requesting 0.00 GB but only have -1.65 GB free") while another program used memory: the
  check answers that any pool fits. What SGLang decides with the pool's size is unchanged.

* ``HostKVCache`` pins its host pools through ``torch.cuda.cudart()``, which does not exist
  without CUDA: it is built with ``pin_memory=False`` (upstream's own corruption-test fixture
  does the same). Pinning only changes how fast a GPU copy is, not what is copied.
* The ``direct`` IO backend with the ``layer_first`` layout copies rows with sgl_kernel's
  ``transfer_kv_direct``, which has no CPU build: an indexed row copy per layer in torch does
  the same (``dst[dst_indices] = src[src_indices]``). SGLang still decides which rows move.
* A paged allocator's ``alloc_extend`` (a hybrid model's only way to allocate, :mod:`.hybrid`)
  launches the triton kernel ``alloc_extend_kernel`` unconditionally up to 0.5.21; 0.5.22 and
  later run SGLang's own torch twin of it, ``alloc_extend_naive`` (same module, in every
  release), where the platform has no triton. Up to 0.5.21 the kernel's launch runs that twin.
* The same allocator's ``alloc_decode`` (every decode step of the engine) launches
  ``alloc_decode_kernel`` unconditionally up to 0.5.21, and those releases ship no torch twin of
  it: the launch runs :func:`_alloc_decode`, the kernel's rule in torch (a request whose next
  token starts a page takes the next free page, in batch order; any other continues after its
  last slot).
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import inspect
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

from packaging.version import Version

_STOOD_IN = ("triton", "torchvision")
TORCHVISION = "0.28.0"
"""The torchvision release built for torch 2.13: the version the stand-in claims."""
TORCHVISION_FREE = "5.19"
"""The first transformers (0.5.23's pin) whose ``AutoImageProcessor`` is not a torchvision-only
placeholder; older ones (0.5.19 pins 5.12.1) must find torchvision to import SGLang."""
_installed = False


class _StandIn(types.ModuleType):
    """A module whose every attribute is a stand-in too (classes for CamelCase names)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value: Any
        if name[:1].isupper():
            value = type(name, (), {"__module__": self.__name__, "__init__": _accept_anything})
        else:
            value = _StandIn(f"{self.__name__}.{name}")
            sys.modules[value.__name__] = value
        setattr(self, name, value)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return _Kernel(args[0])  # @triton.jit
        return _Kernel  # @triton.jit(...), @triton.autotune(...)


def _accept_anything(self: object, *args: Any, **kwargs: Any) -> None:
    """A stand-in class is built with whatever its caller passes (``triton.Config({...},
    num_warps=4)`` at a kernel module's import) and keeps none of it."""


class _Kernel:
    """A triton kernel defined but never launchable on a CPU."""

    def __init__(self, function: Any) -> None:
        self.function = function
        self.__name__ = getattr(function, "__name__", "kernel")

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"triton kernel {self.__name__} launched on a CPU: SGLang took a GPU-only path "
            "that the stagefate target does not stand in for"
        )

    __call__ = _refuse

    def __getitem__(self, grid: Any) -> Any:
        return self._refuse


class InterpolationMode(enum.Enum):
    """torchvision's enum, by value (transformers and SGLang's configs name its members)."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in _STOOD_IN:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StandIn(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "triton":
            module.__version__ = "3.0.0"  # type: ignore[attr-defined]
        elif module.__name__ == "torchvision":
            module.__version__ = TORCHVISION  # type: ignore[attr-defined]
        elif module.__name__ == "torchvision.transforms":
            module.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]


def install() -> None:
    """Install the stand-ins (once); torch and transformers decide first that neither exists."""
    global _installed
    if _installed:
        return
    import torch.utils._triton as torch_triton

    probes: Sequence[Callable[[], object]] = (
        torch_triton.has_triton_package,
        torch_triton.has_triton,
    )
    for probe in probes:
        probe()  # cached (functools.cache / lru_cache): they keep their answer
    from importlib.metadata import version

    # decided before transformers is imported: an old one fixes its placeholders at import
    if Version(version("transformers")) >= Version(TORCHVISION_FREE):
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()  # cached as False before the stand-in exists
    sys.meta_path.insert(0, _Finder())
    _installed = True
    import warnings

    # SGLang's quantization modules warn on import that AWQ/GGUF need CUDA; true and irrelevant.
    warnings.filterwarnings("ignore", message=".*(AWQ|GGUF).*", category=UserWarning)


_patched = False


def _transfer_kv_direct(
    src_layers: Sequence[Any],
    dst_layers: Sequence[Any],
    src_indices: Any,
    dst_indices: Any,
    page_size: int,
) -> None:
    """sgl_kernel's ``transfer_kv_direct`` in torch: copy rows layer by layer."""
    for source, target in zip(src_layers, dst_layers, strict=True):
        target[dst_indices.to(target.device)] = source[src_indices.to(source.device)].to(
            target.device
        )


SIMULATED_HOST_BUDGET = 1 << 50
"""What the host-memory check is told is free (a petabyte): every simulated pool fits."""


def _simulated_host_budget(*args: Any, **kwargs: Any) -> int:
    return SIMULATED_HOST_BUDGET


def _alloc_extend_as_naive(naive: Callable[..., None]) -> Callable[..., None]:
    """``alloc_extend_kernel``'s arguments passed to SGLang's ``alloc_extend_naive`` (the torch
    version of the same kernel; the kernel's extra argument is its block size)."""

    def launch(
        prefix_lens: Any,
        seq_lens: Any,
        last_loc: Any,
        free_pages: Any,
        out_indices: Any,
        block_size: int,
        page_size: int,
    ) -> None:
        naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, "cpu")

    return launch


def _alloc_decode(
    seq_lens: Any,
    last_loc: Any,
    free_pages: Any,
    out_indices: Any,
    bs_upper: int,
    page_size: int,
) -> None:
    """``alloc_decode_kernel``'s rule in torch: the slot of each request's next token."""
    import torch

    opens_page = (seq_lens - 1) % page_size == 0
    rank = torch.cumsum(opens_page.to(torch.int64), 0) - 1
    if len(free_pages):  # none free: the caller sees too few pages and discards the answer
        page = free_pages[rank.clamp(0, len(free_pages) - 1)]
        out_indices.copy_(torch.where(opens_page, page * page_size, last_loc + 1))
    else:
        out_indices.copy_(last_loc + 1)


class _Launch:
    """``kernel[grid](...)`` run as a torch function of the same arguments."""

    def __init__(self, function: Callable[..., None]) -> None:
        self.function = function

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return self.function


def patch_for_cpu() -> None:
    """Apply the five patches of the module docstring (once)."""
    global _patched
    if _patched:
        return
    from sglang.srt.mem_cache.pool_host import base, mha

    mha.transfer_kv_direct = _transfer_kv_direct
    import sglang.srt.mem_cache.memory_pool_host  # noqa: F401  (imports the budget by name)

    for name, module in list(sys.modules.items()):
        if name.startswith("sglang.srt.mem_cache") and hasattr(module, "host_memory_budget_bytes"):
            module.host_memory_budget_bytes = _simulated_host_budget  # type: ignore[attr-defined]
    unpinned = base.HostKVCache.__init__
    signature = inspect.signature(unpinned)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        # by name, wherever the caller put it (0.5.19's subclasses pass it by position)
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments["pin_memory"] = False
        unpinned(*bound.args, **bound.kwargs)

    base.HostKVCache.__init__ = init
    from sglang.srt.mem_cache.allocator import paged

    if "use_triton_kernels" not in inspect.getsource(paged.PagedTokenToKVPoolAllocator):
        paged.alloc_extend_kernel = _Launch(_alloc_extend_as_naive(paged.alloc_extend_naive))
        paged.alloc_decode_kernel = _Launch(_alloc_decode)
    _patched = True
