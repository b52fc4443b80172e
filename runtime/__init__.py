"""The torch runtime: live radix tree, pools, L3 storage, page hashing, copies and IO.

It knows nothing of lifecycle states or the spec; the statemachine package drives it.
"""

from .copy import CopyEngine, CopyHandle
from .hashing import Namespace, namespace_of, page_hashes, storage_key
from .io import Completion, IOExecutor, IOOp, IOResult, ManualClock, ManualIO, ThreadedIO
from .pools import AuxPool, DevicePool, HostPool, KVLayout, PoolError, SlotPool, resolve_device
from .storage import FileStorage, MemoryStorage, Storage
from .tokens import TokenKey, Tokens
from .tree import MatchResult, RadixTree, TreeError, TreeNode

__all__ = [
    "AuxPool",
    "Completion",
    "CopyEngine",
    "CopyHandle",
    "DevicePool",
    "FileStorage",
    "HostPool",
    "IOExecutor",
    "IOOp",
    "IOResult",
    "KVLayout",
    "ManualClock",
    "ManualIO",
    "MatchResult",
    "MemoryStorage",
    "Namespace",
    "PoolError",
    "RadixTree",
    "SlotPool",
    "Storage",
    "ThreadedIO",
    "TokenKey",
    "Tokens",
    "TreeError",
    "TreeNode",
    "namespace_of",
    "page_hashes",
    "resolve_device",
    "storage_key",
]
