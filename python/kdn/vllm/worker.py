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
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

import kdn

from .config import KdnConfig
from .link import KdnLink
from .metadata import KdnConnectorMetadata, LoadSpec, SaveSpec
from .stats import ConnectorStats


def ordered_layers(kv_caches: dict[str, Any], layer_names: tuple[str, ...]) -> list[Any]:
    """The layer tensors in the model's layer order (the order of kdn's canonical chunks)."""
    from vllm.model_executor.models.utils import extract_layer_index

    names = [n for n in layer_names if n in kv_caches] or list(kv_caches)
    if len(names) != len(kv_caches):
        raise ValueError(f"kdn: vLLM registered {len(kv_caches)} KV tensors for {len(layer_names)} layers")
    return [kv_caches[n] for n in sorted(names, key=extract_layer_index)]


class WorkerSide:
    def __init__(self, cfg: KdnConfig, link: KdnLink | None, isa: str, stats: ConnectorStats,
                 log: logging.Logger) -> None:
        self._cfg = cfg
        self._link = link
        self._isa = isa
        self._stats = stats
        self._log = log
        self._kv: kdn.PagedKV | None = None
        self._errors: set[int] = set()
        self._failed_reqs: set[str] = set()

    def register_kv_caches(self, tensors: list[Any]) -> None:
        if self._link is None:
            return
        try:
            self._kv = kdn.PagedKV(tensors, self._isa, self._cfg.chunk_tokens, self._cfg.threads())
        except kdn.KdnError as e:
            self._log.error("kdn: cannot use vLLM's KV cache (%s); every load will be recomputed", e)
            self._kv = None

    # ---- loads ---------------------------------------------------------------------------
    def start_load_kv(self, meta: KdnConnectorMetadata) -> None:
        self._failed_reqs.clear()
        for spec in meta.loads:
            self._load(spec)

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

    def _fail(self, spec: LoadSpec, from_block: int) -> None:
        failed = [int(b) for b in spec.blocks[from_block:]]
        self._errors.update(failed)
        self._failed_reqs.add(spec.req_id)
        self._stats.load_failures += 1
        self._stats.failed_blocks += len(failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors

    # ---- saves ---------------------------------------------------------------------------
    def wait_for_save(self, meta: KdnConnectorMetadata) -> None:
        for spec in meta.saves:
            if spec.req_id in self._failed_reqs:
                self._stats.skipped_saves += 1
                continue
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
