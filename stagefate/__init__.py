"""stagefate: the fate of staged KV-cache prefetches, as a formally specified state machine.

The public face: everything an engine scheduler or a test needs is importable from here.
"""

from .runtime import (
    AuxPool,
    DevicePool,
    FileStorage,
    HostPool,
    KVLayout,
    ManualIO,
    MatchResult,
    MemoryStorage,
    RadixTree,
    Storage,
    ThreadedIO,
    TokenKey,
)
from .runtime.io import Completion, IOExecutor, IOOp
from .runtime.prefix_tree import PrefixTree
from .runtime.storage import open_storage
from .spec import load_spec
from .statemachine.config import PipelineConfig
from .statemachine.errors import LifecycleError, LockstepError
from .statemachine.group import Group, LocalGroup, TorchGroup
from .statemachine.pipeline import BufferPipeline
from .statemachine.record import Record, TransitionEvent
from .statemachine.stats import Stats


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stagefate")
    except PackageNotFoundError:  # a checkout on sys.path that was never installed
        return "0+unknown"


__version__ = _version()

__all__ = [
    "AuxPool",
    "BufferPipeline",
    "Completion",
    "DevicePool",
    "FileStorage",
    "Group",
    "HostPool",
    "IOExecutor",
    "IOOp",
    "KVLayout",
    "LifecycleError",
    "LocalGroup",
    "LockstepError",
    "ManualIO",
    "MatchResult",
    "MemoryStorage",
    "PipelineConfig",
    "PrefixTree",
    "RadixTree",
    "Record",
    "Stats",
    "Storage",
    "ThreadedIO",
    "TokenKey",
    "TorchGroup",
    "TransitionEvent",
    "__version__",
    "load_spec",
    "open_storage",
]
