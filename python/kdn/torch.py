"""kdn's data path for PyTorch KV caches, on the device and on the host; vLLM is not needed.

An engine's paged KV cache is one tensor view per attention layer, ``[blocks, kv_heads,
block_tokens, 2 * head_dim]`` with K in the first head_dim channels and V in the rest (vLLM's
``[B, H, N, C]`` views, whatever ``KVCacheLayout`` orders them in memory). ``layout_of`` turns
those views into kdn's ``EngineLayout`` from their actual sizes, strides and storage offsets —
never from a guessed shape — and refuses what one layout cannot say (layers of different
shapes, strides or dtypes, an odd C, a dtype kdn does not hold).

``DeviceKV`` registers the CUDA allocation the views live in with kdnd's GPU tier once, then
moves chunks between kdnd and block ids: ``retrieve`` queues kdnd's copies and makes the
caller's stream wait on kdnd's done event (no host thread waits for the copies); ``store``
records the engine event on the stream that wrote the KV and has kdnd gather after it;
``check`` tells whether the copies of every retrieve since the last check landed whole.

Errors are ``kdn.KdnError`` with a ``kdn.Status`` code. Every libkdn call releases the GIL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from . import Tier, _kdn
from ._kdn import DType, KdnError, Status

_DTYPES = {torch.bfloat16: DType.BF16, torch.float16: DType.F16, torch.float32: DType.F32}


def error(code: Status, message: str) -> KdnError:
    """A KdnError carrying `code`, as libkdn's own failures do."""
    e = KdnError(message)
    e.code = code
    return e


def kdn_dtype(dtype: torch.dtype) -> DType:
    """The kdn dtype of a KV tensor dtype; UNSUPPORTED for quantized (fp8, int8) and other dtypes."""
    if dtype not in _DTYPES:
        raise error(Status.UNSUPPORTED, f"kdn holds no KV of dtype {dtype} (quantized KV caches are not supported)")
    return _DTYPES[dtype]


@dataclass(frozen=True)
class Layout:
    """An EngineLayout and what it was derived from."""

    engine: Any            # kdn._kdn.EngineLayout
    device: torch.device
    block_tokens: int      # tokens per kernel block (the views' N)

    @property
    def num_blocks(self) -> int:
        return int(self.engine.num_blocks)


def _check_same(views: Sequence[torch.Tensor]) -> torch.Tensor:
    if not views:
        raise error(Status.INVALID_ARGUMENT, "no layer views")
    first = views[0]
    for i, v in enumerate(views):
        if not isinstance(v, torch.Tensor):
            raise error(Status.INVALID_ARGUMENT, f"layer {i} is not a tensor")
        if v.dim() != 4:
            raise error(Status.INVALID_ARGUMENT,
                        f"layer {i} has {v.dim()} dimensions; kdn expects [blocks, kv_heads, block_tokens, 2*head_dim]")
        if v.device != first.device:
            raise error(Status.INVALID_ARGUMENT, f"layer {i} is on {v.device}, layer 0 on {first.device}")
        if v.dtype != first.dtype or v.shape != first.shape or v.stride() != first.stride():
            raise error(Status.INVALID_ARGUMENT,
                        f"layer {i} differs from layer 0 in dtype, shape or strides: one layout cannot express it")
    return first


def layout_of(views: Sequence[torch.Tensor]) -> Layout:
    """kdn's layout of per-layer ``[B, H, N, C]`` views (K = C[:C/2], V = C[C/2:])."""
    first = _check_same(views)
    dtype = kdn_dtype(first.dtype)
    blocks, heads, tokens, content = (int(x) for x in first.shape)
    if content % 2:
        raise error(Status.INVALID_ARGUMENT, f"the views' last dimension ({content}) is not K and V of one head size")
    sb, sh, sn, sc = (int(x) for x in first.stride())
    head_dim = content // 2
    engine = _kdn.EngineLayout(dtype, [int(v.data_ptr()) for v in views], blocks, tokens, heads, head_dim,
                               stride_block=sb, stride_head=sh, stride_offset=sn, stride_dim=sc,
                               stride_kv=head_dim * sc)
    return Layout(engine, first.device, tokens)


def slots_for(block_ids: Sequence[int], n_tokens: int, block_size: int) -> np.ndarray:
    """The slot of each of n_tokens tokens placed in block_ids (blocks of block_size tokens).

    block_size is the scheduler's block size. When kernel blocks subdivide each scheduler block
    into r pieces (vLLM's kernel block size), kernel block j of scheduler block b is b * r + j
    and the slot (kernel block * kernel size + offset) is the same number, b * block_size + t."""
    ids = np.asarray(block_ids, dtype=np.int64)
    if n_tokens > ids.size * block_size:
        raise error(Status.INVALID_ARGUMENT, f"{n_tokens} tokens do not fit in {ids.size} blocks of {block_size}")
    t = np.arange(n_tokens, dtype=np.int64)
    return np.ascontiguousarray(ids[t // block_size] * block_size + t % block_size)


def load_slots(block_ids: Sequence[int], n_tokens: int, block_size: int, first_block: int = 0) -> np.ndarray:
    """slots_for the tokens that fit in block_ids, with -1 (skipped) for those of blocks before first_block."""
    slots = slots_for(block_ids, min(n_tokens, len(block_ids) * block_size), block_size)
    slots[: first_block * block_size] = -1
    return slots


def _tokens(tokens: Sequence[int]) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(tokens, dtype=np.int32))


def host_backing(view: torch.Tensor) -> torch.Tensor:
    """The whole storage a CPU view lives in, as one uint8 tensor (the host copies' bounds)."""
    if view.device.type != "cpu":
        raise error(Status.INVALID_ARGUMENT, f"host_backing: the view is on {view.device}")
    return torch.empty(0, dtype=torch.uint8).set_(view.untyped_storage())


def host_retrieve(model: Any, layout: Layout, views: Sequence[torch.Tensor], tokens: Sequence[int],
                  block_ids: Sequence[int], block_size: int, max_chunks: int = 0, first_block: int = 0) -> int:
    """The host form of DeviceKV.retrieve (kdn's CPU scatter through the same layout)."""
    toks = _tokens(tokens)
    slots = load_slots(block_ids, len(toks) // model.chunk_tokens * model.chunk_tokens, block_size, first_block)
    return layout.engine.retrieve_to(model, toks, host_backing(views[0]), slots, max_chunks)


def host_store(model: Any, layout: Layout, views: Sequence[torch.Tensor], tokens: Sequence[int],
               block_ids: Sequence[int], block_size: int, first_chunk: int, n_chunks: int) -> int:
    """The host form of DeviceKV.store: chunks [first_chunk, first_chunk + n_chunks) from block_ids
    (which hold those chunks' tokens, starting at the chunk boundary)."""
    toks = _tokens(tokens)
    slots = slots_for(block_ids, n_chunks * model.chunk_tokens, block_size)
    return layout.engine.store_from(model, toks, host_backing(views[0]), slots, first_chunk, n_chunks)


class DoneGate:
    """A stream's wait for kdnd's done event, bounded in time.

    A stream that waits on kdnd's interprocess event directly waits for ever if kdnd dies
    before the event fires. Here the stream waits instead on a 32-bit word of page-locked host
    memory this gate owns (cuStreamWaitValue32), and one watcher thread opens it: as soon as
    kdnd's event has fired, or when timeout_s passed without it (kdnd died or hangs). A load
    whose gate opened on the timeout counts as failed: the engine recomputes it (kdnd, if it
    still lives, may write those blocks late, with the same bytes the engine computes).

    query: whether kdnd's event fired; device_wait(stream, value): the stream waits for the word
    (None: no device, for tests); word: a one-element int32 tensor (pinned on devices)."""

    def __init__(self, query, timeout_s: float, word: torch.Tensor, device_wait=None):
        import queue
        import threading

        self._query = query
        self._timeout_s = timeout_s
        self._word = word
        self._device_wait = device_wait
        self._seq = 0
        self._opened = 0
        self._failed: set[int] = set()
        self._cv = threading.Condition()
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._watch, name="kdn-done-gate", daemon=True)
        self._thread.start()

    def arm(self, stream=None) -> int:
        """Makes `stream` wait for the gate's next opening; returns its sequence number."""
        import time

        self._seq += 1
        if self._device_wait is not None:
            self._device_wait(stream, self._seq)
        self._q.put((self._seq, time.monotonic() + self._timeout_s))
        return self._seq

    def settle(self) -> set[int]:
        """Waits until every armed wait opened (bounded by the timeout); the ones that timed out."""
        with self._cv:
            self._cv.wait_for(lambda: self._opened >= self._seq)
            failed, self._failed = self._failed, set()
        return failed

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=self._timeout_s + 5)

    def _watch(self) -> None:
        import time

        while (item := self._q.get()) is not None:
            seq, deadline = item
            fired = False
            while not (fired := bool(self._query())) and time.monotonic() < deadline:
                time.sleep(0.0002)
            self._word.fill_(seq)  # the device's wait reads the word: the stream goes on
            with self._cv:
                if not fired:
                    self._failed.add(seq)
                self._opened = seq
                self._cv.notify_all()


class DeviceKV:
    """A vLLM-style device KV cache registered with kdnd's GPU tier.

    Register again (a new DeviceKV) after the engine re-allocates its cache (vLLM's sleep and
    wake). Requires memory from cudaMalloc (PyTorch's default caching allocator): memory from
    cuMemCreate (``expandable_segments:True``) cannot be exported by CUDA IPC (UNSUPPORTED)."""

    def __init__(self, model: Any, views: Sequence[torch.Tensor], guard_timeout_s: float = 0.0):
        """guard_timeout_s > 0: retrieves order the stream through a DoneGate with that bound
        instead of waiting on kdnd's event directly (see settle())."""
        first = _check_same(views)
        if first.device.type != "cuda":
            raise error(Status.INVALID_ARGUMENT, f"the KV cache is on {first.device}; DeviceKV needs CUDA tensors")
        ok, why = _kdn.cuda_available()
        if not ok:
            raise error(Status.UNSUPPORTED, why)
        self.model = model
        self.layout = layout_of(views)
        self.device = first.device
        with torch.cuda.device(self.device):
            # The event kdnd's gathers wait for: recorded on the stream that wrote the KV.
            self._engine_event = torch.cuda.Event(enable_timing=False, interprocess=True)
            self._engine_event.record()
            self._kv = _kdn.GpuKV(model, self.layout.engine, bytes(self._engine_event.ipc_handle()))
            self._done = torch.cuda.Event.from_ipc_handle(self.device, self._kv.done_event)
        self._gate = None
        if guard_timeout_s > 0:
            word = torch.zeros(1, dtype=torch.int32, pin_memory=True)
            self._gate = DoneGate(self._done.query, guard_timeout_s, word, self._wait_word(word))

    def _wait_word(self, word: torch.Tensor):
        def wait(stream, value):
            s = stream or torch.cuda.current_stream(self.device)
            _kdn.cuda_stream_wait_value(int(s.cuda_stream), int(word.data_ptr()), value)
        return wait

    def retrieve(self, tokens: Sequence[int], block_ids: Sequence[int], block_size: int,
                 stream: torch.cuda.Stream | None = None, max_chunks: int = 0, first_block: int = 0) -> int:
        """Queues the load of the cached prefix of tokens into block_ids and makes `stream` (default:
        the current stream) wait for it; returns the chunks that will be written. Blocks before
        first_block are left alone (the engine computed them itself)."""
        toks = _tokens(tokens)
        slots = load_slots(block_ids, len(toks), block_size, first_block)
        loaded = self._kv.retrieve(self.model, toks, slots, max_chunks)
        self.last_gate = 0
        if loaded and self._gate is not None:
            self.last_gate = self._gate.arm(stream)
        elif loaded:
            (stream or torch.cuda.current_stream(self.device)).wait_event(self._done)
        return loaded

    def settle(self) -> set[int]:
        """With a guard: waits (bounded) until every retrieve's gate opened; returns the
        last_gate numbers of the retrieves whose done event did not fire in time (failed)."""
        return self._gate.settle() if self._gate is not None else set()

    def record(self, stream: torch.cuda.Stream | None = None) -> None:
        """Records the engine event on `stream` (default: the current one): stores wait for it."""
        self._engine_event.record(stream or torch.cuda.current_stream(self.device))

    def store(self, tokens: Sequence[int], block_ids: Sequence[int], block_size: int, first_chunk: int,
              n_chunks: int, stream: torch.cuda.Stream | None = None, record: bool = True) -> int:
        """Stores chunks [first_chunk, first_chunk + n_chunks) from block_ids once `stream`'s work so
        far (the KV writes) is done; returns after kdnd committed them, with the count written.
        record=False: the caller recorded the engine event itself (record()) after the writes."""
        if record:
            self.record(stream)
        slots = slots_for(block_ids, n_chunks * self.model.chunk_tokens, block_size)
        return self._kv.store(self.model, _tokens(tokens), slots, first_chunk, n_chunks)

    def prefetch(self, tokens: Sequence[int]) -> tuple[int, int]:
        """Brings the cached prefix into T0 of this device: (cached_chunks, queued_chunks)."""
        return self._kv.prefetch(self.model, _tokens(tokens))

    def check(self) -> bool:
        """True if the copies of every retrieve since the last check landed whole."""
        return self._kv.check()

    def close(self) -> None:
        if self._gate is not None:
            self._gate.close()
        self._kv.unregister()


class HostKV:
    """DeviceKV's interface over host views: kdn's CPU scatter and gather through the same layout.

    What the connector's device worker does can so run, and be tested, where no GPU is: the
    copies are synchronous, so there is no event to wait on and no ticket to check."""

    def __init__(self, model: Any, views: Sequence[torch.Tensor]):
        self.model = model
        self.views = list(views)
        self.layout = layout_of(self.views)
        self.layout.engine.check_within(host_backing(self.views[0]).data_ptr(), host_backing(self.views[0]).numel())

    def retrieve(self, tokens, block_ids, block_size, stream=None, max_chunks: int = 0, first_block: int = 0) -> int:
        return host_retrieve(self.model, self.layout, self.views, tokens, block_ids, block_size, max_chunks,
                             first_block)

    def record(self, stream=None) -> None:
        return

    def store(self, tokens, block_ids, block_size, first_chunk, n_chunks, stream=None, record: bool = True) -> int:
        return host_store(self.model, self.layout, self.views, tokens, block_ids, block_size, first_chunk, n_chunks)

    def prefetch(self, tokens) -> tuple[int, int]:
        """The host analog of DeviceKV.prefetch: kdnd brings the cached prefix into its host arena."""
        toks = _tokens(tokens)
        hit = self.model.lookup(toks)
        below = sum(list(hit.tier_chunks)[int(Tier.DISK):])
        queued = below if below and self.model.prefetch(toks) else 0
        return int(hit.hit_chunks), int(queued)

    def check(self) -> bool:
        return True

    def close(self) -> None:
        return
