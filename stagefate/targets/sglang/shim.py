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
  stand-in like the above, with a real ``InterpolationMode`` enum; transformers' own
  "is torchvision there?" check is cached as False first, so transformers never uses it.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

_STOOD_IN = ("triton", "torchvision")
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
            value = type(name, (), {"__module__": self.__name__})
        else:
            value = _StandIn(f"{self.__name__}.{name}")
            sys.modules[value.__name__] = value
        setattr(self, name, value)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return _Kernel(args[0])  # @triton.jit
        return _Kernel  # @triton.jit(...), @triton.autotune(...)


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
        elif module.__name__ == "torchvision.transforms":
            module.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]


def install() -> None:
    """Install the stand-ins (once); torch and transformers decide first that neither exists."""
    global _installed
    if _installed:
        return
    import torch.utils._triton as torch_triton
    from transformers.utils import import_utils

    probes: Sequence[Callable[[], object]] = (
        torch_triton.has_triton_package,
        torch_triton.has_triton,
        import_utils.is_torchvision_available,
    )
    for probe in probes:
        probe()  # cached (functools.cache / lru_cache): they keep their answer
    sys.meta_path.insert(0, _Finder())
    _installed = True
    import warnings

    # SGLang's quantization modules warn on import that AWQ/GGUF need CUDA; true and irrelevant.
    warnings.filterwarnings("ignore", message=".*(AWQ|GGUF).*", category=UserWarning)
