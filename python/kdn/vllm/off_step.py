"""Loads of chunks that kdnd must first bring up from its disk or remote tier (vLLM's asynchronous load).

A chunk in kdnd's host arena (or on the device) loads in milliseconds; one on disk or in the
shared tier costs a read first. The scheduler side answers such a prefix with (n, True): vLLM
allocates the request's blocks, parks it (WAITING_FOR_REMOTE_KVS) and keeps running the other
requests' steps. On the worker, one thread per connector asks kdnd to promote the prefix and
watches it, through a read-only session of its own (a slow read never holds the connection the
step uses), until no chunk of it is below the host tier, or until the bound passes. The request
is then ready: the next step loads it as it loads a synchronous request (a copy out of the host
arena, or a scatter queued on the device stream) and reports it finished in that same step,
whatever the load's outcome; blocks that did not load reach get_block_ids_with_load_errors in
that same pass, as vLLM requires, and it recomputes them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

import numpy as np

import kdn

from .link import KdnLink
from .metadata import LoadSpec

Promote = Callable[[np.ndarray], None]  # asks kdnd to bring these tokens' chunks up a tier


def below_host(result: Any) -> int:
    """Chunks of a lookup whose fastest copy is on disk or in the remote tier."""
    tiers = list(result.tier_chunks)
    return sum(tiers[int(kdn.Tier.DISK):])


class OffStepLoads:
    """The promotion thread and the requests it made ready. post() and ready() are called by the
    step's thread; the thread itself only reads the specs it was given."""

    def __init__(self, link: KdnLink | None, promote: Promote | None, timeout_s: float,
                 log: logging.Logger) -> None:
        self._link = link          # this thread's own session (None: kdn is off; loads fail at once)
        self._promote = promote    # None: the session's own PREFETCH (into the host arena)
        self._timeout_s = timeout_s
        self._log = log
        self._q: queue.Queue[LoadSpec | None] = queue.Queue()
        self._mu = threading.Lock()
        self._ready: list[LoadSpec] = []  # GUARDED_BY(_mu)
        self._thread = threading.Thread(target=self._loop, name="kdn-off-step-load", daemon=True)
        self._thread.start()

    def post(self, spec: LoadSpec) -> None:
        self._q.put(spec)

    def ready(self) -> list[LoadSpec]:
        """The requests whose prefix came up (or that waited their bound) since the last call."""
        with self._mu:
            out, self._ready = self._ready, []
        return out

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=self._timeout_s + 5)
        if self._link is not None:
            self._link.close()

    def _loop(self) -> None:
        while (spec := self._q.get()) is not None:
            try:
                self._bring_up(spec)
            except Exception:  # noqa: BLE001 — a request left here would hold its blocks for ever
                self._log.exception("kdn: promotion of %s failed; loading what is there", spec.req_id)
            with self._mu:
                self._ready.append(spec)

    def _bring_up(self, spec: LoadSpec) -> None:
        model = self._link.model() if self._link is not None and not spec.fail else None
        if model is None:
            return  # the load in the step finds kdnd unreachable too, and fails the blocks
        tokens = spec.tokens[: spec.end_chunk * model.chunk_tokens]
        try:
            if self._promote is not None:
                self._promote(tokens)
            else:
                model.prefetch(tokens)
        except kdn.KdnError as e:  # the load will find out what is there; only the wait is lost
            self._log.warning("kdn: prefetch for %s failed (%s)", spec.req_id, e)
            self._link.failed(e.code)
            return
        self._watch(model, tokens)

    def _watch(self, model: Any, tokens: np.ndarray) -> None:
        """Until every chunk still cached is in the host arena or on the device (one evicted
        meanwhile is not waited for: the load stops short of it and vLLM recomputes the rest)."""
        deadline = time.monotonic() + self._timeout_s
        pause = 0.0005
        while True:
            try:
                if below_host(model.lookup(tokens)) == 0:
                    return
            except kdn.KdnError as e:
                self._link.failed(e.code)
                return
            if time.monotonic() >= deadline:
                self._log.warning("kdn: chunks still below the host tier after %.1f s; loading what is there",
                                  self._timeout_s)
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
