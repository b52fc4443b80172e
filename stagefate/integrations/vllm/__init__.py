"""stagefate as vLLM's KV connector (docs/vllm.md).

``KVTransferConfig(kv_connector="StagefateConnector",
kv_connector_module_path="stagefate.integrations.vllm", kv_role="kv_both")``. The connector is
imported on first use, so the parts that need no vLLM (settings, the KV layout) import anywhere.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StagefateConnector"]


def __getattr__(name: str) -> Any:
    if name == "StagefateConnector":
        from .connector import StagefateConnector

        return StagefateConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
