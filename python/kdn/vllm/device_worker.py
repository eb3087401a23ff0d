"""The worker side of the connector on GPUs: kdnd copies between its tiers and vLLM's device cache.

Loads: start_load_kv issues one retrieve per loading request (all layers; kdn.torch.DeviceKV,
GIL released) and makes vLLM's current stream wait on kdnd's done event, so no host thread
waits for the copies. A chunk evicted since the lookup shows as fewer chunks loaded; a copy that
failed on the device after kdnd answered shows in the registration's ticket check, which
get_block_ids_with_load_errors runs after the forward pass: both report the blocks, and vLLM
(kv_load_failure_policy = "recompute") computes them.

Stores never race the next step. wait_for_save records the engine event on the stream that
wrote the KV and hands the store to one store thread, so the forward pass of the next step is
not held up by kdnd's gather. While a request has a store in flight its blocks must not be
reused: the scheduler side answers request_finished with "blocks still in use" (every finished
request of an active GPU connector), and get_finished reports a finished request only once every
store of it has landed; handle_preemptions waits for the stores of preempted requests before
vLLM gives their blocks away.

A prefix with chunks on kdnd's disk or remote tier loads asynchronously (off_step.py): a thread
asks kdnd to bring it into this device's T0 (kdn_gpu_prefetch) and waits for it off the step;
the next step retrieves it like any other load and reports it finished.

The copies themselves go through a factory (kdn.torch.DeviceKV on GPUs, kdn.torch.HostKV in the
CPU tests of this logic).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import defaultdict
from typing import Any, Callable

import numpy as np

import kdn

from .config import KdnConfig
from .link import KdnLink
from .metadata import KdnConnectorMetadata, LoadSpec, SaveSpec
from .off_step import Promote
from .stats import ConnectorStats
from .worker_loads import LoadTracking

KvFactory = Callable[[Any, list], Any]  # (kdn.Model, layer views) -> DeviceKV-like


def unsupported_views(views: list) -> str:
    """Why one kdn registration cannot hold these layer views ('' if it can)."""
    import kdn.torch

    if len({int(v.untyped_storage().data_ptr()) for v in views}) > 1:
        return "the layers' KV lives in several backing allocations"
    try:
        kdn.torch.layout_of(views)
    except kdn.KdnError as e:
        return str(e)
    return ""


class StoreQueue:
    """Stores run in order on one thread; each request counts its stores in flight."""

    def __init__(self, run: Callable[[SaveSpec], None], log: logging.Logger) -> None:
        self._run = run
        self._log = log
        self._q: queue.Queue[SaveSpec | None] = queue.Queue()
        self._mu = threading.Condition()
        self._pending: dict[str, int] = defaultdict(int)
        self._thread = threading.Thread(target=self._loop, name="kdn-store", daemon=True)
        self._thread.start()

    def post(self, spec: SaveSpec) -> None:
        with self._mu:
            self._pending[spec.req_id] += 1
        self._q.put(spec)

    def pending(self, req_id: str) -> bool:
        with self._mu:
            return self._pending.get(req_id, 0) > 0

    def pending_ids(self) -> list[str]:
        with self._mu:
            return list(self._pending)

    def wait(self, req_ids: set[str], timeout_s: float) -> bool:
        """Waits until no store of req_ids is in flight; False on timeout."""
        with self._mu:
            return self._mu.wait_for(lambda: not any(self._pending.get(r, 0) for r in req_ids), timeout_s)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while (spec := self._q.get()) is not None:
            try:
                self._run(spec)
            except Exception:  # noqa: BLE001 — the thread must outlive any store, or blocks stay held for ever
                self._log.exception("kdn: store of %s failed", spec.req_id)
            finally:
                with self._mu:
                    self._pending[spec.req_id] -= 1
                    if self._pending[spec.req_id] == 0:
                        del self._pending[spec.req_id]
                    self._mu.notify_all()


class DeviceWorkerSide(LoadTracking):
    def __init__(self, cfg: KdnConfig, link: KdnLink | None, block_tokens: int, stats: ConnectorStats,
                 log: logging.Logger, kv_factory: KvFactory, where: str = "") -> None:
        super().__init__(cfg, link, stats, log)
        self._where = where
        self._B = block_tokens  # the scheduler's block size (kernel blocks may subdivide it)
        self._factory = kv_factory
        self._views: list | None = None
        self._kv: Any = None
        self._kv_model: Any = None  # the kdn.Model the registration belongs to
        self._mu = threading.Lock()  # the registration: the store and off-step threads and the step share it
        self._loaded_blocks: list[int] = []  # blocks loaded this step, for the ticket check
        self._gated: dict[int, list[int]] = {}  # a retrieve's done gate -> its blocks
        self._awaiting: set[str] = set()  # finished requests whose stores may still be in flight
        self._stores = StoreQueue(self._store, log)

    # ---- registration ----------------------------------------------------------------------
    def register_kv_caches(self, views: list) -> None:
        if self._link is None:
            return
        reason = unsupported_views(views)
        if reason:
            self._log.warning("kdn: connector inactive (%s): %s", self._where, reason)
            self._link = None
            return
        self._drop_registration()  # a re-allocated cache (sleep and wake) is registered afresh
        self._views = views
        self._registered()  # register now if kdnd is up; else at the first use

    def _registered(self) -> Any:
        """The registration for the current kdnd session (made again after a reconnect)."""
        model = self._link.model() if self._link is not None and self._views is not None else None
        if model is None:
            return None
        with self._mu:
            if self._kv is not None and self._kv_model is model:
                return self._kv
            try:
                self._kv, self._kv_model = self._factory(model, self._views), model
            except kdn.KdnError as e:
                self._log.error("kdn: cannot register vLLM's KV cache with kdnd (%s); loads are recomputed", e)
                self._kv, self._kv_model = None, None
                self._link.failed(e.code)  # a broken session is dropped: the next use connects again
            return self._kv

    # ---- loads -----------------------------------------------------------------------------
    def _promote(self) -> Promote:
        """Off the step, chunks below the host tier go straight into this device's T0."""
        def promote(tokens: np.ndarray) -> None:
            kv = self._registered()
            if kv is not None:
                kv.prefetch(tokens)
        return promote

    def _load(self, spec: LoadSpec) -> None:
        k = self._cfg.chunk_tokens // self._B
        kv = None if spec.fail else self._registered()
        if kv is None:
            self._fail(spec, spec.first_block)
            return
        try:
            loaded = kv.retrieve(spec.tokens, spec.blocks, self._B, max_chunks=spec.end_chunk,
                                 first_block=spec.first_block)
        except kdn.KdnError as e:
            self._log.warning("kdn: load of %s failed (%s); vLLM recomputes it", spec.req_id, e)
            self._link.failed(e.code)
            self._fail(spec, spec.first_block)
            return
        self._stats.loads += 1
        self._stats.loaded_chunks += loaded
        end_block = min(len(spec.blocks), loaded * k)
        blocks = [int(b) for b in spec.blocks[spec.first_block:end_block]]
        self._loaded_blocks.extend(blocks)
        if getattr(kv, "last_gate", 0):
            self._gated[kv.last_gate] = blocks
        if loaded < spec.end_chunk:
            self._stats.evicted_chunks += spec.end_chunk - loaded
            self._log.warning("kdn: load of %s got %d of %d chunks; vLLM recomputes the rest", spec.req_id, loaded,
                              spec.end_chunk)
            self._fail(spec, max(spec.first_block, loaded * k))

    def get_block_ids_with_load_errors(self) -> set[int]:
        loaded, self._loaded_blocks = self._loaded_blocks, []
        gated, self._gated = self._gated, {}
        kv = self._kv
        late = kv.settle() if gated and kv is not None and hasattr(kv, "settle") else set()
        if late:  # kdnd's done event did not fire in time: died or hung mid-load
            blocks = [b for g in late for b in gated.get(g, [])]
            self._log.warning("kdn: %d loaded blocks not confirmed by kdnd in time; vLLM recomputes them", len(blocks))
            self._errors.update(blocks)
            self._stats.failed_blocks += len(blocks)
        if loaded and not self._tickets_ok():
            self._log.warning("kdn: a copy into %d loaded blocks failed on the device; vLLM recomputes them",
                              len(loaded))
            self._errors.update(loaded)
            self._stats.failed_blocks += len(loaded)
        return self._take_errors()

    def _tickets_ok(self) -> bool:
        kv = self._kv
        if kv is None:
            return False
        try:
            return bool(kv.check())
        except kdn.KdnError as e:  # kdnd gone: whether the copies landed is unknown
            self._link.failed(e.code)
            return False

    # ---- stores ----------------------------------------------------------------------------
    def wait_for_save(self, meta: KdnConnectorMetadata) -> None:
        for spec in self._saves(meta):
            kv = self._registered()
            if kv is None:
                continue
            # Recorded now, on the stream that wrote this step's KV: kdnd's gather waits for it.
            spec = SaveSpec(spec.req_id, spec.tokens, self._store_blocks(spec), spec.first_chunk, spec.n_chunks)
            kv.record()
            self._stores.post(spec)

    def _store_blocks(self, spec: SaveSpec) -> np.ndarray:
        first = spec.first_chunk * self._cfg.chunk_tokens // self._B
        return np.asarray(spec.blocks[first:], dtype=np.int64)

    def _store(self, spec: SaveSpec) -> None:
        kv = self._kv
        if kv is None:
            return
        try:
            stored = kv.store(spec.tokens, spec.blocks, self._B, spec.first_chunk, spec.n_chunks, record=False)
        except kdn.KdnError as e:
            self._stats.save_failures += 1
            if e.code not in (int(kdn.Status.NO_SPACE), int(kdn.Status.LIMIT)):
                self._log.warning("kdn: store of %s failed (%s)", spec.req_id, e)
            return
        self._stats.saves += 1
        self._stats.saved_chunks += stored

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Finished requests whose stores all landed: vLLM may now reuse their blocks."""
        self._awaiting |= set(finished_req_ids)
        done = {r for r in self._awaiting if not self._stores.pending(r)}
        self._awaiting -= done
        return (done or None), self._take_received()

    def handle_preemptions(self, preempted: set[str]) -> None:
        if preempted and not self._stores.wait(set(preempted), max(10.0, 5 * self._cfg.timeout_ms / 1000)):
            self._log.error("kdn: stores of preempted requests still in flight after the timeout")

    def _drop_registration(self) -> None:
        # Stores in flight still read the old blocks through it.
        self._stores.wait(set(self._stores.pending_ids()), max(10.0, 5 * self._cfg.timeout_ms / 1000))
        with self._mu:
            if self._kv is not None:
                try:
                    self._kv.close()
                except kdn.KdnError:
                    pass
            self._kv, self._kv_model = None, None

    def shutdown(self) -> None:
        self._close_loads()
        self._stores.close()
        self._drop_registration()
