"""KdnConnector: vLLM's KV connector (v1 API) over kdnd.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KdnConnector",
        "kv_connector_module_path": "kdn.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute"}'

Every engine on the node that runs the same model (same weights, dtype, layout and TP rank)
loads the prompt prefixes any of them computed, instead of computing them again.

vLLM makes one instance per role: the scheduler's (SchedulerSide: lookups, load and save
plans) and each worker's (WorkerSide: the copies). Anything that keeps kdn from working —
an unsupported model or platform, a bad setting of our own keys aside — leaves the
connector inert, with one warning: vLLM then serves exactly as it does without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger

from . import describe
from .config import KdnConfig
from .link import KdnLink
from .metadata import KdnConnectorMetadata
from .scheduler import SchedulerSide
from .stats import ConnectorStats, new_stats
from .device_worker import DeviceWorkerSide
from .worker import WorkerSide, ordered_layers

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger("vllm.kdn")  # under "vllm" so vLLM's log settings apply
_last_desc = None  # the descriptor of the last connector made in this process


def last_descriptor():
    """The kdn.ModelDesc the last KdnConnector of this process registers (None if inactive)."""
    return _last_desc


class KdnConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        tc = vllm_config.kv_transfer_config
        self._cfg = KdnConfig.from_extra(tc.kv_connector_extra_config)
        self.stats: ConnectorStats = new_stats()
        policy = getattr(tc, "kv_load_failure_policy", "fail")
        if role == KVConnectorRole.SCHEDULER and policy != "recompute":
            logger.warning("kdn: kv_load_failure_policy is %r: a chunk kdn cannot load (kdnd restarted, evicted, "
                           "failed its check) ends the request instead of being recomputed; set "
                           "kv_transfer_config.kv_load_failure_policy = \"recompute\"", policy)

        self._layer_names: tuple[str, ...] = ()
        link: KdnLink | None = None
        isa, block_tokens = "", 1
        self._where = describe.where(vllm_config)
        self._device = False
        try:
            geo = describe.kv_geometry(kv_cache_config)
            self._layer_names = geo.layer_names
            block_tokens = geo.block_tokens
            self._device = describe.on_device(vllm_config)
            if self._device:
                isa, layout_name = "cuda", "cuda-paged"  # kdnd's chunks are canonical whatever the KVCacheLayout
            else:
                isa = describe.attention_isa(vllm_config, geo)
                if not _known_isa(isa):
                    raise describe.Unsupported(f"CPU attention ISA {isa!r} (kdn knows vec, vec16, amx)")
                layout_name = isa_layout(isa)
            tp_rank, tp_size = self._tp(role, vllm_config)
            desc = describe.describe(vllm_config, geo, layout_name, self._cfg.chunk_tokens,
                                     self._cfg.model_identity, tp_rank, tp_size)
            link = KdnLink(self._cfg, desc, self.stats, logger, read_only=role == KVConnectorRole.SCHEDULER)
            if not self._device:
                link.warm()  # the first request's TTFT should not include connecting and mapping
            global _last_desc
            _last_desc = desc
            logger.info("kdn: %s side ready: %d layers, %d KV heads x %d, %s, %d-token chunks over %d-token blocks "
                        "(%s layout), fingerprint %s", role.name.lower(), desc.num_layers, desc.num_kv_heads,
                        desc.head_dim, geo.torch_dtype, self._cfg.chunk_tokens, block_tokens, isa,
                        desc.fingerprint().hex())
        except describe.Unsupported as e:
            logger.warning("kdn: connector inactive (%s): %s", self._where, e)
            self._device = False

        self._scheduler: SchedulerSide | None = None
        self._worker: Any = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(self._cfg, link, block_tokens, self.stats, logger,
                                            async_stores=self._device)
        elif self._device:
            guard_s = max(1.0, 5 * self._cfg.timeout_ms / 1000)  # a load kdnd never confirms fails after this
            self._worker = DeviceWorkerSide(self._cfg, link, block_tokens, self.stats, logger,
                                            lambda model, views: _device_kv(model, views, guard_s), where=self._where)
        else:
            self._worker = WorkerSide(self._cfg, link, isa, self.stats, logger)

    @staticmethod
    def _tp(role: KVConnectorRole, vllm_config: Any) -> tuple[int, int]:
        tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        if role == KVConnectorRole.SCHEDULER:
            return 0, tp_size  # the scheduler looks up for rank 0; each worker loads its own shard
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank()), tp_size

    # ---- worker side -----------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register_kv_caches(ordered_layers(kv_caches, self._layer_names))

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        assert self._worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, KdnConnectorMetadata)
        self._worker.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv loaded every layer before the forward pass began

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata",
                      **kwargs: Any) -> None:
        return  # wait_for_save stores whole chunks of all layers at once

    def wait_for_save(self) -> None:
        assert self._worker is not None
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KdnConnectorMetadata)
        self._worker.wait_for_save(meta)

    def get_block_ids_with_load_errors(self) -> set[int]:
        assert self._worker is not None
        return self._worker.get_block_ids_with_load_errors()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        assert self._worker is not None
        return self._worker.get_finished(finished_req_ids)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if isinstance(self._worker, DeviceWorkerSide) and isinstance(kv_connector_metadata, KdnConnectorMetadata):
            self._worker.handle_preemptions(kv_connector_metadata.preempted)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()

    # ---- scheduler side --------------------------------------------------------------------
    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if self._scheduler is not None:
            self._scheduler.bind_kv_cache_manager(kv_cache_manager)

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a save kdn misses is a later cache miss, never a lost result


def _device_kv(model: Any, views: list, guard_s: float) -> Any:
    import kdn.torch

    return kdn.torch.DeviceKV(model, views, guard_timeout_s=guard_s)


def _known_isa(isa: str) -> bool:
    return isa in ("vec", "vec16", "amx")


def isa_layout(isa: str) -> str:
    """The name of the block layout an ISA writes (part of the fingerprint)."""
    return "cpu-k-columns-v-rows" if isa in ("vec", "vec16") else f"cpu-{isa}"
