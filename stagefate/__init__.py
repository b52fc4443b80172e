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
from .runtime.prefix_tree import PrefixTree
from .runtime.storage import open_storage
from .statemachine.config import PipelineConfig
from .statemachine.errors import LifecycleError, LockstepError
from .statemachine.group import Group, LocalGroup, TorchGroup
from .statemachine.pipeline import BufferPipeline
from .statemachine.record import Record, TransitionEvent
from .statemachine.stats import Stats

__all__ = [
    "AuxPool",
    "BufferPipeline",
    "DevicePool",
    "FileStorage",
    "Group",
    "HostPool",
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
    "open_storage",
]
