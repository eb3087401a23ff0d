"""What both worker sides (host: worker.py, device: device_worker.py) do around their copies.

Which loads run in this step and which wait off the step for kdnd to bring their chunks up
(off_step.py); the blocks of loads that stopped short, for get_block_ids_with_load_errors; the
requests whose asynchronous load finished, for get_finished; the saves dropped because the
request's load failed in this step. A subclass supplies _load(spec), which copies and calls
_fail for whatever did not load.
"""

from __future__ import annotations

import logging
from typing import Iterator

from .config import KdnConfig
from .link import KdnLink
from .metadata import KdnConnectorMetadata, LoadSpec, SaveSpec
from .off_step import OffStepLoads, Promote
from .stats import ConnectorStats


class LoadTracking:
    def __init__(self, cfg: KdnConfig, link: KdnLink | None, stats: ConnectorStats, log: logging.Logger) -> None:
        self._cfg = cfg
        self._link = link
        self._stats = stats
        self._log = log
        self._errors: set[int] = set()
        self._failed_reqs: set[str] = set()   # loads that failed in this step: not stored
        self._received: set[str] = set()      # asynchronous loads done since the last get_finished
        self._off_step: OffStepLoads | None = None  # made at the first asynchronous load

    def _load(self, spec: LoadSpec) -> None:
        raise NotImplementedError

    def _promote(self) -> Promote | None:
        """How the off-step thread asks kdnd to bring a prefix up (None: into the host arena)."""
        return None

    def start_load_kv(self, meta: KdnConnectorMetadata) -> None:
        self._failed_reqs.clear()
        for spec in meta.loads:
            if spec.off_step:
                self._off_step_loads().post(spec)
            else:
                self._load(spec)
        for spec in self._off_step.ready() if self._off_step is not None else ():
            self._stats.off_step_loads += 1
            self._load(spec)
            self._received.add(spec.req_id)

    def _off_step_loads(self) -> OffStepLoads:
        if self._off_step is None:
            own = self._link.sibling(read_only=True) if self._link is not None else None
            self._off_step = OffStepLoads(own, self._promote(), max(1.0, 5 * self._cfg.timeout_ms / 1000), self._log)
        return self._off_step

    def _fail(self, spec: LoadSpec, from_block: int) -> None:
        failed = [int(b) for b in spec.blocks[from_block:]]
        self._errors.update(failed)
        self._failed_reqs.add(spec.req_id)
        self._stats.load_failures += 1
        self._stats.failed_blocks += len(failed)

    def _take_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors

    def _take_received(self) -> set[str] | None:
        """Asynchronous loads finished (loaded or failed) since the last call. vLLM calls
        get_finished before get_block_ids_with_load_errors in a pass, and the blocks that failed
        are already in _errors then: they are reported in the same pass."""
        received, self._received = self._received, set()
        return received or None

    def _saves(self, meta: KdnConnectorMetadata) -> Iterator[SaveSpec]:
        """This step's saves, less those of requests whose load failed in it (what the forward
        pass computed after the failed blocks is discarded by vLLM and computed again)."""
        for spec in meta.saves:
            if spec.req_id in self._failed_reqs:
                self._stats.skipped_saves += 1
                continue
            yield spec

    def _close_loads(self) -> None:
        if self._off_step is not None:
            self._off_step.close()
            self._off_step = None
