"""``StagefateConnector``: stagefate as vLLM's KV connector (``KVConnectorBase_V1``).

Turn it on with ``KVTransferConfig(kv_connector="StagefateConnector",
kv_connector_module_path="stagefate.integrations.vllm", kv_role="kv_both",
kv_connector_extra_config={"stagefate.storage": "file:/var/cache/stagefate"})``
(docs/vllm.md). vLLM builds one instance per role: the scheduler's decides
(:mod:`.scheduler_side`, the spec's lifecycle over vLLM's block pool), each worker's moves
bytes (:mod:`.worker_side`). Both are built from the same settings, so a refused setting is
refused by whichever starts first, before anything is written.
"""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

import torch
from vllm import envs
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.utils.hashing import get_hash_fn_by_name

from ...runtime.engine import SharedHostPool
from ...runtime.pools import KVLayout
from ...runtime.storage import MemoryStorage, Storage, open_storage
from ...statemachine.config import PipelineConfig
from ...transition_log import TransitionLog
from .prefix_cache import VllmPrefixCache
from .scheduler_side import SchedulerSide
from .settings import ConnectorSettings, model_layout
from .transfer import StagefateMetadata, SynchronousLoadsMade
from .worker_side import WorkerSide

_MEMORY_STORES: dict[str, MemoryStorage] = {}
"""``storage='memory'``: one L3 per engine, shared by its scheduler and worker in one process."""


class StagefateConnector(KVConnectorBase_V1):
    """vLLM's KV connector with stagefate's lifecycle deciding every staged fetch: vLLM builds
    one on its scheduler (a :class:`SchedulerSide`) and one per worker (a :class:`WorkerSide`),
    and each call goes to the side vLLM made it on (docs/vllm.md)."""

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        """No (vLLM 0.33 asks before it turns sleep mode on): the worker keeps views of vLLM's
        KV tensors, which sleep mode remaps, and it has never run under it."""
        return False

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        transfer = self._kv_transfer_config
        settings = ConnectorSettings.parse(transfer.kv_connector_extra_config)
        settings.check_storage_reachable(bool(envs.VLLM_ENABLE_V1_MULTIPROCESSING))
        layout, block_size = model_layout(vllm_config)
        engine_id = str(transfer.engine_id)
        storage = _open_storage(settings, engine_id, layout, block_size)
        bounce = Path(settings.shm_dir) / f"stagefate-{engine_id}.bounce"
        self.scheduler: SchedulerSide | None = None
        self.worker: WorkerSide | None = None
        self._bounce = bounce
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler = _scheduler_side(
                vllm_config, kv_cache_config, settings, layout, block_size, storage, bounce
            )
        else:
            self.worker = WorkerSide(
                layout, block_size, storage, bounce, settings.host_slots(block_size)
            )

    # ------------------------------------------------------------------ scheduler side

    def _scheduler_side(self) -> SchedulerSide:
        assert self.scheduler is not None, "a scheduler-side call on a worker's connector"
        return self.scheduler

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        self._scheduler_side().kv_cache_manager = kv_cache_manager

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        self._scheduler_side().cache.bind(gpu_block_pool)

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._scheduler_side().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._scheduler_side().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> StagefateMetadata:
        return self._scheduler_side().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        self._scheduler_side().update_connector_output(connector_output)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        self._scheduler_side().request_finished(request)
        return False, None

    # ------------------------------------------------------------------ worker side

    def _worker_side(self) -> WorkerSide:
        assert self.worker is not None, "a worker-side call on the scheduler's connector"
        return self.worker

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker_side().register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._worker_side().start_load_kv(self._metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # whole when start_load_kv returns, or before vLLM schedules (async)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None  # saved whole in wait_for_save, from the registered caches

    def wait_for_save(self) -> None:
        self._worker_side().wait_for_save(self._metadata())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, self._worker_side().get_finished() or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker_side().get_block_ids_with_load_errors()

    def build_connector_worker_meta(self) -> SynchronousLoadsMade | None:
        made = self._worker_side().synchronous_loads_made()
        return SynchronousLoadsMade(made) if made else None

    def _metadata(self) -> StagefateMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, StagefateMetadata)
        return meta

    def shutdown(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
            self._bounce.unlink(missing_ok=True)


def _open_storage(
    settings: ConnectorSettings, engine_id: str, layout: KVLayout, block_size: int
) -> Storage:
    if settings.storage == "memory":
        return _MEMORY_STORES.setdefault(engine_id, MemoryStorage())
    return open_storage(settings.storage, layout, block_size)


def _scheduler_side(
    vllm_config: Any,
    kv_cache_config: Any,
    settings: ConnectorSettings,
    layout: KVLayout,
    block_size: int,
    storage: Storage,
    bounce: Path,
) -> SchedulerSide:
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ValueError(
            f"StagefateConnector serves models with one KV cache group (full attention in "
            f"every layer); this one has {len(groups)}"
        )
    config = PipelineConfig(
        page_size=block_size,
        layers=layout.layers,
        kv_heads=layout.kv_heads,
        head_dim=layout.head_dim,
        dtype=layout.dtype,
        device_tokens=kv_cache_config.num_blocks * block_size,
        host_tokens=settings.host_slots(block_size),
        device="cpu",
        io="threaded",
        io_workers=settings.io_workers,
        prefetch_threshold=settings.prefetch_threshold,
        anchor_lock_cap_fraction=settings.anchor_lock_cap_fraction,
        max_context_len=min(
            vllm_config.model_config.max_model_len, kv_cache_config.num_blocks * block_size
        ),
        retry_interval=settings.retry_interval,
        retry_max_attempts=settings.retry_max_attempts,
        dedup_inflight=settings.dedup_inflight,
    )
    hash_function = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    cache = VllmPrefixCache(block_size, hash_function)
    host = SharedHostPool(layout, config.host_tokens, bounce)
    atexit.register(host.unlink)  # vLLM may exit without shutdown(): /dev/shm keeps nothing
    log = None if settings.log is None else TransitionLog.open(settings.log, line_buffered=True)
    side = SchedulerSide.build(
        config,
        cache,
        storage,
        host,
        settings.write_through,
        log,
        settings.decline_slower_loads,
        settings.l3_wait_ms / 1000,
        settings.synchronous_loads,
    )
    if settings.metrics_port is not None:
        _serve_metrics(side, settings, str(vllm_config.kv_transfer_config.engine_id))
    return side


def _serve_metrics(side: SchedulerSide, settings: ConnectorSettings, engine_id: str) -> None:
    """stagefate's metrics of this engine's pipeline, on their own HTTP endpoint."""
    from ...metrics import serve

    labels = {"engine": engine_id}
    serve(
        side.pipeline,
        settings.metrics_port or 0,
        settings.metrics_address,
        labels,
        "stagefate.metrics_port",
    )
