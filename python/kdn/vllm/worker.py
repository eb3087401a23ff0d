"""The worker side of the connector: loads into and stores from vLLM's CPU KV cache.

On the CPU backend vLLM calls start_load_kv before the forward pass whenever a request of
the step loads synchronously, so a load is complete before any layer reads it: one call per
request copies every layer (kdn.PagedKV.load, GIL released, on copy_threads threads), and
wait_for_layer_load has nothing to wait for. Stores happen in wait_for_save, after the
forward pass wrote the step's KV: one call per request gathers the chunks kdnd lacks.

Whatever goes wrong with kdn — kdnd unreachable or killed, a chunk evicted since the lookup,
a chunk failing its check — the blocks that were not loaded are reported through
get_block_ids_with_load_errors, and vLLM (kv_load_failure_policy = "recompute") computes
them. A request whose load failed is not stored in that step: what the forward pass computed
after the failed blocks is discarded by vLLM and computed again.

A prefix with chunks on kdnd's disk or remote tier loads asynchronously (off_step.py): kdnd
brings it up while vLLM runs other steps, then a step copies it and reports it finished.
"""

from __future__ import annotations

import logging
import time
from typing import Any


import kdn

from .config import KdnConfig
from .link import KdnLink
from .metadata import KdnConnectorMetadata, LoadSpec, SaveSpec
from .stats import ConnectorStats
from .worker_loads import LoadTracking


def ordered_layers(kv_caches: dict[str, Any], layer_names: tuple[str, ...]) -> list[Any]:
    """The layer tensors in the model's layer order (the order of kdn's canonical chunks)."""
    from vllm.model_executor.models.utils import extract_layer_index

    names = [n for n in layer_names if n in kv_caches] or list(kv_caches)
    if len(names) != len(kv_caches):
        raise ValueError(f"kdn: vLLM registered {len(kv_caches)} KV tensors for {len(layer_names)} layers")
    return [kv_caches[n] for n in sorted(names, key=extract_layer_index)]


class WorkerSide(LoadTracking):
    def __init__(self, cfg: KdnConfig, link: KdnLink | None, isa: str, stats: ConnectorStats,
                 log: logging.Logger) -> None:
        super().__init__(cfg, link, stats, log)
        self._isa = isa
        self._kv: kdn.PagedKV | None = None

    def register_kv_caches(self, tensors: list[Any]) -> None:
        if self._link is None:
            return
        try:
            self._kv = kdn.PagedKV(tensors, self._isa, self._cfg.chunk_tokens, self._cfg.threads())
        except kdn.KdnError as e:
            self._log.error("kdn: cannot use vLLM's KV cache (%s); every load will be recomputed", e)
            self._kv = None

    # ---- loads ---------------------------------------------------------------------------
    def _load(self, spec: LoadSpec) -> None:
        k = self._cfg.chunk_tokens // int(self._kv.block_tokens) if self._kv is not None else 1
        model = self._link.model() if (self._link is not None and not spec.fail) else None
        if model is None or self._kv is None:
            self._fail(spec, spec.first_block)
            return
        t0 = time.perf_counter()
        try:
            out = self._kv.load(model, spec.tokens, spec.blocks, spec.first_chunk, spec.end_chunk, spec.first_block)
            if out.status != 0 and out.loaded == 0 and self._link.failed(out.status):
                model = self._link.model()  # the session was stale (kdnd restarted): once more
                if model is not None:
                    out = self._kv.load(model, spec.tokens, spec.blocks, spec.first_chunk, spec.end_chunk,
                                        spec.first_block)
        except kdn.KdnError as e:  # invalid arguments: a bug, but never the engine's failure
            self._log.error("kdn: load of %s refused: %s", spec.req_id, e)
            self._fail(spec, spec.first_block)
            return
        self._stats.load_seconds += time.perf_counter() - t0
        self._stats.loads += 1
        self._stats.loaded_chunks += out.loaded
        self._stats.loaded_bytes += out.bytes
        if out.status == 0:
            return
        self._stats.corrupt_chunks += out.corrupt
        if out.status == int(kdn.Status.NOT_FOUND):
            self._stats.evicted_chunks += spec.end_chunk - spec.first_chunk - out.loaded
        elif out.status != int(kdn.Status.CORRUPT):
            self._link.failed(out.status)
        self._log.warning("kdn: load of %s stopped after %d of %d chunks (%s); vLLM recomputes the rest",
                          spec.req_id, out.loaded, spec.end_chunk - spec.first_chunk, kdn.strerror(out.status))
        self._fail(spec, max(spec.first_block, (spec.first_chunk + out.loaded) * k))

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._take_errors()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, self._take_received()

    def shutdown(self) -> None:
        self._close_loads()

    # ---- saves ---------------------------------------------------------------------------
    def wait_for_save(self, meta: KdnConnectorMetadata) -> None:
        for spec in self._saves(meta):
            self._save(spec)

    def _save(self, spec: SaveSpec) -> None:
        model = self._link.model() if self._link is not None else None
        if model is None or self._kv is None:
            return
        t0 = time.perf_counter()
        try:
            out = self._kv.save(model, spec.tokens, spec.blocks, spec.first_chunk, spec.n_chunks)
            if out.status != 0 and out.stored == 0 and self._link.failed(out.status):
                model = self._link.model()  # the session was stale (kdnd restarted): once more
                if model is not None:
                    out = self._kv.save(model, spec.tokens, spec.blocks, spec.first_chunk, spec.n_chunks)
        except kdn.KdnError as e:
            self._log.error("kdn: save of %s refused: %s", spec.req_id, e)
            self._stats.save_failures += 1
            return
        self._stats.save_seconds += time.perf_counter() - t0
        self._stats.saves += 1
        self._stats.saved_chunks += out.stored
        self._stats.saved_bytes += out.bytes
        self._stats.present_chunks += out.present
        if out.status != 0:
            self._stats.save_failures += 1
            self._link.failed(out.status)
            if out.status not in (int(kdn.Status.NO_SPACE), int(kdn.Status.LIMIT)):
                self._log.warning("kdn: save of %s stopped (%s)", spec.req_id, kdn.strerror(out.status))
